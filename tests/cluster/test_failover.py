"""A leader crashes mid-stream: publishers on the survivors (AMQP with publisher confirms,
STOMP with receipts) keep publishing persistent messages to a queue of the dead leader's
shard, retrying whatever was not confirmed. Measured: the time from ``kill -9`` to the first
confirmed publish begun after it (<= 10 s). Then everything is consumed from a survivor: no
confirmed message is lost, and a message is there twice only if a publish of it went
unconfirmed and was retried. Messages delivered and not yet acknowledged when the leader died
(an HTTP pull's leases) come back flagged redelivered; an AMQP consumer's unacked deliveries,
its connection to a survivor, stay checked out to it and are acked after the failover.
An Avro batch POSTed with an ``Idempotency-Key`` before the kill and retried through another
node after it is answered as a duplicate, and is in the queue once; a long-polling
subscription to a stream opened before it is polled on, through another node, after it."""

from __future__ import annotations

import asyncio
import collections
import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import fastavro
import pika
import pytest
import requests
from pamqp.commands import Basic

from .harness import (
    Cluster,
    Node,
    StompConn,
    amqp_url,
    drain,
    eventually,
    http_ack,
    http_publish_ok,
    http_pull,
    http_stats,
    pika_connection,
)

pytestmark = pytest.mark.timeout(240)

WARMUP = 20  # confirmed publishes per publisher before the kill
AFTER = 20  # confirmed publishes per publisher begun after the kill
CONFIRM_TIMEOUT = 15.0  # seconds a publisher waits for one confirm before it retries
HELD = 5  # messages held unacknowledged when the leader dies, per consumer
RECORD = fastavro.parse_schema(
    {"type": "record", "name": "Row", "fields": [{"name": "n", "type": "long"}]}
)
BATCH = 200  # records of the Avro batch retried across the failover


def avro_post(node: Node, queue: str, body: bytes, key: str) -> dict[str, Any]:
    """POST an Avro container of persistent records with an ``Idempotency-Key``."""
    r = requests.post(
        f"{node.url('avro')}/v1/queue/{queue}/records",
        params={"persistent": "true"},
        data=body,
        headers={"Content-Type": "application/avro", "Idempotency-Key": key},
        timeout=30,
    )
    assert r.status_code == 200, f"avro publish via {node.id}: {r.status_code} {r.text}"
    out: dict[str, Any] = r.json()
    return out


def longpoll(node: Node, sub_id: str, cursor: str | None, n: int) -> dict[str, Any]:
    """Poll a long-polling subscription until ``n`` messages came (one answer); a 503 (its
    shard's leader moving) is polled again, as a browser would."""
    deadline = time.monotonic() + 60
    while True:
        params = {"wait": "2", **({"cursor": cursor} if cursor is not None else {})}
        r = requests.get(
            f"{node.url('longpoll')}/v1/subscriptions/{sub_id}/poll", params=params, timeout=30
        )
        if r.status_code == 200 and len(r.json()["messages"]) >= n:
            out: dict[str, Any] = r.json()
            return out
        assert r.status_code in (200, 503), f"poll via {node.id}: {r.status_code} {r.text}"
        assert time.monotonic() < deadline, f"poll via {node.id}: {r.status_code} {r.text}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


@dataclass
class Attempt:
    body: str
    started: float
    ended: float
    outcome: str  # "confirmed", or what happened instead

    @property
    def confirmed(self) -> bool:
        return self.outcome == "confirmed"


class Publisher(threading.Thread):
    """Publishes ``<name>-<n>`` persistent messages to ``queue`` on ``node``, one at a time,
    each until confirmed (retrying the same body after a failure, 0.2 s apart)."""

    def __init__(self, name: str, node: Node, queue: str) -> None:
        super().__init__(name=f"publisher-{name}", daemon=True)
        self.tag, self.node, self.queue = name, node, queue
        self.attempts: list[Attempt] = []
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.crashed: BaseException | None = None

    def record(self, attempt: Attempt) -> None:
        with self.lock:
            self.attempts.append(attempt)

    def snapshot(self) -> list[Attempt]:
        with self.lock:
            return list(self.attempts)

    def confirmed(self, since: float = 0.0) -> list[Attempt]:
        return [a for a in self.snapshot() if a.confirmed and a.started >= since]

    def tries(self) -> collections.Counter[str]:
        return collections.Counter(a.body for a in self.snapshot())

    def publish_once(self, body: str) -> str:
        raise NotImplementedError

    def loop(self) -> None:
        n = 0
        while not self.halt.is_set():
            body = f"{self.tag}-{n:06d}"
            started = time.monotonic()
            outcome = self.publish_once(body)
            self.record(Attempt(body, started, time.monotonic(), outcome))
            if outcome == "confirmed":
                n += 1
            else:
                self.halt.wait(0.2)

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as exc:
            self.crashed = exc
        finally:
            self.close()

    def close(self) -> None:
        pass


