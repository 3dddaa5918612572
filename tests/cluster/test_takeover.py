"""A shard's leader moves while a consumer holds deliveries (docs/cluster.md, "Any node
serves any client"): its connection is to another node, which survives, so what it holds
stays checked out to it on the new leader (claimed there under the same tags), is not
delivered again, and its acks work; first a planned move (a JetStream leader step-down),
then a crash (``kill -9`` of the new leader's node). A message never delivered is not
flagged redelivered after those moves (only deliveries are marked in the log), and a
queue that is not durable, declared and bound through the leader before the moves, is
still there, bound, afterwards (its declaration and binding are in the log)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import nats
import pika
import pytest
import requests

from polymq import Client
from polymq_core.cluster.natsd import CLIENT_USER, derived_password

from .harness import (
    HTTP_TIMEOUT,
    Cluster,
    Node,
    eventually,
    http_publish_ok,
    http_pull,
    http_stats,
    pika_connection,
    unique,
)

pytestmark = pytest.mark.timeout(240)

HELD = 3  # deliveries the consumer holds unacknowledged across the moves
QUIET = 4.0  # seconds in which nothing may be delivered again after a move


@dataclasses.dataclass
class Scene:
    cluster: Cluster
    shard: int
    consumer_node: Node  # never the shard's leader: its node survives every move
    queue: str  # durable; the consumer holds HELD of its messages
    idle: str  # durable; one message, never delivered
    loose: str  # not durable, bound to topic/<topic>.#
    topic: str
    conn: pika.BlockingConnection
    ch: Any
    deliveries: list[tuple[str, bool, int]]  # (body, redelivered, tag)
    cancelled: list[str]

    def pump(self, seconds: float) -> None:
        """Let the consumer's connection take what comes for ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.conn.process_data_events(time_limit=0.1)

    def settled(self) -> dict[str, Any]:
        """The queue's stats, through the consumer's node."""
        return http_stats(self.consumer_node, self.queue)


def _stepdown(node: Node, secret: str, shard: int, preferred: str) -> None:
    """Ask JetStream, through ``node``'s nats-server, to move the lead of ``shard``'s stream
    to the server ``preferred`` (as the balancer and a stopping node do)."""
    ports = sorted(node.data_dir.glob("**/*.ports"))
    assert ports, f"no nats-server ports file under {node.data_dir}"
    url = json.loads(ports[-1].read_text())["nats"][0]

    async def ask() -> dict[str, Any]:
        nc = await nats.connect(
            url, user=CLIENT_USER, password=derived_password(secret, "clients"), connect_timeout=5
        )
        try:
            body = json.dumps({"placement": {"preferred": preferred}}).encode()
            msg = await nc.request(
                f"$JS.API.STREAM.LEADER.STEPDOWN.POLYMQ_SHARD_{shard}", body, timeout=10
            )
            out: dict[str, Any] = json.loads(msg.data)
            return out
        finally:
            await nc.close()

    answer = asyncio.run(ask())
    assert answer.get("success") is True, answer


async def _declare_loose(node: Node, queue: str, topic: str) -> None:
    async with await Client.connect("127.0.0.1", node.ports["core"]) as client:
        await client.declare(f"queue/{queue}", durable=False)
        await client.bind(f"topic/{topic}.#", f"queue/{queue}")


