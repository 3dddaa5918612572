"""A restarting core listens before it has recovered its store: a client that comes meanwhile
finds the port open and its login waits (answered once recovery ends, or told the core is
starting), and ``/readyz`` says ``starting`` (503) until then — never connection refused
once the process has bound its ports."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import requests

from polymq import Message, Unavailable

from ...procs import PolymqProcess
from ...rabbit import free_port
from .helpers import collect, connect, uid

pytestmark = pytest.mark.timeout(180)

BACKLOG = 300_000  # persistent messages: a recovery of a second or more here


async def test_a_restarting_core_listens_while_it_recovers(tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    core = PolymqProcess("core", tmp_path / "core", "--core-port", str(port),
                         "--admin-port", str(admin))  # fmt: skip
    q = f"queue/{uid()}"
    with core:
        async with await connect(port) as c:
            await c.declare(q, durable=True)
            for start in range(0, BACKLOG, 5000):
                batch = [Message(b"%d" % i, persistent=True) for i in range(start, start + 5000)]
                await c.publish(q, batch)
        assert core.stop() == 0, core.log()

        readyz_url = f"http://127.0.0.1:{admin}/readyz"
        starting = asyncio.ensure_future(asyncio.to_thread(core.start, 120.0))
        refused_after_open = 0
        opened = False
        readyz: list[tuple[int, str]] = []
        logins: list[str] = []
        while not starting.done():
            try:
                r = await asyncio.to_thread(requests.get, readyz_url, timeout=5)
            except requests.ConnectionError:
                if opened:
                    refused_after_open += 1
            else:
                opened = True
                readyz.append((r.status_code, r.json()["status"]))
                if r.status_code == 503 and len(logins) < 3:
                    t0 = time.monotonic()
                    try:  # logs in on the wire meanwhile: it waits, then is let in or told
                        async with await connect(port) as c:
                            await c.ping()
                        logins.append(f"welcome after {time.monotonic() - t0:.1f}s")
                    except Unavailable as exc:
                        assert "starting" in str(exc)
                        logins.append("unavailable: starting")
            await asyncio.sleep(0.05)
        await starting
        assert refused_after_open == 0
        assert (503, "starting") in readyz, readyz  # seen while it recovered
        assert logins, f"no login tried during recovery: {readyz}"
        r = await asyncio.to_thread(requests.get, readyz_url, timeout=5)
        assert r.status_code == 200
        assert "recovered in" in core.log()
        async with await connect(port) as c:  # and everything is there
            assert (await c.stats(q)).messages == BACKLOG
            sub = await c.subscribe(q, prefetch=10)
            assert [m.message.body for m in await collect(sub, 3)] == [b"0", b"1", b"2"]
        print(f"logins during recovery: {logins}; readyz: {readyz[:3]} ... {readyz[-2:]}")
