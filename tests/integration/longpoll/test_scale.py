"""2,000 concurrent idle long polls held open by one longpoll process: all answered empty at
their deadline, then all woken at once by one message; no errors, bounded in time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from ...procs import PolymqProcess
from .conftest import metric, unique

N = 2000


async def _held_open(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(f"{base}/metrics") as r:
        return metric(await r.text(), "polymq_longpoll_polls_open")


@pytest.mark.timeout(180)
async def test_2000_idle_long_polls_are_held_and_answered(server: PolymqProcess) -> None:
    base = server.url("longpoll")
    name = unique("many")
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        gate = asyncio.Semaphore(200)

        async def open_one() -> str:
            async with (
                gate,
                session.post(
                    f"{base}/v1/subscriptions", json={"destination": f"topic/{name}.*"}
                ) as r,
            ):
                assert r.status == 201, await r.text()
                return str((await r.json())["id"])

        subs = await asyncio.gather(*(open_one() for _ in range(N)))
        assert len(set(subs)) == N

        async def poll(sub: str, wait: float) -> tuple[int, dict[str, Any], float]:
            start = time.monotonic()
            async with session.get(
                f"{base}/v1/subscriptions/{sub}/poll", params={"wait": str(wait)}
            ) as r:
                return r.status, await r.json(), time.monotonic() - start

        # 1. all idle until their deadline, then answered empty
        answers = await asyncio.gather(*(poll(s, 3) for s in subs))
        assert [status for status, _, _ in answers] == [200] * N
        assert all(body["messages"] == [] for _, body, _ in answers)
        took = sorted(t for _, _, t in answers)
        assert took[0] > 2.8, f"a poll with wait=3 answered after {took[0]:.2f}s"
        assert took[-1] < 15, f"the last of {N} polls with wait=3 answered after {took[-1]:.2f}s"

        # 2. all held open at once, then all woken by one message
        tasks = [asyncio.ensure_future(poll(s, 25)) for s in subs]
        deadline = time.monotonic() + 30
        while (held := await _held_open(session, base)) < N:
            assert time.monotonic() < deadline, f"only {held} of {N} polls were held open"
            assert not any(t.done() for t in tasks), "a poll answered before its deadline"
            await asyncio.sleep(0.2)
        published = time.monotonic()
        async with session.post(
            f"{base}/v1/topic/{name}.x/messages", json={"body": "wake up"}
        ) as r:
            assert r.status == 200 and (await r.json())["subscribers"] == N
        woken = await asyncio.gather(*tasks)
        assert [status for status, _, _ in woken] == [200] * N
        assert all([m["body"] for m in body["messages"]] == ["wake up"] for _, body, _ in woken)
        late = time.monotonic() - published
        assert late < 10, f"{N} waiting polls took {late:.2f}s to answer one message"
        assert await _held_open(session, base) == 0
    assert server.alive, server.log()
