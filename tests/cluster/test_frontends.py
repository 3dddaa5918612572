"""Any node serves any client: what STOMP publishes on node 1 is consumed over AMQP on node 3
and over HTTP on node 2, for queues in every shard (so each node is, in turn, the leader the
others forward to, or the leader itself); a topic message published on node 1 reaches a STOMP
subscriber on node 2."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from polymq import Client, Message

from .harness import (
    Cluster,
    Node,
    drain,
    eventually,
    pika_connection,
    stomp_conn,
    unique,
)

pytestmark = pytest.mark.timeout(180)

PER_QUEUE = 5


def sent_message(queue: str, i: int) -> tuple[str, dict[str, str]]:
    body = json.dumps({"queue": queue, "i": i, "text": "grüße, 東京 \u2603"}, ensure_ascii=False)
    headers = {
        "persistent": "true",
        "content-type": "application/json",
        "x-seq": str(i),
        "x-tenant": "acme",
    }
    return body, headers


def amqp_get_all(node: Node, queue: str, n: int, timeout: float = 30.0) -> list[Any]:
    """``n`` messages from ``queue`` via basic.get on ``node`` (acked), then check it is empty."""
    conn = pika_connection(node)
    try:
        ch = conn.channel()
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < n:
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                assert time.monotonic() < deadline, f"{queue}: {len(got)} of {n} via {node.id}"
                time.sleep(0.05)
                continue
            got.append((method, props, body))
            ch.basic_ack(method.delivery_tag)
        time.sleep(0.5)
        method, _, body = ch.basic_get(queue, auto_ack=True)
        assert method is None, f"{queue}: one more message than published: {body!r}"
        return got
    finally:
        if conn.is_open:
            conn.close()


def test_stomp_publish_consumed_over_amqp_and_http_for_every_leader(
    shared_cluster: Cluster,
) -> None:
    """Every shard once; then, while a node has led none of the shards tested (JetStream
    places leaders as it likes), leadership is moved to it (the busiest node is killed and
    started again) and its shards are tested too."""
    cluster = shared_cluster
    covered: set[str] = set()
    leaders = cluster.wait_balanced()  # (no shard moves, and redelivers, under the test)
    shards = list(leaders)
    for _ in range(4):
        print(f"\nshard leaders: { {s: n.id for s, n in leaders.items()} }; testing {shards}")
        stomp_to_amqp_and_http(cluster, leaders, shards)
        covered |= {leaders[s].id for s in shards}
        missing = [n for n in cluster.nodes if n.id not in covered]
        if not missing:
            break
        cluster.spread_leaders(attempts=1, among=missing[:1])
        leaders = cluster.wait_balanced()
        shards = [s for s, n in leaders.items() if n.id not in covered]
    missing = [n.id for n in cluster.nodes if n.id not in covered]
    if missing:
        print(f"note: {missing} led no shard in any round; they forwarded only")


def stomp_to_amqp_and_http(cluster: Cluster, leaders: dict[int, Node], shards: list[int]) -> None:
    """For each of ``shards``: STOMP on node 1 publishes to one queue consumed over AMQP on
    node 3 and to one consumed over HTTP on node 2; all arrive as sent, in order, once."""
    n1, n2, n3 = cluster.nodes
    amqp_queues = {s: cluster.queue_in_shard(s, "fa") for s in shards}
    http_queues = {s: cluster.queue_in_shard(s, "fh") for s in shards}
    conn = pika_connection(n3)
    try:
        ch = conn.channel()
        for q in amqp_queues.values():
            ch.queue_declare(q, durable=True)
    finally:
        conn.close()

    with stomp_conn(n1) as pub:
        for q in [*amqp_queues.values(), *http_queues.values()]:
            for i in range(PER_QUEUE):
                body, headers = sent_message(q, i)
                pub.send_ok(f"/queue/{q}", body, **headers)

    for shard, q in amqp_queues.items():
        got = amqp_get_all(n3, q, PER_QUEUE)
        for i, (method, props, body) in enumerate(got):
            want, _ = sent_message(q, i)
            where = f"{q} (shard {shard}, led by {leaders[shard].id}) message {i} via AMQP"
            assert body == want.encode(), where
            assert (method.exchange, method.routing_key) == ("", q), where
            assert props.content_type == "application/json", where
            assert props.delivery_mode == 2, where
            assert props.headers == {"x-seq": str(i), "x-tenant": "acme"}, where
            assert not method.redelivered, where

    for shard, q in http_queues.items():
        got = drain(n2, q, expect=PER_QUEUE, timeout=30)
        where = f"{q} (shard {shard}, led by {leaders[shard].id}) via HTTP"
        assert [m["body"] for m in got] == [sent_message(q, i)[0] for i in range(PER_QUEUE)], where
        for i, m in enumerate(got):
            assert m["destination"] == f"queue/{q}", where
            assert m["encoding"] == "utf8" and m["content_type"] == "application/json", where
            assert m["persistent"] is True and m["redelivered"] is False, where
            assert m["headers"] == {"x-seq": str(i), "x-tenant": "acme"}, where


def test_topic_message_reaches_a_subscriber_on_another_node(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    cluster.wait_formed(timeout=30)
    n1, n2, _ = cluster.nodes
    t = unique("x")
    with stomp_conn(n2) as sub, stomp_conn(n1) as pub:
        sub.subscribe(f"/topic/{t}.*", sid="s1")
        # the subscription's interest travels to node 1 (NATS routes): probe until it has
        started = time.monotonic()

        def probe_arrived() -> bool:
            pub.send_ok(f"/topic/{t}.y", "probe")
            return sub.wait(lambda: "probe" in sub.bodies(), 0.5)

        eventually(probe_arrived, 15, "a topic message from node 1 at node 2", interval=0)
        print(f"\nnode 2's topic interest reached node 1 within {time.monotonic() - started:.2f}s")

        sent = [f"m{i}-{unique()}" for i in range(5)]
        for body in sent[:3]:
            pub.send_ok(f"/topic/{t}.y", body)
        pub.send_ok(f"/topic/{t}.y.z", "not-for-x.*")  # two words after x: no match
        pub.send_ok(f"/topic/{unique('other')}.y", "other-topic")
        for body in sent[3:]:
            pub.send_ok(f"/topic/{t}.y", body)
        assert sub.wait(lambda: sent[-1] in sub.bodies(), 10), sub.bodies()
        got = [m for m in sub.messages if m.body != "probe"]
        assert [m.body for m in got] == sent
        assert all(m.headers["destination"] == f"/topic/{t}.y" for m in got)


def test_stream_publishes_in_flight_together_keep_every_entry(shared_cluster: Cluster) -> None:
    """Persistent publishes to a stream in flight at once, through every node: each gets its
    own seq and every entry is read back in seq order (a leader appended them once
    committed, and before each one in flight took the same number: the log kept the last)."""
    cluster = shared_cluster
    cluster.wait_formed(timeout=30)
    s = f"stream/{unique('inflight')}"

    async def run() -> list[bytes]:
        clients = [await Client.connect("127.0.0.1", n.ports["core"]) for n in cluster.nodes]
        try:
            await clients[0].declare(s, durable=True)
            receipts = await asyncio.gather(
                *(
                    clients[i % len(clients)].publish(s, [Message(b"%03d" % i, persistent=True)])
                    for i in range(60)
                )
            )
            seqs = sorted(r.seqs[0] for r in receipts)
            assert seqs == list(range(1, 61)), seqs
            reader = await clients[-1].subscribe(s, offset="first")
            got = [await reader.get(20) for _ in range(60)]
            assert [d.message.seq for d in got] == list(range(1, 61))
            return [d.message.body for d in got]
        finally:
            for c in clients:
                await c.close()

    bodies = asyncio.run(run())
    assert sorted(bodies) == [b"%03d" % i for i in range(60)]
