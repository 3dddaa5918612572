"""A queue's lead moves while its consumer is behind (docs/cluster.md, "Any node serves any
client"): the consumer, with a prefetch, reads slower than the queue's leader delivers, so
part of its window is still in the leader's session output, not on the wire, when the lead
moves (a JetStream leader step-down). Its connection survives the move, and it gets every
message afterwards: none stays checked out to it on the new leader without ever reaching it
(what ``python -m bench --only cluster_backlog`` saw: 534 and 710 of 200k messages counted
``in_flight`` by the new leader, never delivered, until the consumer left).

Two places for the consumer: on the leader's own node (its subscription is local there and
moves away: the bench's case), and on another node (its relay forwards the subscription to
the leader, and moves it). What it holds across the move stays checked out to it (claimed),
so nothing comes twice either: its acks, sent while the move is under way, must not be lost
on the old leader or on a new one that has not taken the subscription yet."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from polymq import Client
from polymq.types import Message

from .harness import Cluster, Node, http_stats
from .test_takeover import _stepdown

pytestmark = pytest.mark.timeout(300)

COUNT = 600  # messages published before the consumer starts
BODY = 64 * 1024  # bytes each
PREFETCH = 400  # 25 MiB unacked at most: on loopback the sockets between took all of it
FIRST = 5  # read and acked before the consumer stops reading: their 5 successors, delivered
# once the sockets were full, wait in the leader's session (measured: 5 of 5 stranded)
LOCAL_BUFFER = 4  # the client stops reading its socket past this many unread deliveries
SETTLE = 2.0  # seconds the leader has to fill the window while the consumer does not read
QUIET = 30.0  # seconds without a new delivery after which the consumer gives up


def _body(i: int) -> bytes:
    return i.to_bytes(4, "big") + bytes(BODY - 4)


async def _publish(node: Node, dest: str) -> None:
    async with await Client.connect("127.0.0.1", node.ports["core"]) as client:
        await client.declare(dest, durable=True)
        for start in range(0, COUNT, 20):
            batch = [
                Message(body=_body(i), persistent=True)
                for i in range(start, min(start + 20, COUNT))
            ]
            await client.publish(dest, batch)


def _in_flight(node: Node, queue: str) -> int:
    try:
        stats = http_stats(node, queue)
    except AssertionError:  # (503 while the lead moves)
        return -1
    return int(stats["in_flight"])


async def _consume_across_a_move(
    cluster: Cluster, shard: int, consumer_node: Node, target: Node, queue: str
) -> tuple[set[int], int, dict[str, Any]]:
    """Consume ``queue`` through ``consumer_node``, stop reading with the window full, move
    the shard's lead to ``target``, read on: (the messages received, the deliveries, the
    queue's stats when the consumer gave up)."""
    dest = f"queue/{queue}"
    got: set[int] = set()
    deliveries = 0
    async with await Client.connect(
        "127.0.0.1",
        consumer_node.ports["core"],
        local_buffer=LOCAL_BUFFER,
        heartbeat=None,  # (its reading stops for a while: no pong is read meanwhile)
        reconnect_timeout=None,  # no failover: the connection must survive the move
    ) as client:
        sub = await client.subscribe(
            dest,
            ack_mode="client-individual",
            prefetch=PREFETCH,
            buffer_bytes=4 * PREFETCH * BODY,  # (not cut as a slow consumer meanwhile)
            buffer_messages=4 * PREFETCH,
        )
        for _ in range(FIRST):
            d = await sub.get(30)
            got.add(int.from_bytes(d.message.body[:4], "big"))
            deliveries += 1
            d.ack()
        # the client stops reading; the leader fills the window, what the sockets do not
        # take waits in its session
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(_in_flight, consumer_node, queue) < PREFETCH:
            assert time.monotonic() < deadline, "the consumer's window never filled"
            await asyncio.sleep(0.2)
        await asyncio.sleep(SETTLE)
        leader = cluster.leader_of(shard)
        await asyncio.to_thread(_stepdown, leader, cluster.secret, shard, target.id)
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(lambda: cluster.leaders(timeout=30).get(shard)) is not target:
            assert time.monotonic() < deadline, f"shard {shard} never moved to {target.id}"
            await asyncio.sleep(0.2)
        print(f"shard {shard} moved from {leader.id} to {target.id}")
        while len(got) < COUNT:
            try:
                d = await sub.get(QUIET)
            except TimeoutError:
                break
            got.add(int.from_bytes(d.message.body[:4], "big"))
            deliveries += 1
            d.ack()
        assert not client.closed, "the consumer's connection did not survive the move"
        # (its acks are sent as it goes: wait for them while it is still connected)
        deadline = time.monotonic() + 20
        while True:
            stats = await asyncio.to_thread(http_stats, consumer_node, queue)
            settled = stats["messages"] == 0 and stats["in_flight"] == 0
            if settled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    return got, deliveries, stats


@pytest.mark.parametrize("where", ["on-the-leader", "elsewhere"])
def test_a_consumer_behind_gets_every_message_after_a_move(
    shared_cluster: Cluster, where: str
) -> None:
    cluster = shared_cluster
    leaders = cluster.wait_formed(timeout=60)
    shard, leader = min(leaders.items())
    others = cluster.others(leader)
    consumer_node = leader if where == "on-the-leader" else others[0]
    target = others[-1]
    queue = cluster.queue_in_shard(shard, "behind")
    print(f"\nshard {shard} led by {leader.id}; consumer on {consumer_node.id}")
    asyncio.run(_publish(leader, f"queue/{queue}"))
    got, deliveries, stats = asyncio.run(
        _consume_across_a_move(cluster, shard, consumer_node, target, queue)
    )
    missing = sorted(set(range(COUNT)) - got)
    print(f"received {len(got)} of {COUNT} in {deliveries} deliveries; stats {stats}")
    assert not missing, (
        f"{len(missing)} messages never reached the consumer (first {missing[:10]}); "
        f"the queue's stats: in_flight {stats['in_flight']}, messages {stats['messages']}"
    )
    assert stats["messages"] == 0 and stats["in_flight"] == 0, stats
    # what it held across the move stayed checked out to it (claimed), so nothing came
    # twice: its acks of those deliveries, sent while the move was asked, settled them
    assert deliveries == COUNT, f"{deliveries - COUNT} deliveries of messages it already had"
