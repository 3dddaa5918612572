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
from typing import Any

import aio_pika
import pytest
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from polymq import Client, Message
from polymq.errors import Unavailable

from .harness import Cluster, Node, amqp_url, drain, running_cluster, unique

pytestmark = pytest.mark.timeout(300)

N = 300  # persistent messages per publisher
CONFIRM_WAIT = 60.0  # seconds a publisher waits for its confirms (a frozen leader: ~15 s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_cluster(tmp_path_factory.mktemp("confirms")) as c:
        yield c


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


async def _amqp_publish(node: Node, key: str, bodies: list[str]) -> dict[str, str]:
    """Publish ``bodies`` to ``amq.topic`` with ``key`` through ``node``, persistent, all in
    flight at once, publisher confirms on: each body's outcome ("ack", "nack", or what)."""
    conn = await aio_pika.connect(amqp_url(node), timeout=10)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        exchange = await ch.get_exchange("amq.topic")
        persistent = aio_pika.DeliveryMode.PERSISTENT
        results = await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(b.encode(), delivery_mode=persistent),
                    routing_key=key,
                    timeout=CONFIRM_WAIT,
                )
                for b in bodies
            ),
            return_exceptions=True,
        )
    return {b: _outcome(r) for b, r in zip(bodies, results, strict=True)}


def _outcome(result: object) -> str:
    if isinstance(result, Basic.Ack):
        return "ack"
    if isinstance(result, aio_pika.exceptions.DeliveryError):
        return "nack"
    if isinstance(result, DeliveredMessage):  # (aio-pika publishes mandatory)
        return "returned as unroutable"
    return f"{type(result).__name__}: {result}"[:200]


async def _native_publish(node: Node, topic: str, bodies: list[str]) -> dict[str, str]:
    """Publish ``bodies`` to ``topic/<topic>`` through ``node``'s core with the native
    client, persistent, all in flight at once: each body's outcome ("ok", or the error)."""
    client = await Client.connect("127.0.0.1", node.ports["core"])
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(
                    client.publish(f"topic/{topic}", Message(b.encode(), persistent=True))
                    for b in bodies
                ),
                return_exceptions=True,
            ),
            CONFIRM_WAIT,
        )
    finally:
        await client.close()
    return {
        b: "ok" if not isinstance(r, BaseException) else f"{type(r).__name__}: {r}"
        for b, r in zip(bodies, results, strict=True)
    }


def _consumed(node: Node, queue: str, expect: int) -> collections.Counter[str]:
    got = drain(node, queue, expect=expect, timeout=120)
    return collections.Counter(m["body"] for m in got if m["body"] != "probe")


def test_confirmed_topic_messages_survive_the_queue_leaders_crash(cluster: Cluster) -> None:
    origin, leader, shard = _pair(cluster)
    amqp_q = cluster.queue_in_shard(shard, "conf-amqp")
    native_q = cluster.queue_in_shard(shard, "conf-native")
    amqp_key, native_key = unique("conf.amqp"), unique("conf.native")
    asyncio.run(_declare_bound(origin, amqp_q, amqp_key))
    asyncio.run(_declare_bound(origin, native_q, native_key))

    async def publish_both() -> tuple[dict[str, str], dict[str, str]]:
        return await asyncio.gather(
            _amqp_publish(origin, amqp_key, [f"amqp-{i:04d}" for i in range(N)]),
            _native_publish(origin, native_key, [f"native-{i:04d}" for i in range(N)]),
        )

    amqp, native = asyncio.run(publish_both())
    cluster.kill(leader)  # right after the last confirm
    print(
        f"\npublished through {origin.id} to shard {shard} led by {leader.id} (killed):"
        f" amqp {collections.Counter(amqp.values())}, native {collections.Counter(native.values())}"
    )
    # nothing went wrong before the kill: every one was confirmed
    assert set(amqp.values()) == {"ack"}, collections.Counter(amqp.values())
    assert set(native.values()) == {"ok"}, collections.Counter(native.values())

    survivors = cluster.others(leader)
    new = cluster.leaders(timeout=60, nodes=survivors)[shard]
    assert new is not leader
    for queue, confirmed in ((amqp_q, amqp), (native_q, native)):
        seen = _consumed(origin, queue, len(confirmed))
        lost = sorted(set(confirmed) - set(seen))
        assert not lost, f"{queue}: {len(lost)} of {len(confirmed)} confirmed lost: {lost[:10]}"
    cluster.restart(leader)
    cluster.wait_formed(timeout=90)


def test_a_leader_that_cannot_commit_gets_the_publisher_a_nack(cluster: Cluster) -> None:
    origin, leader, shard = _pair(cluster)
    amqp_q = cluster.queue_in_shard(shard, "frozen-amqp")
    native_q = cluster.queue_in_shard(shard, "frozen-native")
    amqp_key, native_key = unique("frozen.amqp"), unique("frozen.native")
    asyncio.run(_declare_bound(origin, amqp_q, amqp_key))
    asyncio.run(_declare_bound(origin, native_q, native_key))

    async def publish_both() -> tuple[dict[str, str], dict[str, str]]:
        return await asyncio.gather(
            _amqp_publish(origin, amqp_key, ["frozen-amqp"]),
            _native_publish(origin, native_key, ["frozen-native"]),
        )

    cluster.freeze(leader)
    try:
        amqp, native = asyncio.run(publish_both())
    finally:
        cluster.thaw(leader)
    print(f"\n{leader.id} frozen: amqp {amqp}, native {native}")
    assert amqp == {"frozen-amqp": "nack"}, amqp
    outcome = native["frozen-native"]
    assert outcome.startswith(Unavailable.__name__), outcome
    assert "may not have been committed" in outcome, outcome
    cluster.wait_formed(timeout=90)