@pytest.fixture(scope="module")
def scene(shared_cluster: Cluster) -> Iterator[Scene]:
    cluster = shared_cluster
    leaders = cluster.wait_formed(timeout=60)
    shard, leader = min(leaders.items())
    consumer_node = cluster.others(leader)[0]
    queue = cluster.queue_in_shard(shard, "held")
    idle = cluster.queue_in_shard(shard, "idle")
    loose = cluster.queue_in_shard(shard, "loose")
    topic = unique("moved")
    print(f"\nshard {shard} led by {leader.id}; consumer on {consumer_node.id}")

    conn = pika_connection(consumer_node)
    ch = conn.channel()
    for name in (queue, idle):
        ch.queue_declare(name, durable=True)
    asyncio.run(_declare_loose(consumer_node, loose, topic))
    http_publish_ok(consumer_node, idle, "never-delivered")
    for i in range(HELD):
        http_publish_ok(consumer_node, queue, f"held-{i}")
    s = Scene(cluster, shard, consumer_node, queue, idle, loose, topic, conn, ch, [], [])
    deliveries, cancelled = s.deliveries, s.cancelled

    def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
        deliveries.append((body.decode(), bool(method.redelivered), method.delivery_tag))

    ch.basic_qos(prefetch_count=10)
    ch.add_on_cancel_callback(lambda frame: cancelled.append(str(frame)))
    ch.basic_consume(queue, on_message, auto_ack=False)
    deadline = time.monotonic() + 20
    while len(deliveries) < HELD:
        assert time.monotonic() < deadline, f"deliveries: {deliveries}"
        s.pump(0.1)
    assert [b for b, _, _ in deliveries] == [f"held-{i}" for i in range(HELD)]
    assert not any(r for _, r, _ in deliveries), deliveries
    try:
        yield s
    finally:
        if conn.is_open:
            conn.close()


def _assert_not_again(s: Scene, what: str) -> None:
    s.pump(QUIET)
    assert not s.cancelled, f"the consumer was cancelled after {what}: {s.cancelled}"
    again = s.deliveries[HELD:]
    assert not again, f"delivered again after {what}: {again}"


def test_a_planned_move_keeps_the_deliveries_checked_out(scene: Scene) -> None:
    s = scene
    leader = s.cluster.leader_of(s.shard)
    target = next(n for n in s.cluster.others(leader) if n is not s.consumer_node)
    started = time.monotonic()
    _stepdown(leader, s.cluster.secret, s.shard, target.id)
    eventually(
        lambda: s.cluster.leaders(timeout=30).get(s.shard) is target,
        30,
        f"shard {s.shard} led by {target.id}",
    )
    took = time.monotonic() - started
    print(f"shard {s.shard} moved from {leader.id} to {target.id} in {took:.2f}s")
    _assert_not_again(s, "the step-down")
    # the new leader holds them for this consumer: an ack of one of the old tags settles it
    s.ch.basic_ack(s.deliveries[0][2])
    eventually(
        lambda: (s.pump(0.1), s.settled())[1]["in_flight"] == HELD - 1,
        20,
        "the first held delivery acked after the move",
    )
    assert s.settled()["messages"] == 0
    _assert_not_again(s, "the ack")


def test_a_crash_keeps_the_deliveries_checked_out(scene: Scene) -> None:
    s = scene
    victim = s.cluster.leader_of(s.shard)
    assert victim is not s.consumer_node
    survivors = s.cluster.others(victim)
    started = time.monotonic()
    s.cluster.kill(victim)
    leader = s.cluster.leaders(timeout=60, nodes=survivors)[s.shard]
    took = time.monotonic() - started
    print(f"killed {victim.id}; shard {s.shard} led by {leader.id} {took:.2f}s later")
    _assert_not_again(s, "the kill")
    for _, _, tag in s.deliveries[1:HELD]:
        s.ch.basic_ack(tag)
    eventually(
        lambda: (s.pump(0.1), s.settled())[1]["in_flight"] == 0,
        30,
        "the held deliveries acked after the failover",
    )
    assert s.settled()["messages"] == 0
    _assert_not_again(s, "the acks")


def test_a_message_never_delivered_is_not_redelivered(scene: Scene) -> None:
    s = scene
    got = http_pull(s.consumer_node, s.idle, 10, wait=2.0, retry_until=time.monotonic() + 30)
    assert [m["body"] for m in got] == ["never-delivered"], got
    assert got[0]["redelivered"] is False, got[0]


def test_a_queue_that_is_not_durable_survives_its_leaders(scene: Scene) -> None:
    s = scene
    r = requests.get(f"{s.consumer_node.url()}/v1/queue/{s.loose}", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, f"{s.loose} after the moves: {r.status_code} {r.text}"
    stats = r.json()
    assert stats["options"]["durable"] is False and stats["bindings"] == 1, stats
    http_publish_ok(s.consumer_node, f"{s.topic}.a", "routed", kind="topic", persistent=False)
    got = http_pull(s.consumer_node, s.loose, 10, wait=5.0, retry_until=time.monotonic() + 30)
    assert [m["body"] for m in got] == ["routed"], got
