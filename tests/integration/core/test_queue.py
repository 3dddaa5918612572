"""Queues through a real core process and the real client: order, priorities, acks, prefetch,
redelivery, dead-lettering, bounds, administration and pull leases."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from polymq import BadRequest, Client, Conflict, Message, NotFound, QueueFull, Settled
from polymq.types import Outcome

from ...procs import PolymqProcess
from .helpers import bodies, collect, connect, eventually, nothing_more, uid

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def core(module_core: PolymqProcess) -> PolymqProcess:
    """One core for the module's tests: each uses names of its own, none stops it."""
    return module_core


def msgs(*texts: str, **fields: object) -> list[Message]:
    return [Message(t.encode(), **fields) for t in texts]  # type: ignore[arg-type]


# ---- order ----------------------------------------------------------------------------------


async def test_fifo_order_of_1000_messages_to_one_consumer(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    async with (
        await connect(core.ports["core"]) as consumer,
        await connect(core.ports["core"]) as producer,
    ):
        sub = await consumer.subscribe(q, ack_mode="client-individual", prefetch=50)
        # 1000 publishes pipelined on one connection: their order on the wire is the order.
        receipts = await asyncio.gather(*(producer.publish(q, str(i)) for i in range(1000)))
        got = []
        while len(got) < 1000:
            d = await sub.get(5)
            got.append(d)
            d.ack()  # the window of 50 moves on as we ack
        assert bodies(got) == [str(i).encode() for i in range(1000)]
        assert [d.message.seq for d in got] == [r.seqs[0] for r in receipts]
        assert all(d.message.delivery_count == 1 for d in got)
        await nothing_more(sub, 0.2)


async def test_priority_order_highest_first_fifo_within_a_priority(client: Client) -> None:
    q = f"queue/{uid()}"
    rnd = random.Random(7)
    prios = [rnd.randrange(10) for _ in range(200)]
    for i in range(0, 200, 20):  # several publishes, so order comes from the queue, not a batch
        await client.publish(
            q, [Message(f"{j}".encode(), priority=prios[j]) for j in range(i, i + 20)]
        )
    assert (await client.stats(q)).messages == 200
    sub = await client.subscribe(q)
    got = await collect(sub, 200)
    expected = sorted(range(200), key=lambda j: (-prios[j], j))
    assert [int(b) for b in bodies(got)] == expected
    assert [d.message.priority for d in got] == sorted(prios, reverse=True)


# ---- acks, prefetch, redelivery ------------------------------------------------------------


async def test_prefetch_window_is_respected(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.publish(q, msgs(*(str(i) for i in range(20))))
    sub = await client.subscribe(q, ack_mode="client-individual", prefetch=5)
    first = await collect(sub, 5)
    assert bodies(first) == [b"0", b"1", b"2", b"3", b"4"]
    await nothing_more(sub, 0.5)
    st = await client.stats(q)
    assert (st.in_flight, st.messages, st.subscribers) == (5, 15, 1)
    first[0].ack()
    first[3].ack()
    more = await collect(sub, 2)
    assert bodies(more) == [b"5", b"6"]
    await nothing_more(sub, 0.5)
    st = await client.stats(q)
    assert (st.in_flight, st.messages) == (5, 13)


async def test_cumulative_ack_in_client_mode(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    port = core.ports["core"]
    async with await connect(port) as c:
        await c.publish(q, msgs(*(str(i) for i in range(15))))
        a = await connect(port)
        sub = await a.subscribe(q, ack_mode="client", prefetch=10)
        got = await collect(sub, 10)
        assert bodies(got) == [str(i).encode() for i in range(10)]
        got[4].ack()  # acks 0..4 as well, in client mode
        more = await collect(sub, 5)
        assert bodies(more) == [str(i).encode() for i in range(10, 15)]
        st = await c.stats(q)
        assert (st.in_flight, st.messages, st.acked) == (10, 0, 5)
        await a.close()  # 5..14 were never acked: they come back, 0..4 do not
        sub2 = await c.subscribe(q, ack_mode="client-individual")
        back = await collect(sub2, 10)
        assert bodies(back) == [str(i).encode() for i in range(5, 15)]
        assert all(d.message.redelivered for d in back)
        await nothing_more(sub2)


async def test_explicit_cumulative_ack_in_client_individual_mode(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.publish(q, msgs(*(str(i) for i in range(6))))
    sub = await client.subscribe(q, ack_mode="client-individual", prefetch=10)
    got = await collect(sub, 6)
    assert await sub.ack_many([got[2].tag], cumulative=True) == 3
    st = await client.stats(q)
    assert (st.in_flight, st.acked) == (3, 3)


async def test_nack_requeue_redelivers_and_reject_dead_letters(client: Client) -> None:
    q, dlq = f"queue/{uid()}", f"queue/{uid('dlq')}"
    await client.declare(q, dead_letter=dlq)
    await client.publish(q, msgs("a", "b"))
    sub = await client.subscribe(q, ack_mode="client-individual", prefetch=1)
    (a1,) = await collect(sub, 1)
    assert (a1.message.body, a1.message.delivery_count) == (b"a", 1)
    a1.nack(requeue=True)
    (a2,) = await collect(sub, 1)  # back at the head, before "b"
    assert (a2.message.body, a2.message.delivery_count, a2.message.redelivered) == (b"a", 2, True)
    a2.nack(requeue=False)  # reject: to the dead-letter queue, not back
    (b1,) = await collect(sub, 1)
    assert b1.message.body == b"b"
    b1.ack()
    await nothing_more(sub)
    dsub = await client.subscribe(dlq)
    (dead,) = await collect(dsub, 1)
    assert dead.message.body == b"a"
    assert dead.message.headers["x-death-reason"] == "rejected"
    assert dead.message.headers["x-original-destination"] == q
    await nothing_more(dsub)


async def test_dead_letter_after_max_deliveries(client: Client) -> None:
    q, dlq = f"queue/{uid()}", f"queue/{uid('dlq')}"
    await client.declare(q, max_deliveries=2, dead_letter=dlq)
    await client.publish(q, "poison", headers={"k": "v"})
    sub = await client.subscribe(q, ack_mode="client-individual")
    for n in (1, 2):
        (d,) = await collect(sub, 1)
        assert (d.message.body, d.message.delivery_count) == (b"poison", n)
        d.nack(requeue=True)
    await nothing_more(sub)
    dsub = await client.subscribe(dlq)
    (dead,) = await collect(dsub, 1)
    assert dead.message.body == b"poison"
    h = dead.message.headers
    assert h["x-death-reason"] == "max-deliveries"
    assert h["x-delivery-count"] == "2"
    assert h["x-original-destination"] == q
    assert h["k"] == "v"
    st = await client.stats(q)
    assert (st.messages, st.in_flight) == (0, 0)


async def test_ack_timeout_redelivers_to_another_subscriber(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    port = core.ports["core"]
    async with await connect(port) as ca, await connect(port) as cb:
        lazy = await ca.subscribe(q, ack_mode="client", ack_timeout=0.5)
        await cb.publish(q, "job")
        (d1,) = await collect(lazy, 1)
        assert d1.message.delivery_count == 1
        other = await cb.subscribe(q, ack_mode="client")
        t0 = time.monotonic()
        (d2,) = await collect(other, 1, within=5)
        assert time.monotonic() - t0 >= 0.3  # it waited for the timeout
        assert (d2.message.body, d2.message.id) == (b"job", d1.message.id)
        assert (d2.message.delivery_count, d2.message.redelivered) == (2, True)
        d2.ack()
        await nothing_more(lazy, 0.3)  # not offered back to the one that timed out
        d1.ack()  # late: that delivery is gone, this changes nothing
        await eventually(lambda: _settled(cb, q))
        st = await cb.stats(q)
        assert (st.messages, st.in_flight, st.acked) == (0, 0, 1)


async def _settled(c: Client, q: str) -> bool:
    st = await c.stats(q)
    return bool(st.acked == 1 and st.in_flight == 0)


async def test_redelivery_in_order_after_a_consumer_connection_is_cut(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    port = core.ports["core"]
    async with await connect(port) as producer, await connect(port) as survivor:
        victim = await connect(port)
        vsub = await victim.subscribe(q, ack_mode="client-individual", prefetch=100)
        await producer.publish(q, msgs(*(str(i) for i in range(20))))
        got = await collect(vsub, 20)
        assert bodies(got) == [str(i).encode() for i in range(20)]
        ssub = await survivor.subscribe(q, ack_mode="client-individual")
        await nothing_more(ssub, 0.3)  # everything is in flight at the victim
        assert victim._transport is not None
        victim._transport.abort()  # the connection is cut: no ack, no goodbye
        back = await collect(ssub, 20)
        assert bodies(back) == [str(i).encode() for i in range(20)]
        assert [d.message.id for d in back] == [d.message.id for d in got]
        assert all(d.message.redelivered and d.message.delivery_count == 2 for d in back)
        st = await producer.stats(q)
        assert (st.subscribers, st.in_flight, st.messages) == (1, 20, 0)
        await victim.close()


# ---- bounds and expiry ----------------------------------------------------------------------


async def test_max_length_with_reject_refuses_the_publish(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.declare(q, max_length=3, overflow="reject")
    await client.publish(q, msgs("1", "2"))
    with pytest.raises(QueueFull):
        await client.publish(q, msgs("3", "4"))  # a batch that does not fit is refused whole
    await client.publish(q, "3")
    with pytest.raises(QueueFull):
        await client.publish(q, "4")
    assert (await client.stats(q)).messages == 3
    sub = await client.subscribe(q)
    assert bodies(await collect(sub, 3)) == [b"1", b"2", b"3"]
    await nothing_more(sub)
    await client.publish(q, "5")  # room again once consumed
    assert bodies(await collect(sub, 1)) == [b"5"]


async def test_max_length_with_drop_oldest_keeps_the_newest(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.declare(q, max_length=3, overflow="drop-oldest")
    for i in range(1, 6):
        await client.publish(q, str(i))
    assert (await client.stats(q)).messages == 3
    sub = await client.subscribe(q)
    assert bodies(await collect(sub, 3)) == [b"3", b"4", b"5"]
    await nothing_more(sub)


async def test_expired_messages_are_never_delivered(client: Client) -> None:
    q = f"queue/{uid()}"
    now = time.time()
    await client.publish(q, "stale", expires=now - 5)
    await client.publish(q, "soon-stale", expires=now + 0.3)
    await client.publish(q, "fresh", expires=now + 60)
    await client.publish(q, "forever")
    await asyncio.sleep(0.5)
    sub = await client.subscribe(q)
    assert bodies(await collect(sub, 2)) == [b"fresh", b"forever"]
    await nothing_more(sub)
    await client.publish(q, "late-stale", expires=time.time() - 1)
    await nothing_more(sub)


# ---- administration -------------------------------------------------------------------------


async def test_declare_is_idempotent_and_conflicts_on_other_options(client: Client) -> None:
    q = f"queue/{uid()}"
    r = await client.declare(q, max_length=10, dead_letter="queue/dl")
    assert r.options.max_length == 10
    await client.declare(q, max_length=10, dead_letter="queue/dl")  # the same again: fine
    with pytest.raises(Conflict) as exc:
        await client.declare(q, max_length=20)
    assert exc.value.status == 409
    assert (await client.stats(q)).options.max_length == 10
    await client.delete(q)
    await client.declare(q, max_length=20)  # once deleted, anything goes
    assert (await client.stats(q)).options.max_length == 20


async def test_purge_drops_ready_messages_only(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.publish(q, msgs(*(str(i) for i in range(5))))
    sub = await client.subscribe(q, ack_mode="client-individual", prefetch=2)
    held = await collect(sub, 2)
    assert await client.purge(q) == 3
    st = await client.stats(q)
    assert (st.messages, st.in_flight) == (0, 2)
    held[0].ack()
    held[1].ack()
    await nothing_more(sub)  # the purged ones are gone for good
    await client.publish(q, "after")
    assert bodies(await collect(sub, 1)) == [b"after"]


async def test_delete_cancels_subscribers_and_forgets_the_queue(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    port = core.ports["core"]
    async with await connect(port) as admin, await connect(port) as consumer:
        await admin.declare(q, max_length=5)
        await admin.publish(q, "x")
        sub = await consumer.subscribe(q, ack_mode="client-individual")
        await collect(sub, 1)
        await admin.delete(q)
        with pytest.raises(NotFound):
            await sub.get(5)
        with pytest.raises(NotFound):
            await admin.stats(q)
        with pytest.raises(NotFound):
            await admin.delete(q)
        await consumer.ping()  # the connection itself is fine


async def test_stats_count_messages_subscribers_and_in_flight(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    port = core.ports["core"]
    async with await connect(port) as c, await connect(port) as c2:
        await c.publish(q, msgs(*(str(i) for i in range(7))))
        st = await c.stats(q)
        assert (st.destination, st.messages, st.subscribers, st.in_flight) == (
            q,
            7,
            0,
            0,
        )
        s1 = await c.subscribe(q, ack_mode="client-individual", prefetch=2)
        s2 = await c2.subscribe(q, ack_mode="client-individual", prefetch=3)
        await collect(s1, 2)
        got2 = await collect(s2, 3)
        st = await c.stats(q)
        assert (st.messages, st.subscribers, st.in_flight) == (2, 2, 5)
        assert st.published == 7 and st.delivered == 5
        await s2.unsubscribe()  # its three unacked go back
        await eventually(lambda: _stat_is(c, q, messages=5, subscribers=1, in_flight=2))
        for d in got2:
            assert d.message.body in (b"2", b"3", b"4")


async def _stat_is(c: Client, q: str, **want: int) -> bool:
    st = await c.stats(q)
    return all(getattr(st, k) == v for k, v in want.items())


async def test_idle_ttl_deletes_an_unused_queue_but_not_one_with_a_subscriber(
    client: Client,
) -> None:
    idle, busy = f"queue/{uid()}", f"queue/{uid()}"
    await client.declare(idle, idle_ttl=1)
    await client.declare(busy, idle_ttl=1)
    sub = await client.subscribe(busy)
    t0 = time.monotonic()
    assert (await client.stats(idle)).destination == idle

    async def gone() -> bool:
        try:
            await client.stats(idle)
        except NotFound:
            return True
        return False

    await eventually(gone, within=5, interval=0.1)
    assert time.monotonic() - t0 >= 0.9
    await asyncio.sleep(1.2)  # well past the TTL for the busy one too
    st = await client.stats(busy)
    assert (st.subscribers, st.options.idle_ttl) == (1, 1)
    await client.publish(busy, "still-here")
    assert bodies(await collect(sub, 1)) == [b"still-here"]


# ---- pull with a visibility timeout ---------------------------------------------------------


async def test_pull_and_settle_ack_and_nack(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.publish(q, msgs("a", "b", "c"))
    leases = await client.pull(q, 2, visibility=30)
    assert [lease.message.body for lease in leases] == [b"a", b"b"]
    st = await client.stats(q)
    assert (st.messages, st.in_flight) == (1, 2)
    r = await client.settle([leases[0].receipt], Outcome.ACK)
    assert r == Settled(1, [])
    with pytest.raises(NotFound):
        await client.settle([leases[0].receipt], Outcome.ACK)  # already settled
    await client.settle([leases[1].receipt], Outcome.REQUEUE)  # back to the queue, before "c"
    again = await client.pull(q, 5)
    assert [(x.message.body, x.message.delivery_count) for x in again] == [(b"b", 2), (b"c", 1)]
    await client.settle([x.receipt for x in again], Outcome.ACK)
    assert await client.pull(q, 1) == []
    st = await client.stats(q)
    assert (st.messages, st.in_flight, st.acked) == (0, 0, 3)


async def test_pull_lease_expires_and_the_old_receipt_is_refused(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.publish(q, "m")
    (first,) = await client.pull(q, 1, visibility=0.3)
    assert await client.pull(q, 1) == []  # invisible while leased
    (second,) = await client.pull(q, 1, wait=3, visibility=30)  # comes back after the lease
    assert (second.message.id, second.message.delivery_count) == (first.message.id, 2)
    with pytest.raises(NotFound):
        await client.settle([first.receipt], Outcome.ACK)
    assert (await client.settle([second.receipt], Outcome.ACK)).settled == 1


async def test_pull_waits_for_a_message(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    port = core.ports["core"]
    async with await connect(port) as c, await connect(port) as p:
        t0 = time.monotonic()
        assert await c.pull(q, 1, wait=0.3) == []
        assert time.monotonic() - t0 >= 0.25
        waiting = asyncio.ensure_future(c.pull(q, 1, wait=5))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await p.publish(q, "wake")
        (lease,) = await asyncio.wait_for(waiting, 3)
        assert lease.message.body == b"wake"


async def test_pull_settle_reject_dead_letters(client: Client) -> None:
    q, dlq = f"queue/{uid()}", f"queue/{uid('dlq')}"
    await client.declare(q, dead_letter=dlq)
    await client.publish(q, "bad")
    (lease,) = await client.pull(q, 1)
    await client.settle([lease.receipt], Outcome.REJECT)
    (dead,) = await client.pull(dlq, 1)
    assert (dead.message.body, dead.message.headers["x-death-reason"]) == (b"bad", "rejected")


async def test_pull_rejects_bad_arguments(client: Client) -> None:
    with pytest.raises(BadRequest):
        await client.pull(f"topic/{uid()}", 1)
    with pytest.raises(BadRequest):
        await client.pull(f"queue/{uid()}", 0)
    with pytest.raises(BadRequest):
        await client.pull(f"queue/{uid()}", 1, visibility=-1)
    await client.ping()
