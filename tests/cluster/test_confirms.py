"""Confirms mean durable on every path: a persistent message published to a topic (AMQP's
``amq.topic``, the native client's ``topic/...``) through one node and routed by a binding
into a durable queue whose shard another node leads is confirmed only once that leader has
committed it. Killing that leader (-9) right after the last confirm loses none of them (the
shard's next leader has every one); a leader that cannot answer (frozen with SIGSTOP) gets
the publisher a negative answer (AMQP ``basic.nack``, the native client's ``unavailable``),
never a confirm. Before this, the remote copies went fire-and-forget: 217-291 of 300
confirmed messages were gone after such a kill."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable

import aio_pika
import pytest
from pamqp.commands import Basic

from polymq import Client, Lease, Message, Outcome
from polymq.errors import Unavailable

from .harness import (
    Cluster,
    Node,
    amqp_url,
    drain,
    eventually,
    stomp_conn,
    unique,
)

pytestmark = pytest.mark.timeout(300)

N = 300  # persistent messages per publisher
PAD = 16 * 1024  # bytes of each message's body after its name
CONFIRM_WAIT = 60.0  # seconds a publisher waits for its confirms (a frozen leader: ~15 s)


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


def _pair(cluster: Cluster) -> tuple[Node, Node, int]:
    """(a node to publish through, the node leading a shard it does not lead, that shard)."""
    leaders = cluster.wait_formed(timeout=60)
    for shard, leader in sorted(leaders.items()):
        others = [n for n in cluster.others(leader) if n.state == "running"]
        if others:
            return others[0], leader, shard
    raise AssertionError(f"no shard to test with: {leaders}")


async def _declare_bound(node: Node, queue: str, key: str) -> None:
    """A durable queue bound to ``amq.topic`` with ``key``, declared through ``node``; then
    one message routed through it and seen in the queue (the binding is known everywhere)."""
    conn = await aio_pika.connect(amqp_url(node), timeout=10)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue(queue, durable=True)
        await q.bind("amq.topic", routing_key=key)
        exchange = await ch.get_exchange("amq.topic")
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # (the first may come before the binding's interest reached every node)
            await exchange.publish(aio_pika.Message(b"probe"), routing_key=key, timeout=30)
            got = await q.get(timeout=5, fail=False)
            if got is not None:
                await got.ack()
                return
            assert asyncio.get_running_loop().time() < deadline, f"{queue} never got a probe"
            await asyncio.sleep(0.5)


async def _publish(
    node: Node,
    amqp_key: str,
    native_topic: str,
    bodies: int | tuple[str, str],
    then: Callable[[], None] = lambda: None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Publish persistent messages through ``node``, all in flight at once: to ``amq.topic``
    with ``amqp_key`` (aio-pika, publisher confirms on) and to ``topic/<native_topic>``
    (the native client); ``bodies``: how many of each (``amqp-NNNN``, ``native-NNNN``), or
    one body each. ``then()`` runs as soon as every answer is in, before the connections
    close. Each body's outcome: "ack", "nack" (AMQP), "ok" (native), or what happened."""
    if isinstance(bodies, int):
        amqp_bodies = [f"amqp-{i:04d}" for i in range(bodies)]
        native_bodies = [f"native-{i:04d}" for i in range(bodies)]
    else:
        amqp_bodies, native_bodies = [bodies[0]], [bodies[1]]
    conn = await aio_pika.connect(amqp_url(node), timeout=10)
    client = await Client.connect("127.0.0.1", node.ports["core"])
    try:
        ch = await conn.channel(publisher_confirms=True)
        exchange = await ch.get_exchange("amq.topic")
        persistent = aio_pika.DeliveryMode.PERSISTENT

        async def amqp(body: str) -> object:
            return await exchange.publish(
                aio_pika.Message(_padded(body), delivery_mode=persistent),
                routing_key=amqp_key,
                mandatory=False,
                timeout=CONFIRM_WAIT,
            )

        async def native(body: str) -> object:
            message = Message(_padded(body), persistent=True)
            return await client.publish(f"topic/{native_topic}", message)

        amqp_results, native_results = await asyncio.gather(
            _all_at_once(amqp, amqp_bodies), _all_at_once(native, native_bodies)
        )
        then()
    finally:
        await client.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 10)
    return (
        {b: _outcome(r) for b, r in zip(amqp_bodies, amqp_results, strict=True)},
        {b: _outcome(r) for b, r in zip(native_bodies, native_results, strict=True)},
    )


