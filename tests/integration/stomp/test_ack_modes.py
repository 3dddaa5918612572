"""The ack modes (auto, client, client-individual), the prefetch window (ocamlmq's
``prefetch`` and RabbitMQ's ``prefetch-count``) and ``ack-timeout`` redelivery, with stomp.py
over TCP and over WebSocket against ``polymq run``. What the core holds is read from the HTTP
frontend's stats (``messages`` ready, ``in_flight`` delivered and unacknowledged)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from ...procs import PolymqProcess
from .helpers import (
    Clients,
    Frames,
    StompClient,
    clients,
    core_stats,
    drop,
    nothing_more,
    unique,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(run_stomp: PolymqProcess, transport: str) -> Iterator[Clients]:
    with clients(run_stomp, transport) as make:
        yield make


def fill(client: Clients, q: str, n: int) -> list[str]:
    producer = client()
    bodies = [f"m{i}" for i in range(n)]
    for body in bodies:
        producer.send_receipted(q, body)
    return bodies


def test_auto_ack_needs_no_ack(client: Clients, run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    bodies = fill(client, q, 3)
    c = client()
    c.subscribe(q, ack="auto")
    msgs = c.listener.wait_messages(3)
    assert [m.body for m in msgs] == bodies
    assert all("ack" not in m.headers for m in msgs)  # nothing to acknowledge
    wait_for(lambda: core_stats(run_stomp, q)["in_flight"] == 0)
    drop(c)  # gone without a word: nothing comes back
    other = client()
    other.subscribe(q)
    nothing_more(other.listener, 0)
    assert core_stats(run_stomp, q)["messages"] == 0


def test_client_ack_is_cumulative(client: Clients, run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    bodies = fill(client, q, 5)
    c = client()
    c.subscribe(q, ack="client")
    msgs = c.listener.wait_messages(5)
    assert [m.body for m in msgs] == bodies
    c.conn.ack(msgs[2].headers["ack"], receipt="third")  # acks the first three
    c.listener.wait_receipt("third")
    assert core_stats(run_stomp, q)["in_flight"] == 2
    drop(c)  # the connection drops: the rest goes back to the queue
    other = client()
    other.subscribe(q, ack="client-individual")
    again = other.listener.wait_messages(2)
    assert [m.body for m in again] == ["m3", "m4"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    nothing_more(other.listener, 2)


def test_client_ack_of_an_already_covered_message_is_an_error(client: Clients) -> None:
    q = f"/queue/{unique()}"
    fill(client, q, 3)
    c = client()
    c.subscribe(q, ack="client")
    msgs = c.listener.wait_messages(3)
    c.conn.ack(msgs[2].headers["ack"], receipt="all")
    c.listener.wait_receipt("all")
    c.conn.ack(msgs[0].headers["ack"])  # covered by the cumulative ACK
    error = c.listener.wait_error()
    assert error.headers["message"] == "Invalid header"


def test_client_individual_ack_names_one_message(client: Clients, run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    fill(client, q, 3)
    c = client()
    c.subscribe(q, ack="client-individual")
    msgs = c.listener.wait_messages(3)
    c.conn.ack(msgs[1].headers["ack"], receipt="middle")  # only the middle one
    c.listener.wait_receipt("middle")
    assert core_stats(run_stomp, q)["in_flight"] == 2
    drop(c)
    other = client()
    other.subscribe(q, ack="client-individual")
    again = other.listener.wait_messages(2)
    assert [m.body for m in again] == ["m0", "m2"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    nothing_more(other.listener, 2)


def test_auto_and_client_subscriptions_on_one_connection(client: Clients) -> None:
    """Ack modes are per subscription: an ACK for one never touches another."""
    qa, qc = f"/queue/{unique()}", f"/queue/{unique()}"
    c = client()
    c.subscribe(qa, sid="a", ack="auto")
    c.subscribe(qc, sid="c", ack="client")
    c.send_receipted(qa, "auto")
    c.send_receipted(qc, "client")
    msgs = {m.headers["subscription"]: m for m in c.listener.wait_messages(2)}
    assert "ack" not in msgs["a"].headers
    c.conn.ack(msgs["c"].headers["ack"], receipt="ok")
    c.listener.wait_receipt("ok")
    assert not c.listener.errors


# ---- prefetch ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "mode"),
    [
        ("prefetch-count", "client-individual"),
        ("prefetch", "client-individual"),
        ("prefetch-count", "client"),
        ("prefetch", "client"),
    ],
)
def test_prefetch_bounds_unacknowledged_deliveries(
    client: Clients, run_stomp: PolymqProcess, header: str, mode: str
) -> None:
    q = f"/queue/{unique()}"
    fill(client, q, 10)
    c = client()
    c.subscribe(q, ack=mode, **{header: "3"})
    msgs = c.listener.wait_messages(3)
    nothing_more(c.listener, 3)
    stats = core_stats(run_stomp, q)
    assert (stats["in_flight"], stats["messages"]) == (3, 7)
    # acknowledging frees as many places as it acknowledges (cumulative in client mode)
    c.conn.ack(msgs[1].headers["ack"], receipt="acked")
    c.listener.wait_receipt("acked")
    freed = 2 if mode == "client" else 1
    more = c.listener.wait_messages(3 + freed)
    assert [m.body for m in more] == [f"m{i}" for i in range(3 + freed)]
    nothing_more(c.listener, 3 + freed)
    assert core_stats(run_stomp, q)["in_flight"] == 3


def test_prefetch_shares_a_queue_between_consumers(client: Clients) -> None:
    q = f"/queue/{unique()}"
    fill(client, q, 4)
    a, b = client(), client()
    a.subscribe(q, ack="client-individual", **{"prefetch-count": "1"})
    b.subscribe(q, ack="client-individual", **{"prefetch-count": "1"})
    [ma] = a.listener.wait_messages(1)
    [mb] = b.listener.wait_messages(1)
    assert {ma.body, mb.body} == {"m0", "m1"}
    nothing_more(a.listener, 1)
    nothing_more(b.listener, 1, wait=0)
    a.conn.ack(ma.headers["ack"])
    assert a.listener.wait_messages(2)[1].body == "m2"


# ---- ack-timeout ---------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["subscribe", "send"])
def test_ack_timeout_redelivers_to_another_subscriber(client: Clients, where: str) -> None:
    q = f"/queue/{unique()}"
    slow, other, producer = client(), client(), client()
    timeout = {"ack-timeout": "1"}
    slow.subscribe(
        q,
        ack="client-individual",
        **{"prefetch-count": "1"},
        **(timeout if where == "subscribe" else {}),
    )
    producer.send_receipted(q, "hot potato", **(timeout if where == "send" else {}))
    [first] = slow.listener.wait_messages(1)
    received = time.monotonic()
    other.subscribe(q, ack="client-individual", **{"prefetch-count": "1"})
    [again] = other.listener.wait_messages(1, timeout=10)
    waited = time.monotonic() - received
    assert again.body == "hot potato"
    assert again.headers["redelivered"] == "true"
    assert again.headers["message-id"] == first.headers["message-id"]
    assert 0.5 < waited < 8, waited  # after the timeout, not at once
    other.conn.ack(again.headers["ack"], receipt="done")
    other.listener.wait_receipt("done")
    nothing_more(slow.listener, 1)


def test_client_nack_is_cumulative(client: Clients, run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    bodies = fill(client, q, 4)
    c = client()
    c.subscribe(q, ack="client")
    msgs = c.listener.wait_messages(4)
    c.conn.nack(msgs[2].headers["ack"], receipt="nacked")  # the first three go back
    c.listener.wait_receipt("nacked")
    again = c.listener.wait_messages(7)[4:]
    assert [m.body for m in again] == bodies[:3]
    assert all(m.headers["redelivered"] == "true" for m in again)
    nothing_more(c.listener, 7)
    assert core_stats(run_stomp, q)["in_flight"] == 4  # m3, and the three again


def test_nack_without_requeue_drops_the_message(client: Clients, run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    fill(client, q, 2)
    c = client()
    c.subscribe(q, ack="client-individual")
    first, second = c.listener.wait_messages(2)
    c.conn.nack(first.headers["ack"], receipt="dropped", requeue="false")
    c.conn.nack(second.headers["ack"], receipt="requeued", requeue="true")
    c.listener.wait_receipt("dropped")
    c.listener.wait_receipt("requeued")
    [again] = c.listener.wait_messages(3)[2:]
    assert again.body == "m1"
    nothing_more(c.listener, 3)


def test_unsubscribe_returns_unacknowledged_messages(
    client: Clients, run_stomp: PolymqProcess
) -> None:
    q = f"/queue/{unique()}"
    fill(client, q, 2)
    c = client()
    c.subscribe(q, sid="x", ack="client-individual")
    c.listener.wait_messages(2)
    c.conn.unsubscribe("x", headers={"receipt": "gone"})
    c.listener.wait_receipt("gone")
    stats = core_stats(run_stomp, q)
    assert (stats["messages"], stats["in_flight"]) == (2, 0)
    other = client()
    other.subscribe(q)
    again = other.listener.wait_messages(2)
    assert [(m.body, m.headers["redelivered"]) for m in again] == [
        ("m0", "true"),
        ("m1", "true"),
    ]


# ---- topics: the window is the slow-consumer bound ----------------------------------------
def test_topic_window_with_drop_policy_drops_the_excess(client: Clients) -> None:
    t = f"/topic/{unique()}"
    c, producer = client(), client()
    c.subscribe(t, ack="client-individual", **{"prefetch-count": "2", "x-slow-policy": "drop"})
    for i in range(4):
        producer.send_receipted(t, f"m{i}")
    first = c.listener.wait_messages(2)
    nothing_more(c.listener, 2)  # m2 and m3 found the window full: dropped for this client
    c.conn.ack(first[0].headers["ack"], receipt="acked")
    c.listener.wait_receipt("acked")
    producer.send_receipted(t, "m4")
    assert c.listener.wait_messages(3)[2].body == "m4"
    assert not c.listener.errors


def test_topic_window_with_disconnect_policy_is_an_error(client: Clients) -> None:
    """With polymq's x-slow-policy the window bounds a plain topic subscription; without it
    a window makes a flow-controlled one (test_rabbitmq_compat.py)."""
    t = f"/topic/{unique()}"
    c, producer = client(), client()
    c.subscribe(t, ack="client", **{"prefetch-count": "2", "x-slow-policy": "disconnect"})
    for i in range(3):
        producer.send_receipted(t, f"m{i}")
    error = c.listener.wait_error()
    assert error.headers["message"] == "slow consumer"
    assert "the window is 2" in error.body
    assert c.listener.disconnected.wait(10)


# ---- no loss, no duplicates ----------------------------------------------------------------
class Settler(Frames):
    """Acks what it receives, except that it NACKs the first delivery of every fifth message
    (which must then come again, to someone)."""

    def __init__(self, conn: Any) -> None:
        super().__init__()
        self.conn = conn
        self.acked: list[str] = []

    def on_message(self, frame: Any) -> None:
        body = frame.body
        if int(body[1:]) % 5 == 0 and frame.headers["redelivered"] == "false":
            self.conn.nack(frame.headers["ack"])
        else:
            self.conn.ack(frame.headers["ack"])
            with self._cond:
                self.acked.append(body)
        super().on_message(frame)


def test_competing_consumers_with_nacks_lose_nothing(
    run_stomp: PolymqProcess, client: Clients
) -> None:
    q = f"/queue/{unique()}"
    n = 300
    consumers = []
    for transport in ("tcp", "ws", "tcp"):
        c = StompClient(run_stomp, transport)
        c.listener = Settler(c.conn)
        c.conn.set_listener("frames", c.listener)
        c.connect()
        c.subscribe(q, ack="client-individual", **{"prefetch-count": "7"})
        consumers.append(c)
    try:
        producer = client()
        for i in range(n):
            producer.conn.send(q, f"m{i}")
        producer.send_receipted(q, "m-1")  # the last, receipted: every SEND before is in
        total = n + 1

        def acked() -> list[str]:
            return [b for c in consumers for b in c.listener.acked]

        wait_for(lambda: len(acked()) >= total, timeout=30)
        time.sleep(0.3)
        assert sorted(acked()) == sorted([f"m{i}" for i in range(-1, n)])  # each exactly once
        assert all(len(c.listener.acked) > 0 for c in consumers)  # all three took part
        stats = core_stats(run_stomp, q)
        assert (stats["messages"], stats["in_flight"]) == (0, 0)
    finally:
        for c in consumers:
            c.close()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_a_redelivery_after_a_cumulative_ack_can_still_be_acked(
    run_stomp: PolymqProcess, version: str
) -> None:
    """``client`` mode: m0 times out (its own ``ack-timeout``) and comes again, after m1.
    ACKing m1 covers the first delivery of m0 but not its redelivery, which the client then
    ACKs: in STOMP 1.0 and 1.1 by the same message-id as the first delivery."""
    q = f"/queue/{unique()}"
    with clients(run_stomp, "tcp") as make:
        c = make(version)
        c.subscribe(q, ack="client")
        c.send_receipted(q, "m0", **{"ack-timeout": "0.5"})
        c.send_receipted(q, "m1")
        first, m1, again = c.listener.wait_messages(3)
        assert [first.body, m1.body, again.body] == ["m0", "m1", "m0"]
        assert again.headers["redelivered"] == "true"

        def ack(msg: Any, receipt: str) -> None:
            if version == "1.0":
                c.conn.ack(msg.headers["message-id"], receipt=receipt)
            elif version == "1.1":
                c.conn.ack(msg.headers["message-id"], "s", receipt=receipt)
            else:
                c.conn.ack(msg.headers["ack"], receipt=receipt)

        ack(m1, "m1")
        c.listener.wait_receipt("m1")
        ack(again, "again")
        c.listener.wait(lambda: "again" in c.listener.receipts or bool(c.listener.errors))
        assert not c.listener.errors, c.listener.errors[0].body
        stats = core_stats(run_stomp, q)
        assert (stats["messages"], stats["in_flight"]) == (0, 0)
