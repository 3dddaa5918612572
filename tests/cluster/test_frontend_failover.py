"""The frontends ride through the loss of the core node their link uses: an HTTP frontend and
an AMQP frontend, each a process of its own given every core address (``--core N1,N2,N3``),
are connected to node 1, which also leads the shard of the queues used. Through them an HTTP
client publishes persistent messages one request at a time and pulls and acks them, and an
AMQP client publishes with publisher confirms on one connection and consumes with acks on
another. Node 1 is killed (``kill -9``) halfway. Each frontend's core link fails over to a
survivor, subscribes the AMQP consumer again and sends the unanswered requests again (the
publishes with their batch ids): every HTTP publish is answered 200 (none fails; they wait
for the election), the AMQP connections stay open and every publish is confirmed, and
every confirmed message is consumed (at least once: what was delivered before the kill and
not yet acknowledged comes again, flagged redelivered). A pull may be answered 503 while
the queue's shard has no leader (the client tries again after ``Retry-After``), as before,
and an ack of a lease pulled before the kill may be answered 404 "unknown or expired
lease" (the killed leader held it; the message comes again), as for an expired lease.
On the code before, the AMQP connections were closed ``CONNECTION_FORCED``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests

from ..procs import PolymqProcess
from .harness import HTTP_TIMEOUT, Cluster, Node, running_cluster

pytestmark = pytest.mark.timeout(240)

BEFORE = 15  # confirmed publishes (of each client) before the kill
AFTER = 15  # confirmed publishes begun after the kill
WAIT = 60.0  # seconds for anything that takes a failover (a JetStream election is 4-9 s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("frontend-failover")) as cluster:
        yield cluster


def core(node: Node) -> str:
    return f"127.0.0.1:{node.ports['core']}"


class Worker(threading.Thread):
    """Runs ``step`` until told to stop; keeps the first exception."""

    def __init__(self, name: str, step: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.step = step
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
        except BaseException as exc:
            self.error = exc


class HttpClient:
    """Publishes one message per request (each answered before the next) and pulls and acks,
    through the HTTP frontend at ``url``; every answer not 200 is kept."""

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.queue = queue
        self.confirmed: list[str] = []
        self.consumed: set[str] = set()
        self.bad_publishes: list[str] = []
        self.pulls_503 = 0
        self.bad_other: list[str] = []
        self.lost_leases = 0
        self.killed_at = float("inf")  # (set when the node is killed)
        self.n = 0

    def publish(self) -> None:
        body = f"h{self.n:04d}"
        self.n += 1
        r = requests.post(
            f"{self.url}/v1/queue/{self.queue}/messages",
            json={"body": body, "persistent": True},
            timeout=HTTP_TIMEOUT + 30,
        )
        if r.status_code == 200:
            self.confirmed.append(body)
        else:
            self.bad_publishes.append(f"{body}: {r.status_code} {r.text}")
            time.sleep(0.5)

    def consume(self) -> None:
        asked_at = time.monotonic()
        r = requests.post(
            f"{self.url}/v1/queue/{self.queue}/pull",
            params={"max": 10, "wait": 1, "visibility": 15},
            timeout=HTTP_TIMEOUT + 30,
        )
        if r.status_code == 503:  # (no leader for the shard yet: nothing was taken)
            self.pulls_503 += 1
            time.sleep(min(float(r.headers.get("Retry-After", "1")), 1.0))
            return
        if r.status_code != 200:
            self.bad_other.append(f"pull: {r.status_code} {r.text}")
            time.sleep(0.5)
            return
        messages: list[dict[str, Any]] = r.json()["messages"]
        if not messages:
            return
        self.consumed |= {m["body"] for m in messages}
        r = requests.post(
            f"{self.url}/v1/ack",
            json={"receipts": [m["receipt"] for m in messages]},
            timeout=HTTP_TIMEOUT + 30,
        )
        if (
            r.status_code == 404
            and "unknown or expired lease" in r.text
            and asked_at < self.killed_at
        ):
            self.lost_leases += 1  # (leased by the killed leader: they come again)
        elif r.status_code != 200:
            self.bad_other.append(f"ack: {r.status_code} {r.text}")


class AmqpClient:
    """A publisher with confirms on one connection, a consumer with acks on another."""

    def __init__(self, port: int, queue: str) -> None:
        params = pika.ConnectionParameters(
            "127.0.0.1", port, heartbeat=0, socket_timeout=10, blocked_connection_timeout=120
        )
        self.queue = queue
        self.pub = pika.BlockingConnection(params)
        self.pub_ch = self.pub.channel()
        self.pub_ch.queue_declare(queue, durable=True)
        self.pub_ch.confirm_delivery()
        self.sub = pika.BlockingConnection(params)
        self.sub_ch = self.sub.channel()
        self.sub_ch.basic_qos(prefetch_count=10)
        self.sub_ch.basic_consume(queue, self._on_message)
        self.confirmed: list[str] = []
        self.consumed: set[str] = set()
        self.redelivered: set[str] = set()
        self.n = 0

    def publish(self) -> None:
        body = f"a{self.n:04d}"
        self.n += 1
        # (raises if the frontend nacks it, or closes the connection)
        self.pub_ch.basic_publish(
            "", self.queue, body.encode(), pika.BasicProperties(delivery_mode=2)
        )
        self.confirmed.append(body)

    def consume(self) -> None:
        self.sub.process_data_events(time_limit=0.2)

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        text = body.decode()
        if method.redelivered:
            self.redelivered.add(text)
        self.consumed.add(text)
        ch.basic_ack(method.delivery_tag)

    def close(self) -> None:
        for conn in (self.pub, self.sub):
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass


def wait_for(check: Callable[[], bool], what: Callable[[], str], workers: list[Worker]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        for w in workers:
            assert w.error is None, f"{w.name} failed: {w.error!r}"
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def test_http_and_amqp_clients_see_only_a_delay_when_the_linked_core_node_dies(
    cluster: Cluster, tmp_path: Path
) -> None:
    leaders = cluster.wait_formed(timeout=60)
    victim = leaders[0]
    others = cluster.others(victim)
    given = ",".join(core(n) for n in [victim, *others])
    qh = cluster.queue_in_shard(0, "fh")
    qa = cluster.queue_in_shard(0, "fa")
    with (
        PolymqProcess("http", tmp_path / "http", "--core", given) as http,
        PolymqProcess("amqp", tmp_path / "amqp", "--core", given) as amqp,
    ):
        ready = requests.get(f"{http.url()}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert ready.json()["core"] == core(victim)  # (the first address: node 1's)
        hc = HttpClient(http.url(), qh)
        ac = AmqpClient(amqp.ports["amqp"], qa)
        workers = [
            Worker("http publisher", hc.publish),
            Worker("http consumer", hc.consume),
            Worker("amqp publisher", ac.publish),
            Worker("amqp consumer", ac.consume),
        ]
        try:
            for w in workers:
                w.start()
            wait_for(
                lambda: (
                    len(hc.confirmed) >= BEFORE
                    and len(ac.confirmed) >= BEFORE
                    and bool(hc.consumed)
                    and bool(ac.consumed)
                ),
                lambda: (
                    f"before the kill: http {hc.confirmed} {hc.consumed} {hc.bad_publishes}"
                    f" {hc.bad_other}; amqp {ac.confirmed} {ac.consumed}"
                ),
                workers,
            )
            h0, a0 = len(hc.confirmed), len(ac.confirmed)
            cluster.kill(victim)
            killed_at = hc.killed_at = time.monotonic()
            wait_for(
                lambda: len(hc.confirmed) >= h0 + AFTER and len(ac.confirmed) >= a0 + AFTER,
                lambda: (
                    f"publishers stalled after the kill: http {len(hc.confirmed) - h0} "
                    f"({hc.bad_publishes}), amqp {len(ac.confirmed) - a0}\n{http.log()[-3000:]}"
                    f"\n{amqp.log()[-3000:]}"
                ),
                workers,
            )
            workers[0].stop.set()
            workers[2].stop.set()
            wait_for(
                lambda: set(hc.confirmed) <= hc.consumed and set(ac.confirmed) <= ac.consumed,
                lambda: (
                    f"not consumed: http {sorted(set(hc.confirmed) - hc.consumed)}, amqp "
                    f"{sorted(set(ac.confirmed) - ac.consumed)}\n{http.log()[-3000:]}"
                    f"\n{amqp.log()[-3000:]}"
                ),
                workers,
            )
            took = time.monotonic() - killed_at
        finally:
            for w in workers:
                w.stop.set()
            for w in workers:
                w.join(timeout=WAIT)
            ac.close()
        for w in workers:
            assert w.error is None, f"{w.name} failed: {w.error!r}"
        assert not hc.bad_publishes, hc.bad_publishes  # every publish answered 200
        assert not hc.bad_other, hc.bad_other
        # the links failed over (no session was ended): the frontends say so in their logs
        assert "failed over to" in http.log(), http.log()[-3000:]
        assert "failed over to" in amqp.log(), amqp.log()[-3000:]
        now = requests.get(f"{http.url()}/readyz", timeout=30).json()["core"]
        assert now in {core(n) for n in others}, now
        print(
            f"\nhttp: {len(hc.confirmed)} confirmed, all consumed; {hc.pulls_503} pulls "
            f"answered 503, {hc.lost_leases} acks of leases lost with the leader; amqp: "
            f"{len(ac.confirmed)} confirmed, all consumed, {len(ac.redelivered)} redelivered; "
            f"{took:.1f} s after the kill"
        )