async def _all_at_once(
    publish: Callable[[str], Awaitable[object]], bodies: list[str]
) -> list[object]:
    """Every body published at once; each one's answer (a confirm, an error)."""
    return await asyncio.wait_for(
        asyncio.gather(*(publish(b) for b in bodies), return_exceptions=True), CONFIRM_WAIT
    )


def _padded(body: str) -> bytes:
    """``body`` and PAD bytes more: a leader takes a while to commit a few megabytes, while
    a confirm that does not wait for it comes at once."""
    return f"{body}:".encode() + b"x" * PAD


def _outcome(result: object) -> str:
    if isinstance(result, Basic.Ack):
        return "ack"
    if isinstance(result, aio_pika.exceptions.DeliveryError):
        return "nack"
    if not isinstance(result, BaseException):
        return "ok"  # (the native client's Published)
    return f"{type(result).__name__}: {result}"[:300]


def _consumed(node: Node, queue: str, expect: int) -> collections.Counter[str]:
    """The names of the messages in ``queue`` (their bodies up to the padding)."""
    got = drain(node, queue, expect=expect, timeout=30)
    return collections.Counter(m["body"].split(":")[0] for m in got if m["body"] != "probe")


def test_confirmed_topic_messages_survive_the_queue_leaders_crash(cluster: Cluster) -> None:
    origin, leader, shard = _pair(cluster)
    amqp_q = cluster.queue_in_shard(shard, "conf-amqp")
    native_q = cluster.queue_in_shard(shard, "conf-native")
    amqp_key, native_key = unique("conf.amqp"), unique("conf.native")
    asyncio.run(_declare_bound(origin, amqp_q, amqp_key))
    asyncio.run(_declare_bound(origin, native_q, native_key))

    # the leader is killed (-9) as soon as the last confirm is in
    amqp, native = asyncio.run(
        _publish(origin, amqp_key, native_key, N, lambda: cluster.kill(leader))
    )
    print(
        f"\npublished through {origin.id} to shard {shard} led by {leader.id} (killed):"
        f" amqp {collections.Counter(amqp.values())}, native {collections.Counter(native.values())}"
    )
    survivors = cluster.others(leader)
    new = cluster.leaders(timeout=60, nodes=survivors)[shard]
    assert new is not leader
    lost: dict[str, int] = {}
    for queue, outcomes in ((amqp_q, amqp), (native_q, native)):
        confirmed = {b for b, outcome in outcomes.items() if outcome in ("ack", "ok")}
        seen = _consumed(origin, queue, len(confirmed))
        lost[queue] = len(confirmed - set(seen))
    print(f"confirmed and lost once {new.id} led shard {shard}: {lost}")
    assert not any(lost.values()), lost
    # nothing went wrong before the kill: every one was confirmed
    assert set(amqp.values()) == {"ack"}, collections.Counter(amqp.values())
    assert set(native.values()) == {"ok"}, collections.Counter(native.values())
    cluster.restart(leader)
    cluster.wait_formed(timeout=90)


