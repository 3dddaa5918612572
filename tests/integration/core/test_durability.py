"""What survives a restart of the core, graceful (SIGTERM) or not (SIGKILL): receipted
persistent messages, unacked ones, metadata and key/value entries; and what does not."""

from __future__ import annotations

import asyncio

import pytest

from polymq import ConnectionClosed, Message, NotFound, QueueFull

from ...procs import PolymqProcess
from .helpers import bodies, collect, connect, eventually, nothing_more, uid

pytestmark = pytest.mark.timeout(90)


@pytest.mark.timeout(120)
async def test_receipted_persistent_messages_survive_kill_9(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    producer = await connect(core.ports["core"])
    await producer.declare(q, durable=True)
    receipted: list[int] = []
    failed = 0
    batch_size, window = 25, 8
    next_i = 0
    killed = asyncio.Event()

    async def publish_batch(start: int) -> None:
        nonlocal failed
        batch = [
            Message(str(i).encode(), persistent=True) for i in range(start, start + batch_size)
        ]
        try:
            await producer.publish(q, batch)
        except ConnectionClosed:
            failed += 1
            return
        receipted.extend(range(start, start + batch_size))

    async def produce() -> None:
        """Keep ``window`` batches in flight until publishing fails (the core is gone)."""
        nonlocal next_i
        inflight: set[asyncio.Task[None]] = set()
        while not failed:
            while len(inflight) < window:
                t = asyncio.ensure_future(publish_batch(next_i))
                next_i += batch_size
                inflight.add(t)
            _, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*inflight)

    async def kill_mid_stream() -> None:
        await eventually(lambda: len(receipted) >= 3000, within=20, interval=0.01)
        core.kill()  # SIGKILL while batches are still in flight
        killed.set()

    await asyncio.wait_for(asyncio.gather(produce(), kill_mid_stream()), 60)
    await producer.close()
    assert killed.is_set()
    assert isinstance(producer.close_reason, ConnectionClosed)
    assert len(receipted) >= 1000, "the producer barely got going"
    assert failed >= 1
    # every receipt was for a whole batch, issued in order on one connection
    assert receipted == list(range(len(receipted)))

    core.start()  # the same data dir, new ports
    async with await connect(core.ports["core"]) as c:
        stored = (await c.stats(q)).messages
        assert stored >= len(receipted)
        sub = await c.subscribe(q, ack_mode="client", prefetch=1000)
        got: list[int] = []
        while len(got) < stored:
            d = await sub.get(10)
            got.append(int(d.message.body))
            if len(got) % 500 == 0:
                d.ack()
        await nothing_more(sub, 0.3)
    # nothing receipted is lost, and what came back is in publish order, each once
    assert got[: len(receipted)] == receipted
    assert got == sorted(set(got))
    assert got[-1] < next_i


async def test_restart_keeps_unacked_persistent_drops_transient_and_acked(
    core: PolymqProcess,
) -> None:
    q = f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.declare(q, durable=True)
        await c.publish(
            q,
            [
                Message(b"p1", persistent=True),
                Message(b"t1"),
                Message(b"p2", persistent=True),
                Message(b"p3", persistent=True),
                Message(b"t2"),
                Message(b"p4", persistent=True),
            ],
        )
        sub = await c.subscribe(q, ack_mode="client-individual", prefetch=3)
        got = await collect(sub, 3)
        assert bodies(got) == [b"p1", b"t1", b"p2"]
        assert await sub.ack_many([got[0].tag]) == 1  # p1 acked; t1 and p2 stay unacked
        await collect(sub, 1)  # the window moved on: p3 is in flight too, unacked
    core.stop()  # graceful: SIGTERM
    core.start()
    async with await connect(core.ports["core"]) as c:
        sub = await c.subscribe(q, ack_mode="client-individual")
        back = await collect(sub, 3)
        assert bodies(back) == [b"p2", b"p3", b"p4"]
        await nothing_more(sub)


