"""The wire's ``Peek`` through the Python client, against a real core: a queue's ready
messages in delivery order and untouched, the in-memory window of a durable queue that pages
(paged messages come after it), a stream's last entries, and the errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import requests

from polymq import BadRequest, Conflict, Message, NotFound

from ...procs import PolymqProcess
from .helpers import collect, connect, uid

pytestmark = pytest.mark.timeout(120)


async def test_peek_shows_the_window_of_a_paging_queue_and_takes_nothing(tmp_path: Path) -> None:
    q = f"queue/{uid('peek')}"
    env = {"POLYMQ_QUEUE_WINDOW_MESSAGES": "100"}
    with PolymqProcess("core", tmp_path / "core", env=env) as core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(q, durable=True)
            for start in range(0, 150, 50):
                batch = [Message(b"m%03d" % i, persistent=True) for i in range(start, start + 50)]
                await c.publish(q, batch)
            assert (await c.stats(q)).paged == 50
            shown = await c.peek(q, 100)
            assert [m.body for m in shown] == [b"m%03d" % i for i in range(100)]
            assert [m.body for m in await c.peek(q, 3)] == [b"m000", b"m001", b"m002"]
            after = await c.stats(q)  # nothing read back from the store, leased or counted
            assert (after.paged, after.in_flight, after.delivered) == (50, 0, 0)
            admin = f"http://127.0.0.1:{core.ports['admin']}/api/destinations/{q}"
            row = (await asyncio.to_thread(requests.get, admin, timeout=10)).json()
            assert (row["ready"], row["paged"], row["unacked"]) == (150, 50, 0)
            # a consumer takes ten; what is ready next is what peek shows next
            sub = await c.subscribe(q, ack_mode="client-individual", prefetch=10)
            got = await collect(sub, 10)
            assert [d.message.body for d in got] == [b"m%03d" % i for i in range(10)]
            for d in got:
                d.ack()
            await sub.unsubscribe()
            assert [m.body for m in await c.peek(q, 2)] == [b"m010", b"m011"]
            assert (await c.stats(q)).messages == 140


async def test_peek_of_a_stream_and_what_it_refuses(core: PolymqProcess) -> None:
    s = f"stream/{uid('s')}"
    async with await connect(core.ports["core"]) as c:
        for i in range(5):
            await c.publish(s, b"e%d" % i)
        tail = await c.peek(s, 2)
        assert [(m.seq, m.body) for m in tail] == [(4, b"e3"), (5, b"e4")]
        with pytest.raises(Conflict):
            await c.peek(f"topic/{uid()}")
        with pytest.raises(NotFound):
            await c.peek(f"queue/{uid('none')}")
        for bad in (0, 101):
            with pytest.raises(BadRequest, match="count"):
                await c.peek(s, bad)
        await c.ping()  # the connection is still fine
