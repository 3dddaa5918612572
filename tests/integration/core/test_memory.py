"""Memory does not grow with the number of idle queues: idle ones leave memory."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from polymq import Message
from polymq.types import Outcome

from ...procs import PolymqProcess
from .helpers import connect, uid


async def _counts(core: PolymqProcess) -> tuple[int, int]:
    """(destinations in memory, dormant records) over every shard."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{core.url('admin')}/api/cluster") as r:
            node = (await r.json())["nodes"][0]
    shards = node["shards"]
    return sum(s["in_memory"] for s in shards), sum(s["dormant"] for s in shards)


@pytest.mark.timeout(60)
async def test_idle_queues_are_evicted_and_come_back_on_use(core: PolymqProcess) -> None:
    client = await connect(core.ports["core"])
    prefix = uid("idle")
    n = 5000
    try:
        # Each queue is used and emptied: a message in, pulled and acked.
        for start in range(0, n, 500):
            names = [f"queue/{prefix}.{i}" for i in range(start, start + 500)]
            await asyncio.gather(*(client.publish(q, [Message(b"x")]) for q in names))
            leases = await asyncio.gather(*(client.pull(q, 1) for q in names))
            await client.settle([ls[0].receipt for ls in leases])

        durable = f"queue/{prefix}.declared"
        await client.declare(durable, max_length=7)
        for _ in range(40):
            await asyncio.sleep(0.25)
            if (await _counts(core))[0] == 0:
                break
        # Nothing of the 5000 used-and-emptied queues is left; the declared one is a record.
        assert await _counts(core) == (0, 1), "idle queues stayed in memory"

        # Evicted does not mean forgotten: the declared options come back on use.
        stats = await client.stats(durable)
        assert stats.options.max_length == 7
        receipt = await client.publish(f"queue/{prefix}.3", b"again")
        assert receipt.count == 1
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_a_declared_queue_answers_stats_after_eviction_with_its_counters(
    core: PolymqProcess,
) -> None:
    client = await connect(core.ports["core"])
    try:
        q = f"queue/{uid('kept')}"
        await client.declare(q)  # the default options: nothing but the declare keeps it
        await client.publish(q, [Message(b"a"), Message(b"b"), Message(b"c")])
        leases = await client.pull(q, 2)
        await client.settle([lease.receipt for lease in leases])
        await client.settle([(await client.pull(q, 1))[0].receipt], Outcome.REQUEUE)
        (last,) = await client.pull(q, 1)
        await client.settle([last.receipt])
        counters = ("published", "delivered", "acked", "redelivered")
        before = {k: getattr(await client.stats(q), k) for k in counters}
        assert before["published"] == 3 and before["redelivered"] == 1
        for _ in range(40):  # empty and unused: evicted within a sweep or two
            await asyncio.sleep(0.25)
            if await _counts(core) == (0, 1):
                break
        assert await _counts(core) == (0, 1), "the empty queue stayed in memory"
        stats = await client.stats(q)  # answered, empty, its counters as they were
        assert stats.messages == 0
        assert {k: getattr(stats, k) for k in counters} == before
    finally:
        await client.close()