async def test_acked_messages_do_not_come_back_after_kill_9(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.declare(q)
        await c.publish(q, [Message(str(i).encode(), persistent=True) for i in range(10)])
        sub = await c.subscribe(q, ack_mode="client-individual")
        got = await collect(sub, 10)
        await sub.ack_many([d.tag for d in got[:6]])
        # the ack's answer does not wait for the disk; give the store its group commit
        await asyncio.sleep(0.5)
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        sub = await c.subscribe(q)
        assert bodies(await collect(sub, 4)) == [b"6", b"7", b"8", b"9"]
        await nothing_more(sub)


async def test_metadata_survives_kill_9(core: PolymqProcess) -> None:
    q, s = f"queue/{uid()}", f"stream/{uid()}"
    async with await connect(core.ports["core"]) as c:
        with pytest.raises(NotFound):
            await c.get_metadata(f"queue/{uid()}")
        await c.set_metadata(q, {"owner": "billing", "schema": "v2"})
        await c.declare(s, max_length=100)
        await c.set_metadata(s, {"purpose": "audit"})
        assert await c.get_metadata(q) == {"owner": "billing", "schema": "v2"}
        await c.set_metadata(q, {"owner": "ops"})  # replaces, does not merge
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        assert await c.get_metadata(q) == {"owner": "ops"}
        assert await c.get_metadata(s) == {"purpose": "audit"}
        assert (await c.stats(s)).options.max_length == 100


async def test_key_value_put_get_delete_survive_kill_9(core: PolymqProcess) -> None:
    k1, k2, k3 = uid("kv"), uid("kv"), uid("kv")
    blob = bytes(range(256)) * 40
    async with await connect(core.ports["core"]) as c:
        await c.kv_put(k1, b"one")
        await c.kv_put(k2, blob)
        await c.kv_put(k3, b"doomed")
        await c.kv_put(k1, b"uno")  # overwrite
        await c.kv_delete(k3)
        assert await c.kv_get(k1) == b"uno"
        with pytest.raises(NotFound):
            await c.kv_get(k3)
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        assert await c.kv_get(k1) == b"uno"
        assert await c.kv_get(k2) == blob
        with pytest.raises(NotFound):
            await c.kv_get(k3)


async def test_declared_options_survive_restart(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.declare(q, max_length=2, overflow="reject", max_deliveries=3)
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        st = await c.stats(q)
        assert st.options.max_length == 2 and st.options.max_deliveries == 3
        await c.publish(q, [Message(b"a"), Message(b"b")])
        with pytest.raises(QueueFull):
            await c.publish(q, "c")


async def test_idle_ttl_still_applies_after_a_restart(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.declare(q, idle_ttl=1)
    core.kill()
    core.start()
    await asyncio.sleep(2.2)  # unused for twice its TTL since the core came back
    async with await connect(core.ports["core"]) as c:
        with pytest.raises(NotFound):
            await c.stats(q)


async def test_max_deliveries_goes_on_counting_after_kill_9(core: PolymqProcess) -> None:
    """A poison message returned twice of three allowed deliveries, then the core dies: it
    comes back third time counted as such, and its next return dead-letters it."""
    q, dlq = f"queue/{uid()}", f"queue/{uid('dlq')}"
    async with await connect(core.ports["core"]) as c:
        await c.declare(q, max_deliveries=3, dead_letter=dlq)
        await c.publish(q, [Message(b"poison", persistent=True)])
        sub = await c.subscribe(q, ack_mode="client-individual")
        for n in (1, 2):
            (d,) = await collect(sub, 1)
            assert d.message.delivery_count == n
            d.nack(requeue=True)
        await c.stats(q)  # a round trip: the nacks sent before it have been handled
        await asyncio.sleep(0.3)  # and the store has had its group commit
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        sub = await c.subscribe(q, ack_mode="client-individual")
        (d,) = await collect(sub, 1)
        assert (d.message.body, d.message.delivery_count) == (b"poison", 3)
        assert d.message.redelivered
        d.nack(requeue=True)
        await nothing_more(sub)
        (dead,) = await collect(await c.subscribe(dlq), 1)
        assert dead.message.headers["x-death-reason"] == "max-deliveries"
        assert dead.message.headers["x-delivery-count"] == "3"