def test_a_leader_that_cannot_commit_gets_the_publisher_a_nack(cluster: Cluster) -> None:
    origin, leader, shard = _pair(cluster)
    amqp_q = cluster.queue_in_shard(shard, "frozen-amqp")
    native_q = cluster.queue_in_shard(shard, "frozen-native")
    amqp_key, native_key = unique("frozen.amqp"), unique("frozen.native")
    asyncio.run(_declare_bound(origin, amqp_q, amqp_key))
    asyncio.run(_declare_bound(origin, native_q, native_key))

    stomp_q = cluster.queue_in_shard(shard, "frozen-stomp")
    stomp_key = unique("frozen.stomp")
    asyncio.run(_declare_bound(origin, stomp_q, stomp_key))
    with stomp_conn(origin) as sender:
        cluster.freeze(leader)
        try:
            receipt = sender.send(f"/topic/{stomp_key}", "frozen-stomp", persistent="true")
            bodies = ("frozen-amqp", "frozen-native")
            amqp, native = asyncio.run(_publish(origin, amqp_key, native_key, bodies))
            stomp = sender.outcome(receipt, CONFIRM_WAIT)
        finally:
            cluster.thaw(leader)
        error = sender.errors[0] if sender.errors else None
    print(f"\n{leader.id} frozen: amqp {amqp}, native {native}, stomp {stomp} {error}")
    assert amqp == {"frozen-amqp": "nack"}, amqp
    outcome = native["frozen-native"]
    assert outcome.startswith(Unavailable.__name__), outcome
    assert "may not have been committed" in outcome, outcome
    assert stomp == "error", stomp
    assert error is not None and "may not have been committed" in error.body, error
    cluster.wait_formed(timeout=90)


def test_a_dead_letter_reaches_a_queue_led_by_another_node(cluster: Cluster) -> None:
    """A message rejected from a queue whose dead-letter queue's shard another node leads
    is in that queue (and no longer in its own) once the reject is answered."""

    def two_leaders() -> tuple[int, int] | None:
        # balanced first: the test before froze a leader, and the balancer's move back to it
        # (20 s after the takeover) refuses the writes in flight while the stream elects
        leaders = cluster.wait_balanced()
        for a, node_a in leaders.items():
            for b, node_b in leaders.items():
                if node_a is not node_b:
                    return a, b
        return None

    async def reject_one(
        port: int, source: str, target: str
    ) -> tuple[list[Lease], list[Lease], int] | None:
        """None if the set-up was refused ``unavailable`` (below)."""
        async with await Client.connect("127.0.0.1", port) as client:
            try:
                await client.declare(f"queue/{target}", durable=True)
                await client.declare(f"queue/{source}", durable=True, dead_letter=f"queue/{target}")
                await client.publish(f"queue/{source}", Message(b"dead", persistent=True))
            except Unavailable as exc:
                # A node the test before froze may depose a leader once thawed (an election
                # some seconds after the cluster looked balanced: docs/cluster.md,
                # "Partitions"); the set-up's answer is then the right one. Tried again on
                # fresh queues; what is under test (the reject, the dead letter) never is.
                print(f"set-up refused ({exc}); again on fresh queues")
                return None
            leases = await client.pull(f"queue/{source}", 1, wait=10)
            settled = await client.settle([x.receipt for x in leases], Outcome.REJECT)
            assert settled.settled == len(leases), settled
            dead = await client.pull(f"queue/{target}", 1, wait=10)
            left = (await client.stats(f"queue/{source}")).messages
            return leases, dead, left

    outcome = None
    for _ in range(3):
        shards = eventually(two_leaders, 90, "two shards led by different nodes")
        assert shards is not None
        source = cluster.queue_in_shard(shards[0], "dl-source")
        target = cluster.queue_in_shard(shards[1], "dl-target")
        node = cluster.wait_balanced()[shards[0]]  # (the source's leader dead-letters)
        outcome = asyncio.run(reject_one(node.ports["core"], source, target))
        if outcome is not None:
            break
        time.sleep(5.0)
    assert outcome is not None, "the set-up was refused unavailable three times"
    leases, dead, left = outcome
    assert [x.message.body for x in leases] == [b"dead"]
    assert [x.message.body for x in dead] == [b"dead"], dead
    assert dead[0].message.headers.get("x-death-reason") == "rejected", dead[0].message.headers
    assert left == 0
