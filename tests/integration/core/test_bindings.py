"""Bindings from topic patterns to queues: a topic publish also lands, durably, in every bound
queue; bindings of a durable queue survive restarts (and eviction), go with the queue, and a
queue's dead letters can go to a topic and through its bindings."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from polymq import BadRequest, Bound, Client, Forbidden, Message, NotFound, Published, Unbound
from polymq_server.auth.provider import hash_password

from ...procs import PolymqProcess
from .helpers import bodies, collect, connect, eventually, nothing_more, uid

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def core(module_core: PolymqProcess) -> PolymqProcess:
    """One core for the module's tests: each uses names of its own; a test that restarts its
    core, or counts every binding in it, takes ``fresh_core``."""
    return module_core


async def drain(c: Client, queue: str, n: int) -> list[Message]:
    """Exactly the ``n`` messages ``queue`` holds (pulled and acked), in order."""
    leases = await c.pull(queue, max=n + 1)
    assert len(leases) == n, [lease.message.body for lease in leases]
    await c.settle([lease.receipt for lease in leases])
    return [lease.message for lease in leases]


async def depth(c: Client, queue: str) -> int:
    """Ready messages in ``queue``; 0 for a queue nothing ever went into."""
    try:
        return int((await c.stats(queue)).messages)
    except NotFound:
        return 0


# ---- routing -------------------------------------------------------------------------------


async def test_bind_exact_star_hash_and_prefix_patterns(client: Client) -> None:
    ns = uid("b")
    exact, star, hash_, prefix = (f"queue/{uid()}" for _ in range(4))
    assert await client.bind(f"topic/{ns}.orders.eu", exact) == Bound(added=True)
    assert await client.bind(f"topic/{ns}.*.eu", star) == Bound(added=True)
    assert await client.bind(f"topic/{ns}.orders.#", hash_) == Bound(added=True)
    assert await client.bind(f"topic/{ns}.ord*", prefix) == Bound(added=True)
    assert await client.bind(f"topic/{ns}.ord*", prefix) == Bound(added=False)  # idempotent

    topics = {
        "orders.eu": {exact, star, hash_, prefix},
        "orders": {hash_, prefix},
        "orders.us.east": {hash_, prefix},
        "refunds.eu": {star},
        "ordinal": {prefix},
        "other": set(),
    }
    for topic, expected in topics.items():
        r = await client.publish(f"topic/{ns}.{topic}", topic)
        assert r == Published(1, subscribers=0, queues=len(expected), refused=[]), topic

    for queue in (exact, star, hash_, prefix):
        want = [t.encode() for t, qs in topics.items() if queue in qs]
        got = await drain(client, queue, len(want))
        assert [m.body for m in got] == want, queue
    assert await client.bindings(prefix) == [f"topic/{ns}.ord*"]
    assert await client.bindings(f"queue/{uid()}") == []


async def test_bound_queues_each_get_their_own_copy(client: Client) -> None:
    topic = f"topic/{uid('t')}.created"
    q1, q2 = f"queue/{uid()}", f"queue/{uid()}"
    await client.publish(q2, [Message(b"before-1"), Message(b"before-2")])  # q2's seqs move on
    await client.bind(topic, q1)
    await client.bind(topic, q2)

    r = await client.publish(topic, [Message(b"a", headers={"k": "v"}, priority=7), Message(b"b")])
    assert (r.queues, r.refused) == (2, [])

    a1, b1 = await drain(client, q1, 2)
    a2, _, _, b2 = await drain(client, q2, 4)  # priority 7 first
    assert [a1.seq, b1.seq, a2.seq, b2.seq] == [1, 2, 3, 4]
    assert len({a1.id, b1.id, a2.id, b2.id}) == 4
    for m in (a1, a2):
        assert (m.body, m.headers, m.priority) == (b"a", {"k": "v"}, 7)
        # a routed copy says where it was published (AMQP: exchange and routing key)
        assert m.destination == topic


async def test_a_subscriber_and_a_binding_both_get_it_and_two_patterns_give_one_copy(
    client: Client,
) -> None:
    ns = uid("t")
    q = f"queue/{uid()}"
    sub = await client.subscribe(f"topic/{ns}.#")
    await client.bind(f"topic/{ns}.#", q)
    await client.bind(f"topic/{ns}.x.*", q)  # matches too: still one copy
    r = await client.publish(f"topic/{ns}.x.y", "hello")
    assert (r.subscribers, r.queues) == (1, 1)
    (d,) = await collect(sub, 1)
    assert d.message.body == b"hello"
    assert [m.body for m in await drain(client, q, 1)] == [b"hello"]
    assert await client.bindings(q) == [f"topic/{ns}.#", f"topic/{ns}.x.*"]
    stats = await client.stats(q)
    assert stats.bindings == 2


async def test_a_consumer_of_a_bound_queue_gets_routed_messages(client: Client) -> None:
    topic, q = f"topic/{uid('t')}", f"queue/{uid()}"
    await client.bind(topic, q)
    sub = await client.subscribe(q, ack_mode="client-individual")
    await client.publish(topic, [Message(str(i).encode()) for i in range(5)])
    got = await collect(sub, 5)
    assert bodies(got) == [b"0", b"1", b"2", b"3", b"4"]
    for d in got:
        d.ack()
    await nothing_more(sub)


async def test_unbind_stops_routing(client: Client) -> None:
    topic, q = f"topic/{uid('t')}", f"queue/{uid()}"
    await client.bind(topic, q)
    await client.publish(topic, "in")
    assert await client.unbind(topic, q) == Unbound(removed=True)
    assert await client.unbind(topic, q) == Unbound(removed=False)  # not bound: no error
    assert await client.unbind(f"topic/{uid()}", f"queue/{uid()}") == Unbound(removed=False)
    r = await client.publish(topic, "out")
    assert r.queues == 0
    assert [m.body for m in await drain(client, q, 1)] == [b"in"]
    assert await client.bindings(q) == []


async def test_a_full_queue_under_reject_refuses_its_copy_alone(client: Client) -> None:
    topic = f"topic/{uid('t')}"
    full, ok = f"queue/{uid()}", f"queue/{uid()}"
    await client.declare(full, max_length=1, overflow="reject")
    await client.bind(topic, full)
    await client.bind(topic, ok)
    assert (await client.publish(topic, "1")).refused == []
    r = await client.publish(topic, "2")
    assert (r.queues, r.refused) == (1, [full])
    assert [m.body for m in await drain(client, ok, 2)] == [b"1", b"2"]
    assert [m.body for m in await drain(client, full, 1)] == [b"1"]


async def test_idempotent_batches_work_for_topic_publishes(client: Client) -> None:
    topic, q = f"topic/{uid('t')}", f"queue/{uid()}"
    await client.bind(topic, q)
    first = await client.publish(topic, "once", batch_id="b-1")
    again = await client.publish(topic, "once", batch_id="b-1")
    assert first == Published(1, subscribers=0, queues=1, refused=[], duplicate=False)
    assert again == replace(first, duplicate=True)
    assert await depth(client, q) == 1


async def test_deleting_the_queue_drops_its_bindings(client: Client) -> None:
    topic, q = f"topic/{uid('t')}", f"queue/{uid()}"
    await client.declare(q, durable=True)
    await client.bind(topic, q)
    await client.publish(topic, "x")
    await client.delete(q)
    assert await client.bindings(q) == []
    assert (await client.publish(topic, "y")).queues == 0
    with pytest.raises(NotFound):
        await client.stats(q)

    # a queue known only by its bindings can be deleted too (and then is gone)
    q2 = f"queue/{uid()}"
    await client.bind(topic, q2)
    stats = await client.stats(q2)
    assert (stats.messages, stats.bindings) == (0, 1)
    await client.delete(q2)
    assert await client.bindings(q2) == []
    with pytest.raises(NotFound):
        await client.delete(q2)


async def test_idle_ttl_expiry_drops_the_bindings(client: Client) -> None:
    topic, q = f"topic/{uid('t')}", f"queue/{uid()}"
    await client.declare(q, idle_ttl=1)
    await client.bind(topic, q)
    await eventually(lambda: _unbound(client, q), within=10)
    assert (await client.publish(topic, "late")).queues == 0


async def _unbound(c: Client, q: str) -> bool:
    return await c.bindings(q) == []


# ---- durability -----------------------------------------------------------------------------


async def _cluster(core: PolymqProcess) -> dict[str, object]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{core.url('admin')}/api/cluster") as r:
            node: dict[str, object] = (await r.json())["nodes"][0]
            return node


async def _in_memory(core: PolymqProcess, q: str) -> bool:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{core.url('admin')}/api/destinations") as r:
            rows = (await r.json())["destinations"]
            return any(d["destination"] == q and d["in_memory"] for d in rows)


@pytest.mark.timeout(120)
async def test_durable_bindings_and_routed_messages_survive_restarts(
    fresh_core: PolymqProcess,
) -> None:
    core = fresh_core
    ns = uid("d")
    busy, idle, transient = f"queue/{uid()}", f"queue/{uid()}", f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.bind(f"topic/{ns}.#", busy)  # bound before it is declared durable
        await c.declare(busy, durable=True)
        await c.declare(idle, durable=True)
        await c.bind(f"topic/{ns}.a", idle)
        await c.bind(f"topic/{ns}.a", transient)  # not durable: lives as long as the process
        # the idle queue leaves memory; its binding stays and routes into it from the store
        await eventually(lambda: _not_in_memory(core, idle), within=10)
        r = await c.publish(
            f"topic/{ns}.a",
            [Message(b"p1", persistent=True), Message(b"t1"), Message(b"p2", persistent=True)],
        )
        assert r.queues == 3
        assert (await c.stats(idle)).bindings == 1
    core.kill()  # SIGKILL: the receipt meant the persistent copies were on disk
    core.start()
    async with await connect(core.ports["core"]) as c:
        assert await c.bindings(busy) == [f"topic/{ns}.#"]
        assert await c.bindings(idle) == [f"topic/{ns}.a"]
        assert await c.bindings(transient) == []
        for q in (busy, idle):
            assert [m.body for m in await drain(c, q, 2)] == [b"p1", b"p2"]
        await eventually(lambda: _not_in_memory(core, idle), within=10)
        r = await c.publish(f"topic/{ns}.a", Message(b"p3", persistent=True))
        assert r.queues == 2
    core.stop()  # graceful, this time
    core.start()
    async with await connect(core.ports["core"]) as c:
        for q in (busy, idle):
            assert [m.body for m in await drain(c, q, 1)] == [b"p3"]
        assert (await c.publish(f"topic/{ns}.b", "b")).queues == 1
        assert await c.unbind(f"topic/{ns}.#", busy) == Unbound(removed=True)
        await c.delete(idle)
    core.stop()
    core.start()
    async with await connect(core.ports["core"]) as c:
        assert await c.bindings(busy) == []  # the unbind was durable
        assert await c.bindings(idle) == []  # and so was the delete
        assert (await c.publish(f"topic/{ns}.a", "a")).queues == 0
    assert (await _cluster(core))["bindings"] == 0


async def _not_in_memory(core: PolymqProcess, q: str) -> bool:
    return not await _in_memory(core, q)


async def test_binding_count_in_metrics_and_cluster_view(fresh_core: PolymqProcess) -> None:
    core = fresh_core
    async with await connect(core.ports["core"]) as c:
        q = f"queue/{uid()}"
        for i in range(3):
            await c.bind(f"topic/{uid('m')}.{i}", q)
    assert (await _cluster(core))["bindings"] == 3
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{core.url('admin')}/metrics") as r:
            text = await r.text()
    assert "polymq_bindings 3.0" in text


# ---- dead letters through a topic -----------------------------------------------------------


async def test_rejected_messages_dead_letter_through_a_topic_to_a_bound_queue(
    client: Client,
) -> None:
    ns = uid("dlx")
    q, dlq, other = f"queue/{uid()}", f"queue/{uid()}", f"queue/{uid()}"
    await client.declare(q, dead_letter=f"topic/{ns}.rejected")
    await client.bind(f"topic/{ns}.#", dlq)
    await client.bind(f"topic/{ns}.expired", other)  # does not match: gets nothing
    watcher = await client.subscribe(f"topic/{ns}.*")
    await client.publish(q, Message(b"bad", headers={"trace": "t-1"}, correlation_id="c-1"))
    sub = await client.subscribe(q, ack_mode="client-individual")
    (d,) = await collect(sub, 1)
    d.nack(requeue=False)

    (seen,) = await collect(watcher, 1)  # subscribers of the topic see it too
    assert seen.message.body == b"bad"
    await eventually(lambda: _has(client, dlq, 1))
    (dead,) = await drain(client, dlq, 1)
    assert dead.body == b"bad"
    assert dead.correlation_id == "c-1"
    h = dead.headers
    assert h["trace"] == "t-1"  # the message's own headers are kept
    assert h["x-death-reason"] == "rejected"
    assert h["x-original-destination"] == q
    assert dead.destination == f"topic/{ns}.rejected"
    assert await depth(client, other) == 0


async def test_expired_messages_dead_letter_through_a_topic(client: Client) -> None:
    ns = uid("dlx")
    src_topic = f"topic/{uid('src')}"
    q, dlq = f"queue/{uid()}", f"queue/{uid()}"
    await client.declare(q, dead_letter=f"topic/{ns}.expired", message_ttl=0.2)
    await client.bind(src_topic, q)  # the message itself comes into q through a binding
    await client.bind(f"topic/{ns}.expired", dlq)
    await client.publish(src_topic, Message(b"stale", headers={"trace": "t-2"}))
    await asyncio.sleep(0.4)
    assert await client.pull(q, max=1) == []  # the expired message is found, dead-lettered
    await eventually(lambda: _has(client, dlq, 1))
    (dead,) = await drain(client, dlq, 1)
    h = dead.headers
    assert (dead.body, h["trace"], h["x-death-reason"]) == (b"stale", "t-2", "expired")
    assert h["x-original-destination"] == src_topic  # where it was published
    assert h["x-original-queue"] == q  # and the queue it died in


async def test_a_queue_never_dead_letters_into_itself_through_a_topic(client: Client) -> None:
    """drop-oldest of a full queue whose dead letters route back into it would loop."""
    topic, q = f"topic/{uid('t')}", f"queue/{uid()}"
    await client.declare(q, max_length=2, overflow="drop-oldest", dead_letter=topic)
    await client.bind(topic, q)
    for i in range(5):
        await client.publish(topic, str(i))
    assert [m.body for m in await drain(client, q, 2)] == [b"3", b"4"]

    direct = f"queue/{uid()}"  # and the same for a queue that names itself
    await client.declare(direct, max_length=2, overflow="drop-oldest", dead_letter=direct)
    for i in range(5):
        await client.publish(direct, str(i))
    assert [m.body for m in await drain(client, direct, 2)] == [b"3", b"4"]


async def _has(c: Client, q: str, n: int) -> bool:
    return await depth(c, q) >= n


# ---- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "queue"),
    [
        ("topic/a.b*c", "queue/q"),  # '*' inside a segment
        ("topic/a..b", "queue/q"),  # empty segment
        ("topic/a.*.b*", "queue/q"),  # a prefix holding another wildcard
        ("topic/", "queue/q"),
        ("queue/other", "queue/q"),  # the pattern must be a topic
        ("stream/s", "queue/q"),
        ("topic/a.b", "topic/x"),  # the target must be a queue
        ("topic/a.b", "stream/x"),
        ("topic/a.b", "channel/x"),
        ("topic/a.b", "queue/a*"),
        ("a.b", "queue/q"),
        ("topic/a.b", 7),
    ],
)
async def test_bad_bindings_are_refused_cleanly(client: Client, pattern: str, queue: str) -> None:
    with pytest.raises(BadRequest):
        await client.bind(pattern, queue)
    with pytest.raises(BadRequest):
        await client.unbind(pattern, queue)
    await client.ping()  # the connection is fine


async def test_bindings_of_a_non_queue_is_refused(client: Client) -> None:
    for bad in ("topic/x", "stream/x", "nothing"):
        with pytest.raises(BadRequest):
            await client.bindings(bad)
    await client.ping()


@pytest.fixture
def auth_core(tmp_path: Path) -> PolymqProcess:
    grants = {
        "admin": [{"pattern": "*", "permissions": ["read", "write", "configure"]}],
        # may configure its queues but read no topic: cannot bind them
        "ops": [
            {"pattern": "queue/ops-*", "permissions": ["read", "write", "configure"]},
            {"pattern": "topic/public.*", "permissions": ["read"]},
        ],
        # may read every topic but configure no queue
        "reader": [{"pattern": "*", "permissions": ["read"]}],
    }
    users = {
        "users": {
            name: {"password_hash": hash_password("pw"), "grants": g} for name, g in grants.items()
        }
    }
    (tmp_path / "users.json").write_text(json.dumps(users))
    return PolymqProcess("core", tmp_path / "core", "--auth", f"file:{tmp_path / 'users.json'}")


async def test_binding_needs_configure_on_the_queue_and_read_on_the_topic(
    auth_core: PolymqProcess,
) -> None:
    with auth_core as core:
        port = core.ports["core"]
        async with (
            await connect(port, user="ops", password="pw") as ops,
            await connect(port, user="reader", password="pw") as reader,
        ):
            q = f"queue/ops-{uid()}"
            assert await ops.bind("topic/public.news", q) == Bound(added=True)
            with pytest.raises(Forbidden):
                await ops.bind("topic/secret.#", q)  # no read on that topic
            with pytest.raises(Forbidden):
                await ops.bind("topic/public.*", f"queue/{uid()}")  # no configure there
            with pytest.raises(Forbidden):
                await reader.bind("topic/public.news", q)
            with pytest.raises(Forbidden):
                await reader.unbind("topic/public.news", q)
            assert await reader.bindings(q) == ["topic/public.news"]  # read suffices to list
            assert await ops.unbind("topic/public.news", q) == Unbound(removed=True)
            await ops.ping()


# ---- volume -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_many_bindings_route_by_match_not_by_count(client: Client) -> None:
    ns = uid("v")
    target = f"queue/{uid()}"
    n = 5000
    batch = 500
    for start in range(0, n, batch):
        await asyncio.gather(
            *(
                client.bind(f"topic/{ns}.k{i}.*", f"queue/{ns}-{i}")
                for i in range(start, start + batch)
            )
        )
    await client.bind(f"topic/{ns}.k42.#", target)
    t0 = time.perf_counter()
    for _ in range(200):
        r = await client.publish(f"topic/{ns}.k42.x", "m")
        assert r.queues == 2
    elapsed = time.perf_counter() - t0
    assert await depth(client, target) == 200
    assert await depth(client, f"queue/{ns}-42") == 200
    assert await depth(client, f"queue/{ns}-43") == 0
    assert elapsed < 10, elapsed