class StompPublisher(Publisher):
    def __init__(self, name: str, node: Node, queue: str) -> None:
        super().__init__(name, node, queue)
        self.client: StompConn | None = None

    def publish_once(self, body: str) -> str:
        try:
            if self.client is None:
                self.client = StompConn(self.node).connect(5.0)
            receipt = self.client.send(f"/queue/{self.queue}", body, persistent="true")
            outcome = self.client.outcome(receipt, CONFIRM_TIMEOUT)
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        if outcome == "receipt":
            return "confirmed"
        self.close()  # an ERROR closes the connection; a silent one is given up
        return f"stomp {outcome}"

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class AmqpPublisher(Publisher):
    """aio-pika on a loop of its own in this thread, publisher confirms on."""

    def loop(self) -> None:
        self.aloop = asyncio.new_event_loop()
        self.conn: Any = None
        self.channel: Any = None
        try:
            super().loop()
        finally:
            self.aloop.run_until_complete(self._close())
            self.aloop.close()

    def publish_once(self, body: str) -> str:
        return self.aloop.run_until_complete(self._publish(body))

    async def _close(self) -> None:
        if self.conn is not None:
            try:
                await asyncio.wait_for(self.conn.close(), 5)
            except Exception:
                pass
        self.conn = self.channel = None

    async def _publish(self, body: str) -> str:
        try:
            if self.conn is None or self.conn.is_closed:
                await self._close()
                self.conn = await aio_pika.connect(amqp_url(self.node), timeout=5)
            if self.channel is None or self.channel.is_closed:
                self.channel = await self.conn.channel(publisher_confirms=True)
            result = await self.channel.default_exchange.publish(
                aio_pika.Message(body.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=self.queue,
                timeout=CONFIRM_TIMEOUT,
            )
        except aio_pika.exceptions.DeliveryError as exc:
            return f"amqp nack: {exc.frame!r}"[:200]
        except TimeoutError:
            await self._close()  # the channel's state is unknown: start over
            return "amqp timeout"
        except Exception as exc:
            await self._close()
            return f"amqp {type(exc).__name__}: {exc}"[:200]
        if isinstance(result, Basic.Ack):
            return "confirmed"
        return f"amqp not confirmed: {result!r}"[:200]


def declare_durable(node: Node, queue: str) -> None:
    """``queue`` made durable through ``node`` before anything is published to it: an AMQP
    publish to a queue a STOMP SEND has not yet created would come back unroutable."""
    with pika_connection(node) as conn:
        conn.channel().queue_declare(queue, durable=True)


def publish_through(
    publishers: list[Publisher], fault: Callable[[], None], what: str
) -> tuple[float, float]:
    """Run ``publishers`` until each has WARMUP confirmed, then ``fault()``, then until each
    has AFTER confirmed publishes begun after it; stop them. (When the fault began, when it
    ended), monotonic."""
    for p in publishers:
        p.start()
    try:
        for p in publishers:
            eventually(lambda p=p: len(p.confirmed()) >= WARMUP, 60, f"{p.tag} warm-up")  # type: ignore[misc]
        began = time.monotonic()
        fault()
        ended = time.monotonic()
        for p in publishers:
            eventually(
                lambda p=p: len(p.confirmed(ended)) >= AFTER or p.crashed,  # type: ignore[misc]
                90,
                f"{p.tag}: {AFTER} confirmed publishes after {what}",
            )
    finally:
        for p in publishers:
            p.halt.set()
        for p in publishers:
            p.join(CONFIRM_TIMEOUT + 15)
    for p in publishers:
        assert p.crashed is None, f"{p.tag} crashed: {p.crashed!r}"
        assert not p.is_alive(), f"{p.tag} did not stop"
    return began, ended


def assert_nothing_confirmed_lost(publishers: list[Publisher], node: Node, queue: str) -> None:
    """Everything in ``queue``, consumed through ``node``: every body a publisher had
    confirmed, no body nobody published, a body twice only if its publish was retried."""
    attempted: collections.Counter[str] = collections.Counter()
    confirmed: set[str] = set()
    for p in publishers:
        attempted += p.tries()
        confirmed |= {a.body for a in p.confirmed()}
    got = drain(node, queue, expect=len(confirmed), timeout=90)
    seen = collections.Counter(m["body"] for m in got)
    lost = sorted(confirmed - set(seen))
    strangers = sorted(set(seen) - set(attempted))
    dups = {b: c for b, c in seen.items() if c > 1}
    unexplained = {b: c for b, c in dups.items() if attempted[b] < 2}
    unconfirmed_present = sorted(set(seen) - confirmed)
    print(
        f"consumed {len(got)} ({len(seen)} distinct) of {len(confirmed)} confirmed; "
        f"duplicates: {len(dups)} {dups}; present though never confirmed: "
        f"{unconfirmed_present}"
    )
    assert not lost, f"{len(lost)} confirmed messages lost: {lost[:20]}"
    assert not strangers, f"messages nobody published: {strangers[:20]}"
    assert not unexplained, f"duplicates of messages published once: {unexplained}"


def test_leader_killed_mid_stream(cluster: Cluster) -> None:
    leaders = cluster.wait_formed(timeout=30)
    # the shard led by the node leading the most, so its death moves the most
    by_leader = collections.Counter(n.id for n in leaders.values())
    victim = cluster.node_by_id(by_leader.most_common(1)[0][0])
    shard = min(s for s, n in leaders.items() if n is victim)
    s1, s2 = cluster.others(victim)
    q = cluster.queue_in_shard(shard, "fo")
    q_lease = cluster.queue_in_shard(shard, "lease")
    q_held = cluster.queue_in_shard(shard, "held")
    print(
        f"\nkilling {victim.id} (leads {sorted(s for s, n in leaders.items() if n is victim)})"
        f"; queue {q} in shard {shard}; publishers on {s1.id} (AMQP) and {s2.id} (STOMP)"
    )

    # the queues exist, durable, before anything is published
    conn = pika_connection(s1)
    ch = conn.channel()
    for name in (q, q_lease, q_held):
        ch.queue_declare(name, durable=True)

    # an idempotent Avro batch, published (through s1, forwarded to the victim) before the kill
    q_batch = cluster.queue_in_shard(shard, "batch")
    records = io.BytesIO()
    fastavro.writer(records, RECORD, [{"n": i} for i in range(BATCH)])
    first = avro_post(s1, q_batch, records.getvalue(), "spark-task-7")
    assert first["duplicate"] is False and first["count"] == BATCH

    # a browser's subscription to a stream of the shard, through s1's long-polling frontend
    stream = cluster.queue_in_shard(shard, "lp", kind="stream")
    for i in range(3):
        http_publish_ok(s1, stream, f"s{i}", kind="stream")
    r = requests.post(
        f"{s1.url('longpoll')}/v1/subscriptions",
        json={"destination": f"stream/{stream}", "offset": "first"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    sub_id = r.json()["id"]
    seen_before = longpoll(s1, sub_id, None, 3)
    assert [m["body"] for m in seen_before["messages"]] == ["s0", "s1", "s2"]

    # delivered and unacknowledged when the leader dies: HTTP leases and AMQP deliveries
    lease_bodies = [f"lease-{i}" for i in range(HELD)]
    held_bodies = [f"held-{i}" for i in range(HELD)]
    for body in lease_bodies:
        http_publish_ok(s1, q_lease, body)
    for body in held_bodies:
        http_publish_ok(s2, q_held, body)
    leases: list[dict[str, Any]] = []
    eventually(
        lambda: (
            leases.extend(http_pull(s2, q_lease, HELD - len(leases), 1, 600))
            or (len(leases) >= HELD)
        ),
        20,
        "leases taken",
    )
    assert sorted(m["body"] for m in leases) == lease_bodies
    assert not any(m["redelivered"] for m in leases)

    deliveries: list[tuple[str, bool, int]] = []  # (body, redelivered, tag) on the consumer
    cancelled: list[str] = []

    def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
        deliveries.append((body.decode(), bool(method.redelivered), method.delivery_tag))

    ch.basic_qos(prefetch_count=2 * HELD)
    ch.add_on_cancel_callback(lambda frame: cancelled.append(str(frame)))
    ch.basic_consume(q_held, on_message, auto_ack=False)
    deadline = time.monotonic() + 20
    while len(deliveries) < HELD:
        assert time.monotonic() < deadline, f"held deliveries: {deliveries}"
        conn.process_data_events(time_limit=0.1)
    assert sorted(b for b, _, _ in deliveries) == held_bodies and not any(
        r for _, r, _ in deliveries
    )

    publishers: list[Publisher] = [AmqpPublisher("amqp", s1, q), StompPublisher("stomp", s2, q)]
    t_kill, _ = publish_through(publishers, lambda: cluster.kill(victim), "the kill")
    print(f"killed {victim.id}")

    # the outage as a publisher saw it
    after = [a for p in publishers for a in p.confirmed(t_kill)]
    outage = min(a.ended for a in after) - t_kill
    failures = collections.Counter(
        a.outcome.split(":")[0] for p in publishers for a in p.snapshot() if not a.confirmed
    )
    for p in publishers:
        mine = p.confirmed(t_kill)
        print(
            f"{p.tag}: {len(p.confirmed())} confirmed, first after the kill "
            f"{min(a.ended for a in mine) - t_kill:.2f}s after it"
        )
    print(
        f"kill -9 -> first confirmed publish begun after it: {outage:.2f}s; failed attempts: "
        f"{dict(failures)}"
    )
    assert outage <= 10.0, f"{outage:.2f}s without a confirmed publish after the kill"

    new_leader = cluster.leaders(timeout=30, nodes=[s1, s2])[shard]
    print(f"shard {shard} is now led by {new_leader.id}")

    # the Avro batch retried through the other survivor: a duplicate, answered as the first
    again = avro_post(s2, q_batch, records.getvalue(), "spark-task-7")
    assert again["duplicate"] is True, again
    assert (again["ids"], again["seqs"]) == (first["ids"], first["seqs"])
    assert len(drain(s2, q_batch, expect=BATCH, timeout=60)) == BATCH

    # the stream subscription lives on with the shard: polled through s2, from its cursor
    http_publish_ok(s2, stream, "s3", kind="stream")
    after = longpoll(s2, sub_id, seen_before["cursor"], 1)
    assert [m["body"] for m in after["messages"]] == ["s3"], after

    # everything from a survivor: nothing confirmed lost, duplicates only of retried bodies
    assert_nothing_confirmed_lost(publishers, s2, q)

    # the HTTP leases held on the dead leader come back, redelivered, long before they expire
    back: list[dict[str, Any]] = []
    eventually(
        lambda: back.extend(http_pull(s1, q_lease, HELD, 1, 600)) or len(back) >= HELD,
        30,
        "leased messages back after the failover",
    )
    assert sorted(m["body"] for m in back) == lease_bodies, back
    assert all(m["redelivered"] for m in back), [(m["body"], m["redelivered"]) for m in back]
    http_ack(s1, [m["receipt"] for m in back])

    # the AMQP consumer's unacknowledged deliveries stay checked out to it: its subscription
    # is re-issued against the new leader, which takes them back under the same tags
    # (docs/cluster.md, "Any node serves any client"): nothing comes again, and its acks of
    # the tags it had work
    closed: list[str] = []
    quiet = time.monotonic() + 5
    while time.monotonic() < quiet and not closed:
        try:
            conn.process_data_events(time_limit=0.1)
        except pika.exceptions.AMQPError as exc:  # the broker closed the channel or connection
            closed.append(repr(exc))
    assert not closed and not cancelled, (
        f"the consumer on {s1.id} did not survive the failover: closed {closed}, "
        f"cancelled {cancelled}"
    )
    assert deliveries[HELD:] == [], f"delivered again after the failover: {deliveries[HELD:]}"
    for _, _, tag in deliveries:
        ch.basic_ack(tag)
    eventually(
        lambda: (
            conn.process_data_events(time_limit=0.1)
            or http_stats(s2, q_held)["messages"] + http_stats(s2, q_held)["in_flight"] == 0
        ),
        20,
        "the held deliveries acked after the failover",
    )
    assert deliveries[HELD:] == [], f"delivered again after the acks: {deliveries[HELD:]}"
    conn.close()
