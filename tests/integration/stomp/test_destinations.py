"""Destinations and what they hold, with stomp.py over TCP and WebSocket: priorities,
ocamlmq's control destinations, ``/queue``, ``/topic`` with patterns, ``/stream`` with
``x-stream-offset``, ``/temp-queue`` with ``reply-to``, RabbitMQ's ``/amq/queue`` and
``/exchange/amq.topic``, and persistent SENDs that survive a ``kill -9``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from ...procs import PolymqProcess
from .helpers import (
    WAIT,
    Clients,
    clients,
    control,
    nothing_more,
    raw_client,
    unique,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(run_stomp: PolymqProcess, transport: str) -> Iterator[Clients]:
    with clients(run_stomp, transport) as make:
        yield make


# ---- priorities --------------------------------------------------------------------------
def test_waiting_messages_arrive_highest_priority_first(client: Clients) -> None:
    q = f"/queue/{unique()}"
    producer = client()
    sent = [(1, "a"), (9, "b"), (4, "c"), (0, "d"), (7, "e"), (9, "f"), (4, "g")]
    for priority, body in sent:
        producer.send_receipted(q, body, priority=str(priority))
    producer.send_receipted(q, "default")  # no header: priority 4
    consumer = client()
    consumer.subscribe(q)
    msgs = consumer.listener.wait_messages(len(sent) + 1)
    got = [(int(m.headers["priority"]), m.body) for m in msgs]
    # highest first; first in, first out within one priority
    assert got == [(9, "b"), (9, "f"), (7, "e"), (4, "c"), (4, "g"), (4, "default"), (1, "a"),
                   (0, "d")]  # fmt: skip


def test_priority_decides_the_next_delivery_to_a_busy_consumer(client: Clients) -> None:
    q = f"/queue/{unique()}"
    consumer, producer = client(), client()
    consumer.subscribe(q, ack="client-individual", **{"prefetch-count": "1"})
    producer.send_receipted(q, "first")
    [first] = consumer.listener.wait_messages(1)
    for priority, body in [(2, "low"), (8, "high"), (5, "mid")]:  # wait behind "first"
        producer.send_receipted(q, body, priority=str(priority))
    for n, expected in enumerate(["high", "mid", "low"], start=2):
        last = consumer.listener.messages[-1]
        consumer.conn.ack(last.headers["ack"])  # one place free: the best waiting one comes
        assert consumer.listener.wait_messages(n)[-1].body == expected
    assert first.body == "first"


# ---- expiry ----------------------------------------------------------------------------------
@pytest.mark.parametrize("header", ["expires", "expiration"])
def test_expired_messages_are_not_delivered(client: Clients, header: str) -> None:
    q = f"/queue/{unique()}"
    producer = client()
    value = str(int(time.time() * 1000) + 300) if header == "expires" else "300"
    producer.send_receipted(q, "short-lived", **{header: value})
    producer.send_receipted(q, "forever")
    time.sleep(0.6)  # the first one expires meanwhile
    consumer = client()
    consumer.subscribe(q)
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == "forever"
    nothing_more(consumer.listener, 1)


def test_expiry_is_shown_on_the_message(client: Clients) -> None:
    q = f"/queue/{unique()}"
    consumer, producer = client(), client()
    consumer.subscribe(q)
    expires = int(time.time() * 1000) + 60_000
    producer.send_receipted(q, "dated", expires=str(expires))
    [msg] = consumer.listener.wait_messages(1)
    assert abs(int(msg.headers["expires"]) - expires) <= 1


# ---- control destinations ---------------------------------------------------------------
def test_count_msgs(client: Clients) -> None:
    name = unique()
    c = client()
    assert control(c, f"/control/count-msgs/queue/{name}")["num-messages"] == "0"  # none yet
    for i in range(4):
        c.send_receipted(f"/queue/{name}", f"m{i}")
    assert control(c, f"/control/count-msgs/queue/{name}")["num-messages"] == "4"
    consumer = client()
    consumer.subscribe(f"/queue/{name}")
    consumer.listener.wait_messages(4)
    assert control(c, f"/control/count-msgs/queue/{name}")["num-messages"] == "0"


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_count_subscribers(client: Clients, kind: str) -> None:
    name = unique()
    dest = f"/{kind}/{name}"
    asker = client()
    ask = f"/control/count-subscribers/{kind}/{name}"
    assert control(asker, ask)["num-subscribers"] == "0"
    subscribers = [client() for _ in range(3)]
    for s in subscribers:
        s.subscribe(dest, sid="x")
    assert control(asker, ask)["num-subscribers"] == "3"
    subscribers[0].conn.unsubscribe("x", headers={"receipt": "gone"})
    subscribers[0].listener.wait_receipt("gone")
    assert control(asker, ask)["num-subscribers"] == "2"
    subscribers[1].conn.disconnect(receipt="bye")
    subscribers[1].listener.wait_receipt("bye")
    assert control(asker, ask)["num-subscribers"] == "1"


def test_control_send_without_receipt_publishes_nothing(client: Clients) -> None:
    name = unique()
    c = client()
    c.conn.send(f"/control/count-msgs/queue/{name}", "ignored")
    assert control(c, f"/control/count-msgs/queue/{name}")["num-messages"] == "0"
    assert not c.listener.errors


# ---- queues and topics --------------------------------------------------------------------
def test_topic_patterns(client: Clients) -> None:
    base = unique()
    star, hash_, exact, producer = client(), client(), client(), client()
    star.subscribe(f"/topic/{base}.*")
    hash_.subscribe(f"/topic/{base}.#")
    exact.subscribe(f"/topic/{base}.a.b")
    for key in ("a", "a.b", "", "x.y.z"):
        producer.send_receipted(f"/topic/{base}{'.' + key if key else ''}", key or "root")
    producer.send_receipted(f"/topic/other{base}.a", "elsewhere")
    assert star.listener.wait_messages(1)[0].body == "a"
    assert sorted(m.body for m in hash_.listener.wait_messages(4)) == sorted(
        ["a", "a.b", "root", "x.y.z"]
    )
    [m] = exact.listener.wait_messages(1)
    assert (m.body, m.headers["destination"]) == ("a.b", f"/topic/{base}.a.b")
    assert [m.headers["destination"] for m in star.listener.messages] == [f"/topic/{base}.a"]
    nothing_more(star.listener, 1)
    nothing_more(hash_.listener, 4, wait=0)
    nothing_more(exact.listener, 1, wait=0)


def test_topics_keep_nothing_for_late_subscribers(client: Clients) -> None:
    t = f"/topic/{unique()}"
    producer = client()
    producer.send_receipted(t, "nobody listens")
    late = client()
    late.subscribe(t)
    producer.send_receipted(t, "now")
    assert late.listener.wait_messages(1)[0].body == "now"
    nothing_more(late.listener, 1)


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        ("first", ["e0", "e1", "e2", "new"]),
        ("last", ["e2", "new"]),
        ("next", ["new"]),
        ("2", ["e1", "e2", "new"]),
        ("offset=3", ["e2", "new"]),
    ],
)
def test_stream_offsets(client: Clients, offset: str, expected: list[str]) -> None:
    s = f"/stream/{unique()}"
    producer = client()
    for i in range(3):
        producer.send_receipted(s, f"e{i}")
    reader = client()
    reader.subscribe(s, **{"x-stream-offset": offset})
    producer.send_receipted(s, "new")
    msgs = reader.listener.wait_messages(len(expected))
    assert [m.body for m in msgs] == expected
    nothing_more(reader.listener, len(expected))


def test_temp_queue_request_reply(client: Clients) -> None:
    service_q = f"/queue/{unique()}"
    server, caller, stranger = client(), client(), client()
    server.subscribe(service_q)
    caller.send_receipted(
        service_q, "ping", **{"reply-to": "/temp-queue/answers", "correlation-id": "c-42"}
    )
    [request] = server.listener.wait_messages(1)
    assert request.headers["correlation-id"] == "c-42"
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith("/queue/")
    server.send_receipted(reply_to, "pong", **{"correlation-id": "c-42"})
    [reply] = caller.listener.wait_messages(1)
    assert (reply.body, reply.headers["correlation-id"]) == ("pong", "c-42")
    assert reply.headers["destination"] == "/temp-queue/answers"
    # another connection's /temp-queue/answers is its own queue
    stranger.send_receipted("/temp-queue/answers", "not for the caller")
    nothing_more(caller.listener, 1)


def test_temp_queue_used_directly(client: Clients) -> None:
    c = client()
    c.send_receipted("/temp-queue/box", "to myself")
    c.subscribe("/temp-queue/box")
    [m] = c.listener.wait_messages(1)
    assert (m.body, m.headers["destination"]) == ("to myself", "/temp-queue/box")


def test_temp_queue_is_deleted_with_its_connection(
    client: Clients, run_stomp: PolymqProcess
) -> None:
    service_q = f"/queue/{unique()}"
    server, caller = client(), client()
    server.subscribe(service_q)
    caller.send_receipted(service_q, "ping", **{"reply-to": "/temp-queue/r"})
    reply_to = server.listener.wait_messages(1)[0].headers["reply-to"]
    name = reply_to.removeprefix("/queue/")
    # (its own connection may ask; another may not even read its stats: test_reserved.py)
    assert control(caller, f"/control/count-subscribers/queue/{name}")["num-subscribers"] == "1"
    url = f"{run_stomp.url('admin')}/api/destinations/queue/{name}"  # (the operator's view)
    assert requests.get(url, timeout=WAIT).status_code == 200
    caller.conn.disconnect(receipt="bye")
    caller.listener.wait_receipt("bye")
    wait_for(lambda: requests.get(url, timeout=WAIT).status_code == 404)


def test_amq_queue_is_the_same_queue(client: Clients) -> None:
    name = unique()
    producer, consumer = client(), client()
    producer.send_receipted(f"/amq/queue/{name}", "via amq")
    producer.send_receipted(f"/queue/{name}", "via queue")
    consumer.subscribe(f"/queue/{name}")
    msgs = consumer.listener.wait_messages(2)
    assert [m.body for m in msgs] == ["via amq", "via queue"]
    assert {m.headers["destination"] for m in msgs} == {f"/queue/{name}"}
    other = client()
    other.subscribe(f"/amq/queue/{name}")
    producer.send_receipted(f"/queue/{name}", "plain")
    [m] = other.listener.wait_messages(1)
    assert (m.body, m.headers["destination"]) == ("plain", f"/amq/queue/{name}")


def test_exchange_amq_topic_is_the_topic(client: Clients) -> None:
    base = unique()
    rabbit, plain, producer = client(), client(), client()
    rabbit.subscribe(f"/exchange/amq.topic/{base}.*")
    plain.subscribe(f"/topic/{base}.#")
    producer.send_receipted(f"/topic/{base}.k", "from /topic")
    producer.send_receipted(f"/exchange/amq.topic/{base}.j", "from /exchange")
    got = {m.body: m.headers["destination"] for m in rabbit.listener.wait_messages(2)}
    assert got == {  # as RabbitMQ names amq.topic's messages
        "from /topic": f"/topic/{base}.k",
        "from /exchange": f"/topic/{base}.j",
    }
    got = {m.body: m.headers["destination"] for m in plain.listener.wait_messages(2)}
    assert got == {"from /topic": f"/topic/{base}.k", "from /exchange": f"/topic/{base}.j"}


# ---- durability ---------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_receipted_persistent_sends_survive_kill_9(tmp_path: Path) -> None:
    """A RECEIPT for a persistent SEND means durable: SIGKILL the whole ``polymq run`` (core
    included) right after the receipts, start it again on the same data directory."""
    workdir = tmp_path / "run"
    q = f"/queue/{unique()}"
    sent: list[str] = []
    with PolymqProcess("run", workdir) as proc:
        for transport in ("tcp", "ws"):
            with clients(proc, transport) as make:
                c = make()
                receipts = []
                for i in range(20):
                    body = f"{transport}-{i}"
                    receipts.append(f"r{i}")
                    c.conn.send(q, body, headers={"persistent": "true", "receipt": f"r{i}"})
                    sent.append(body)
                for r in receipts:
                    c.listener.wait_receipt(r)
                if transport == "ws":
                    proc.kill()  # at once, the WebSocket client still connected
    with PolymqProcess("run", workdir) as again, clients(again, "tcp") as make:
        c = make()
        assert control(c, f"/control/count-msgs{q}")["num-messages"] == str(len(sent))
        c.subscribe(q)
        msgs = c.listener.wait_messages(len(sent))
        assert [m.body for m in msgs] == sent
        assert all(m.headers["persistent"] == "true" for m in msgs)


@pytest.mark.timeout(90)
def test_receipted_persistent_sends_survive_a_core_kill_9(tmp_path: Path) -> None:
    """``polymq core`` and ``polymq stomp`` apart: SIGKILL the core after the receipts; the
    frontend tells its subscribers (ERROR), refuses CONNECTs while the core is away, and once
    the core is back on its port every receipted message is there, through the same frontend
    and even through a producer connection that outlived the outage."""
    q = f"/queue/{unique()}"
    core = PolymqProcess("core", tmp_path / "core").start()
    port = core.ports["core"]
    with PolymqProcess("stomp", tmp_path / "fe", "--core", f"127.0.0.1:{port}") as fe:
        try:
            with clients(fe, "tcp") as tcp, clients(fe, "ws") as ws:
                producer, subscriber = tcp(), ws()
                subscriber.subscribe(f"/queue/{unique()}")
                for i in range(20):
                    producer.conn.send(
                        q, f"m{i}", headers={"persistent": "true", "receipt": f"r{i}"}
                    )
                for i in range(20):
                    producer.listener.wait_receipt(f"r{i}")
                core.kill()
                error = subscriber.listener.wait_error()
                assert error.headers["message"] == "the broker is unavailable"
                raw = raw_client(fe, "tcp")
                raw.frame("CONNECT", {"accept-version": "1.2", "host": "/"})
                assert raw.read_error()[1]["message"] == "the broker is unavailable"
                raw.close()
                core = PolymqProcess("core", tmp_path / "core", "--core-port", str(port)).start()
                wait_for(lambda: requests.get(fe.url("stomp_ws") + "/readyz", timeout=WAIT).ok)
                producer.send_receipted(q, "after", persistent="true")
                consumer = tcp()
                consumer.subscribe(q)
                msgs = consumer.listener.wait_messages(21)
                assert [m.body for m in msgs] == [f"m{i}" for i in range(20)] + ["after"]
        finally:
            core.kill()
