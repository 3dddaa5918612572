"""The frontends ride through the loss of the core node their link uses: an HTTP, an AMQP
and a STOMP frontend, each a process of its own given every core address (``--core
N1,N2,N3``), are connected to node 1, which also leads the shard of the queues used.
Through them an HTTP client publishes persistent messages one request at a time and pulls
and acks them; an AMQP client publishes with publisher confirms on one connection and
consumes with acks on another; a STOMP client SENDs with receipts on one connection and
consumes with client-individual acks on another. Node 1 is killed (``kill -9``) halfway.
Each frontend's core link fails over to a survivor, subscribes the consumers again and
sends the unanswered requests again (the publishes with their batch ids): every HTTP
publish is answered 200 (none fails; they wait for the election), the AMQP and STOMP
connections stay open and every publish is confirmed (receipted), and every confirmed
message is consumed (at least once: what was delivered before the kill and not yet
acknowledged comes again, flagged redelivered). A pull may be answered 503 while the
queue's shard has no leader (the client tries again after ``Retry-After``), as before, and
an ack of a lease pulled before the kill may be answered 404 "unknown or expired lease"
(the killed leader held it; the message comes again), as for an expired lease. On the code
before, the AMQP connections were closed ``CONNECTION_FORCED``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pika
import pytest
import requests

from ..procs import PolymqProcess
from .harness import HTTP_TIMEOUT, Cluster, Node, StompConn

pytestmark = pytest.mark.timeout(240)

BEFORE = 15  # confirmed publishes (of each client) before the kill
AFTER = 15  # confirmed publishes begun after the kill
WAIT = 60.0  # seconds for anything that takes a failover (a JetStream election is 4-9 s)


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


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


class StompClient:
    """SENDs with a receipt, each awaited, on one connection; a client-individual
    subscription acking what comes, on another."""

    def __init__(self, proc: PolymqProcess, queue: str) -> None:
        where = cast(Node, SimpleNamespace(ports=proc.ports, id="the STOMP frontend"))
        self.destination = f"/queue/{queue}"
        self.pub = StompConn(where).connect()
        self.sub = StompConn(where).connect()
        self.sub.subscribe(self.destination, ack="client-individual")
        self.confirmed: list[str] = []
        self.consumed: set[str] = set()
        self.redelivered: set[str] = set()
        self.seen = 0
        self.n = 0

    def publish(self) -> None:
        body = f"s{self.n:04d}"
        self.n += 1
        receipt = self.pub.send(self.destination, body, persistent="true")
        got = self.pub.outcome(receipt, HTTP_TIMEOUT + 30)
        assert got == "receipt", f"SEND {body}: {got} {self.pub.errors}"
        self.confirmed.append(body)

    def consume(self) -> None:
        sub = self.sub
        sub.wait(lambda: len(sub.messages) > self.seen or sub.disconnected or bool(sub.errors), 0.2)
        assert not (sub.disconnected or sub.errors), f"the subscriber was closed: {sub.errors}"
        with sub._cond:
            new, self.seen = sub.messages[self.seen :], len(sub.messages)
        for frame in new:
            if frame.headers.get("redelivered") == "true":
                self.redelivered.add(frame.body)
            self.consumed.add(frame.body)
            sub.conn.ack(frame.headers["ack"])

    def close(self) -> None:
        self.pub.close()
        self.sub.close()


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
    qs = cluster.queue_in_shard(0, "fs")
    with (
        PolymqProcess("http", tmp_path / "http", "--core", given) as http,
        PolymqProcess("amqp", tmp_path / "amqp", "--core", given) as amqp,
        PolymqProcess("stomp", tmp_path / "stomp", "--core", given) as stomp,
    ):
        ready = requests.get(f"{http.url()}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert ready.json()["core"] == core(victim)  # (the first address: node 1's)
        hc = HttpClient(http.url(), qh)
        ac = AmqpClient(amqp.ports["amqp"], qa)
        sc = StompClient(stomp, qs)
        clients: list[HttpClient | AmqpClient | StompClient] = [hc, ac, sc]
        publishers = [Worker(f"{type(c).__name__} publisher", c.publish) for c in clients]
        consumers = [Worker(f"{type(c).__name__} consumer", c.consume) for c in clients]
        workers = publishers + consumers

        def logs() -> str:
            return "\n".join(p.log()[-2000:] for p in (http, amqp, stomp))

        try:
            for w in workers:
                w.start()
            wait_for(
                lambda: all(len(c.confirmed) >= BEFORE and c.consumed for c in clients),
                lambda: f"before the kill: {[(c.confirmed, c.consumed) for c in clients]}",
                workers,
            )
            before = [len(c.confirmed) for c in clients]
            cluster.kill(victim)
            killed_at = hc.killed_at = time.monotonic()
            wait_for(
                lambda: all(
                    len(c.confirmed) >= n + AFTER for c, n in zip(clients, before, strict=True)
                ),
                lambda: (
                    "publishers stalled after the kill: "
                    f"{[len(c.confirmed) - n for c, n in zip(clients, before, strict=True)]} "
                    f"({hc.bad_publishes})\n{logs()}"
                ),
                workers,
            )
            for w in publishers:
                w.stop.set()
            wait_for(
                lambda: all(set(c.confirmed) <= c.consumed for c in clients),
                lambda: (
                    f"not consumed: {[sorted(set(c.confirmed) - c.consumed) for c in clients]}"
                    f"\n{logs()}"
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
            sc.close()
        for w in workers:
            assert w.error is None, f"{w.name} failed: {w.error!r}"
        assert not hc.bad_publishes, hc.bad_publishes  # every publish answered 200
        assert not hc.bad_other, hc.bad_other
        # the links failed over (no session was ended): the frontends say so in their logs
        for proc in (http, amqp, stomp):
            assert "failed over to" in proc.log(), proc.log()[-3000:]
        now = requests.get(f"{http.url()}/readyz", timeout=30).json()["core"]
        assert now in {core(n) for n in others}, now
        print(
            f"\nhttp: {len(hc.confirmed)} confirmed, all consumed; {hc.pulls_503} pulls "
            f"answered 503, {hc.lost_leases} acks of leases lost with the leader; amqp: "
            f"{len(ac.confirmed)} confirmed, all consumed, {len(ac.redelivered)} redelivered; "
            f"stomp: {len(sc.confirmed)} confirmed, all consumed, {len(sc.redelivered)} "
            f"redelivered; {took:.1f} s after the kill"
        )
