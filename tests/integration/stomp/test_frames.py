"""Every client frame of STOMP 1.0-1.2 against ``polymq run``, with stomp.py over TCP and
over WebSocket (and raw sockets where stomp.py cannot say it): CONNECT and STOMP with
version negotiation, login / passcode, SEND, SUBSCRIBE / UNSUBSCRIBE, ACK, NACK,
BEGIN / COMMIT / ABORT, RECEIPT for every frame that asks, DISCONNECT."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import stomp

from polymq_server.auth.provider import hash_password

from ...procs import PolymqProcess
from .helpers import (
    QUIET,
    WAIT,
    Clients,
    RawWs,
    StompClient,
    clients,
    control,
    core_stats,
    drop,
    encode,
    nothing_more,
    raw_client,
    unique,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(run_stomp: PolymqProcess, transport: str) -> Iterator[Clients]:
    """``client(**connect_headers)``: a connected stomp.py client over ``transport``."""
    with clients(run_stomp, transport) as make:
        yield make


# ---- CONNECT / STOMP --------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_py_speaks_each_version(run_stomp: PolymqProcess, version: str) -> None:
    with clients(run_stomp, "tcp") as make:
        c = make(version)
        [connected] = c.listener.connected
        assert connected.headers["version"] == version
        assert "heart-beat" in connected.headers  # 0,0 in 1.0, as RabbitMQ
        q = f"/queue/{unique()}"
        c.subscribe(q, ack="client")
        for body in ("one", "two"):
            c.send_receipted(q, body)
        msgs = c.listener.wait_messages(2)
        assert [m.body for m in msgs] == ["one", "two"]
        last = msgs[1].headers
        # each version names the message to acknowledge its own way
        if version == "1.0":
            assert "ack" not in last
            c.conn.ack(last["message-id"], receipt="acked")
        elif version == "1.1":
            assert "ack" not in last
            c.conn.ack(last["message-id"], "s", receipt="acked")
        else:
            c.conn.ack(last["ack"], receipt="acked")
        c.listener.wait_receipt("acked")
        assert not c.listener.errors
        stats = core_stats(run_stomp, q)
        assert (stats["messages"], stats["in_flight"]) == (0, 0)  # both acked (cumulative)


@pytest.mark.parametrize(
    ("command", "offered", "expected"),
    [
        ("CONNECT", None, "1.0"),
        ("CONNECT", "1.0", "1.0"),
        ("CONNECT", "1.1", "1.1"),
        ("CONNECT", "1.0,1.1", "1.1"),
        ("CONNECT", "1.2,1.0", "1.2"),
        ("STOMP", "1.1,1.2,2.0", "1.2"),
        ("STOMP", "1.1", "1.1"),
    ],
)
def test_version_negotiation_picks_the_highest_common_version(
    run_stomp: PolymqProcess, transport: str, command: str, offered: str | None, expected: str
) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        headers = {"host": "localhost"}
        if offered is not None:
            headers["accept-version"] = offered
        raw.frame(command, headers)
        got, connected, _ = raw.read_frame()
        assert got == "CONNECTED", connected
        assert connected["version"] == expected
        assert "heart-beat" in connected  # 0,0 in 1.0, as RabbitMQ
        # and the session works in that version
        q = f"/queue/{unique()}"
        raw.frame("SUBSCRIBE", {"destination": q, "id": "1", "receipt": "sub"})
        assert raw.read_frame()[:2] == ("RECEIPT", {"receipt-id": "sub"})
        raw.frame("SEND", {"destination": q}, b"negotiated")
        command_, headers_, body = raw.read_frame()
        assert (command_, headers_["destination"], body) == ("MESSAGE", q, b"negotiated")
    finally:
        raw.close()


def test_no_common_version_is_an_error_with_a_version_header(
    run_stomp: PolymqProcess, transport: str
) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        raw.frame("CONNECT", {"accept-version": "2.0,3.1", "host": "localhost"})
        command, headers, body = raw.read_frame()
        assert command == "ERROR"
        assert headers["message"] == "Version mismatch"
        assert headers["version"] == "1.0,1.1,1.2"
        assert body == b"Supported versions are 1.0,1.1,1.2\n"  # RabbitMQ's words
        assert raw.closed_by_server()
    finally:
        raw.close()


def test_connected_frame_names_version_server_and_session(client: Clients) -> None:
    c = client()
    [connected] = c.listener.connected
    assert connected.headers["version"] == "1.2"
    assert connected.headers["server"].startswith("polymq-stomp/")
    assert connected.headers["session"]


def test_login_and_passcode_are_accepted_in_anonymous_mode(client: Clients) -> None:
    c = client(username="alice", passcode="whatever")
    q = f"/queue/{unique()}"
    c.subscribe(q)
    c.send_receipted(q, "as alice")
    assert c.listener.wait_messages(1)[0].body == "as alice"


@pytest.fixture(scope="module")
def auth_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir: Path = tmp_path_factory.mktemp("stomp-auth")
    users = workdir / "users.json"
    users.write_text(
        json.dumps(
            {
                "users": {
                    "alice": {
                        "password_hash": hash_password("secret"),
                        "grants": [{"pattern": "*", "permissions": ["read", "write", "configure"]}],
                    }
                }
            }
        )
    )
    with PolymqProcess("run", workdir / "run", "--auth", f"file:{users}") as proc:
        yield proc


@pytest.mark.parametrize(
    ("login", "passcode"), [("alice", "wrong"), ("mallory", "secret"), (None, None)]
)
def test_file_auth_refuses_bad_credentials(
    auth_run: PolymqProcess, transport: str, login: str | None, passcode: str | None
) -> None:
    raw = raw_client(auth_run, transport)
    try:
        headers = {"accept-version": "1.2", "host": "localhost"}
        if login is not None:
            headers |= {"login": login, "passcode": passcode or ""}
        raw.frame("CONNECT", headers)
        command, headers, _ = raw.read_frame()
        assert (command, headers["message"]) == ("ERROR", "Bad CONNECT")
        assert raw.closed_by_server()
    finally:
        raw.close()
    # stomp.py sees the refusal too, and the right credentials get in
    refused = StompClient(auth_run, transport)
    with pytest.raises(stomp.exception.ConnectFailedException):
        refused.connect(username="alice", passcode="nope")
    refused.close()
    with clients(auth_run, transport) as make:
        c = make(username="alice", passcode="secret")
        q = f"/queue/{unique()}"
        c.subscribe(q)
        c.send_receipted(q, "logged in")
        assert c.listener.wait_messages(1)[0].body == "logged in"


# ---- SEND, SUBSCRIBE, UNSUBSCRIBE ---------------------------------------------------------
def test_no_delivery_after_unsubscribe(client: Clients, run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    consumer, producer = client(), client()
    consumer.subscribe(q, sid="mine")
    producer.send_receipted(q, "before")
    assert consumer.listener.wait_messages(1)[0].body == "before"
    consumer.conn.unsubscribe("mine", headers={"receipt": "unsub"})
    consumer.listener.wait_receipt("unsub")
    producer.send_receipted(q, "after")
    nothing_more(consumer.listener, 1)
    assert control(producer, f"/control/count-msgs{q}")["num-messages"] == "1"  # kept for others
    assert core_stats(run_stomp, q)["subscribers"] == 0


def test_topic_unsubscribe_stops_delivery(client: Clients) -> None:
    t = f"/topic/{unique()}"
    consumer, producer = client(), client()
    consumer.subscribe(t, sid="a")
    consumer.subscribe(t, sid="b")
    producer.send_receipted(t, "both")
    msgs = consumer.listener.wait_messages(2)
    assert sorted(m.headers["subscription"] for m in msgs) == ["a", "b"]
    consumer.conn.unsubscribe("a", headers={"receipt": "unsub"})
    consumer.listener.wait_receipt("unsub")
    producer.send_receipted(t, "only b")
    [third] = consumer.listener.wait_messages(3)[2:]
    assert (third.body, third.headers["subscription"]) == ("only b", "b")
    nothing_more(consumer.listener, 3)


def test_frames_split_byte_by_byte_and_pipelined(run_stomp: PolymqProcess, transport: str) -> None:
    """The frontend reassembles frames however they are cut (one byte per TCP write or per
    WebSocket message) and takes several frames in one write."""
    q = f"/queue/{unique()}"
    raw = raw_client(run_stomp, transport)
    try:
        for byte in encode("CONNECT", {"accept-version": "1.2", "host": "localhost"}):
            raw.send(bytes([byte]))
        assert raw.read_frame()[0] == "CONNECTED"
        sends = b"".join(
            encode("SEND", {"destination": q, "receipt": f"r{i}"}, f"m{i}".encode())
            for i in range(3)
        )
        raw.send(encode("SUBSCRIBE", {"destination": q, "id": "1", "receipt": "sub"}) + sends[:7])
        for i in range(7, len(sends)):
            raw.send(sends[i : i + 1])
        frames = [raw.read_frame() for _ in range(7)]
        receipts = [h["receipt-id"] for c, h, _ in frames if c == "RECEIPT"]
        bodies = [b for c, _, b in frames if c == "MESSAGE"]
        assert receipts[0] == "sub"
        assert sorted(receipts[1:]) == ["r0", "r1", "r2"]
        assert bodies == [b"m0", b"m1", b"m2"]
    finally:
        raw.close()


def test_empty_websocket_messages_carry_nothing(run_stomp: PolymqProcess) -> None:
    """An empty WebSocket message (text or binary), between frames or inside one, is no
    end of the stream: the session goes on, its subscription with it."""
    q = f"/queue/{unique()}"
    raw = RawWs(run_stomp.ports["stomp_ws"])
    try:
        raw.connect()
        raw.frame("SUBSCRIBE", {"destination": q, "id": "1", "receipt": "sub"})
        assert raw.read_frame()[1].get("receipt-id") == "sub"
        for binary in (False, True):
            raw.send_message(b"", binary=binary)
        send = encode("SEND", {"destination": q, "receipt": "r"}, b"after empty messages")
        raw.send(send[:5])
        raw.send_message(b"", binary=False)  # in the middle of a frame
        raw.send(send[5:])
        frames = [raw.read_frame() for _ in range(2)]
        assert sorted(c for c, _, _ in frames) == ["MESSAGE", "RECEIPT"]
        assert [b for c, _, b in frames if c == "MESSAGE"] == [b"after empty messages"]
        assert [h["receipt-id"] for c, h, _ in frames if c == "RECEIPT"] == ["r"]
    finally:
        raw.close()


def test_end_of_lines_between_frames_and_crlf_are_tolerated(
    run_stomp: PolymqProcess, transport: str
) -> None:
    """EOLs before CONNECT and after each NUL (as ocamlmq clients send them), and CRLF line
    endings, are accepted."""
    q = f"/queue/{unique()}"
    raw = raw_client(run_stomp, transport)
    try:
        raw.send(b"\n\r\n" + encode("CONNECT", {"accept-version": "1.2", "host": "/"}) + b"\n")
        assert raw.read_frame()[0] == "CONNECTED"
        raw.send(f"SUBSCRIBE\r\ndestination:{q}\r\nid:1\r\nreceipt:s\r\n\r\n\0\r\n".encode())
        assert raw.read_frame()[1].get("receipt-id") == "s"
        raw.send(f"SEND\r\ndestination:{q}\r\n\r\ncrlf\0\n\n".encode())
        command, headers, body = raw.read_frame()
        assert (command, headers["destination"], body) == ("MESSAGE", q, b"crlf")
    finally:
        raw.close()


# ---- ACK / NACK -----------------------------------------------------------------------------
def test_ack_settles_and_nack_redelivers(client: Clients, run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    c = client()
    c.subscribe(q, ack="client-individual")
    c.send_receipted(q, "keep")
    c.send_receipted(q, "retry")
    first, second = c.listener.wait_messages(2)
    assert (first.body, second.body) == ("keep", "retry")
    c.conn.ack(first.headers["ack"], receipt="acked")
    c.conn.nack(second.headers["ack"], receipt="nacked")
    c.listener.wait_receipt("acked")
    c.listener.wait_receipt("nacked")
    [again] = c.listener.wait_messages(3)[2:]
    assert again.body == "retry"
    assert again.headers["redelivered"] == "true"
    assert again.headers["message-id"] == second.headers["message-id"]
    assert again.headers["ack"] != second.headers["ack"]  # a new delivery, a new ack id
    c.conn.ack(again.headers["ack"], receipt="done")
    c.listener.wait_receipt("done")
    stats = core_stats(run_stomp, q)
    assert (stats["messages"], stats["in_flight"]) == (0, 0)
    nothing_more(c.listener, 3)
    assert not c.listener.errors


# ---- transactions ------------------------------------------------------------------------
def test_sends_in_a_transaction_take_effect_at_commit(client: Clients) -> None:
    q = f"/queue/{unique()}"
    consumer, producer = client(), client()
    consumer.subscribe(q)
    producer.conn.begin("tx", headers={"receipt": "begun"})
    producer.listener.wait_receipt("begun")
    for i in range(3):
        producer.conn.send(q, f"t{i}", transaction="tx", headers={"receipt": f"t{i}"})
    assert control(producer, f"/control/count-msgs{q}")["num-messages"] == "0"  # (read them)
    nothing_more(consumer.listener, 0)
    assert not {"t0", "t1", "t2"} & set(producer.listener.receipts)  # not yet
    producer.conn.commit("tx", headers={"receipt": "committed"})
    producer.listener.wait_receipt("committed")  # their receipts came at COMMIT, before its own
    assert producer.listener.receipts[-4:] == ["t0", "t1", "t2", "committed"]
    assert [m.body for m in consumer.listener.wait_messages(3)] == ["t0", "t1", "t2"]


def test_abort_discards_the_sends(client: Clients) -> None:
    q = f"/queue/{unique()}"
    consumer, producer = client(), client()
    consumer.subscribe(q)
    producer.conn.begin("tx")
    producer.conn.send(q, "aborted", transaction="tx", headers={"receipt": "never"})
    producer.conn.abort("tx", headers={"receipt": "aborted"})
    producer.listener.wait_receipt("aborted")
    assert "never" not in producer.listener.receipts  # none for an aborted SEND
    producer.send_receipted(q, "outside")
    assert consumer.listener.wait_messages(1)[0].body == "outside"
    nothing_more(consumer.listener, 1)
    assert control(producer, f"/control/count-msgs{q}")["num-messages"] == "0"
    # the name is free again, and COMMITting the aborted transaction is an error
    producer.conn.commit("tx")
    error = producer.listener.wait_error()
    assert error.headers["message"] == "Bad transaction"


def test_acks_in_a_transaction_take_effect_at_commit(
    client: Clients, run_stomp: PolymqProcess
) -> None:
    q = f"/queue/{unique()}"
    c = client()
    c.subscribe(q, ack="client-individual")
    for i in range(2):
        c.send_receipted(q, f"m{i}")
    msgs = c.listener.wait_messages(2)
    c.conn.begin("tx")
    for m in msgs:
        c.conn.ack(m.headers["ack"], "tx", receipt=f"ack-{m.body}")
        c.listener.wait_receipt(f"ack-{m.body}")  # at once, as RabbitMQ (a SEND's waits)
    assert core_stats(run_stomp, q)["in_flight"] == 2  # not acked yet
    c.conn.commit("tx", headers={"receipt": "committed"})
    c.listener.wait_receipt("committed")
    assert core_stats(run_stomp, q)["in_flight"] == 0
    drop(c)
    assert core_stats(run_stomp, q)["messages"] == 0  # nothing went back to the queue
    other = client()
    other.subscribe(q)
    nothing_more(other.listener, 0)


def test_abort_leaves_the_messages_unacknowledged(
    client: Clients, run_stomp: PolymqProcess
) -> None:
    q = f"/queue/{unique()}"
    c = client()
    c.subscribe(q, ack="client-individual")
    c.send_receipted(q, "held")
    [msg] = c.listener.wait_messages(1)
    c.conn.begin("tx")
    c.conn.ack(msg.headers["ack"], "tx")
    c.conn.abort("tx", headers={"receipt": "aborted"})
    c.listener.wait_receipt("aborted")
    assert core_stats(run_stomp, q)["in_flight"] == 1
    c.conn.disconnect(receipt="bye")  # unacknowledged: back to the queue
    c.listener.wait_receipt("bye")
    other = client()
    other.subscribe(q, ack="client-individual")
    [again] = other.listener.wait_messages(1)
    assert (again.body, again.headers["redelivered"]) == ("held", "true")


def test_an_uncommitted_transaction_dies_with_its_connection(
    client: Clients, run_stomp: PolymqProcess
) -> None:
    q, out = f"/queue/{unique()}", f"/queue/{unique()}"
    c = client()
    c.subscribe(q, ack="client-individual")
    c.send_receipted(q, "in flight")
    [msg] = c.listener.wait_messages(1)
    c.conn.begin("tx")
    c.conn.ack(msg.headers["ack"], "tx")
    c.conn.send(out, "never", transaction="tx", headers={"receipt": "never"})
    c.send_receipted(f"/queue/{unique()}", "after them")  # they were read
    assert "never" not in c.listener.receipts  # (its receipt would come at COMMIT)
    drop(c)
    other = client()
    assert control(other, f"/control/count-msgs{out}")["num-messages"] == "0"
    other.subscribe(q)
    [again] = other.listener.wait_messages(1)
    assert (again.body, again.headers["redelivered"]) == ("in flight", "true")


# ---- RECEIPT, DISCONNECT ---------------------------------------------------------------------
def test_every_frame_with_a_receipt_header_gets_its_receipt(client: Clients) -> None:
    q = f"/queue/{unique()}"
    c = client()
    conn, listener = c.conn, c.listener
    conn.subscribe(q, id="s", ack="client-individual", headers={"receipt": "SUBSCRIBE"})
    conn.send(q, "a", headers={"receipt": "SEND"})
    conn.send(q, "b")
    first, second = listener.wait_messages(2)
    conn.ack(first.headers["ack"], receipt="ACK")
    conn.nack(second.headers["ack"], receipt="NACK")
    conn.begin("t1", headers={"receipt": "BEGIN"})
    conn.send(q, "c", transaction="t1", headers={"receipt": "SEND in a transaction"})
    conn.commit("t1", headers={"receipt": "COMMIT"})
    conn.begin("t2")
    conn.abort("t2", headers={"receipt": "ABORT"})
    conn.unsubscribe("s", headers={"receipt": "UNSUBSCRIBE"})
    expected = ["SUBSCRIBE", "SEND", "ACK", "NACK", "BEGIN", "SEND in a transaction", "COMMIT"]
    expected += ["ABORT", "UNSUBSCRIBE"]
    listener.wait(lambda: len(listener.receipts) >= len(expected))
    assert sorted(listener.receipts) == sorted(expected)
    conn.disconnect(receipt="DISCONNECT")
    listener.wait_receipt("DISCONNECT")
    assert listener.disconnected.wait(WAIT)  # the server closed after the receipt
    assert listener.receipts[-1] == "DISCONNECT"
    assert not listener.errors


def test_disconnect_receipt_comes_after_every_send_was_handled(
    client: Clients, transport: str
) -> None:
    q = f"/queue/{unique()}"
    c = client()
    for i in range(50):
        c.conn.send(q, f"m{i}")  # no receipts
    c.conn.disconnect(receipt="bye")
    c.listener.wait_receipt("bye")
    assert c.listener.disconnected.wait(WAIT)
    other = client()
    assert control(other, f"/control/count-msgs{q}")["num-messages"] == "50"
    other.subscribe(q)
    assert [m.body for m in other.listener.wait_messages(50)] == [f"m{i}" for i in range(50)]


def test_raw_disconnect_with_receipt_then_close(run_stomp: PolymqProcess, transport: str) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        raw.connect()
        raw.frame("DISCONNECT", {"receipt": "77"})
        command, headers, _ = raw.read_frame()
        assert (command, headers["receipt-id"]) == ("RECEIPT", "77")
        assert raw.closed_by_server(QUIET * 10)
    finally:
        raw.close()


# ---- headers -------------------------------------------------------------------------------
def test_header_escaping_round_trips_in_stomp_12(run_stomp: PolymqProcess, transport: str) -> None:
    """Colons, newlines, carriage returns and backslashes in header names and values, escaped
    by the 1.2 rules (``\\c \\n \\r \\\\``), come back escaped the same way; a repeated
    header counts once, the first time."""
    q = f"/queue/{unique()}"
    escaped = "x-odd\\cname:a\\cb\\nc\\rd\\\\e"
    raw = raw_client(run_stomp, transport)
    try:
        raw.connect()
        raw.frame("SUBSCRIBE", {"destination": q, "id": "1", "receipt": "sub"})
        assert raw.read_frame()[0] == "RECEIPT"
        raw.send(
            f"SEND\ndestination:{q}\n{escaped}\nx-twice:first\nx-twice:second\n\nbody\0".encode()
        )
        command, headers, body = raw.read_frame()
        assert (command, body) == ("MESSAGE", b"body")
        name, _, value = escaped.partition(":")
        assert headers[name] == value  # (the raw reader does not unescape)
        assert headers["x-twice"] == "first"
    finally:
        raw.close()
    # and stomp.py (which escapes values, not names) reads back what it sent
    with clients(run_stomp, transport) as make:
        c = make()
        c.subscribe(q)
        c.send_receipted(q, "again", **{"x-odd": "a:b\nc\rd\\e"})
        [msg] = c.listener.wait_messages(1)
        assert msg.headers["x-odd"] == "a:b\nc\rd\\e"


def test_custom_headers_reach_every_stomp_version(run_stomp: PolymqProcess) -> None:
    q = f"/topic/{unique()}"
    with clients(run_stomp, "tcp") as make:
        readers = {v: make(v) for v in ("1.0", "1.1", "1.2")}
        for r in readers.values():
            r.subscribe(q)
        sender = make()
        sender.send_receipted(q, "hello", **{"x-plain": "value", "correlation-id": "c1"})
        for version, r in readers.items():
            [msg] = r.listener.wait_messages(1)
            assert msg.headers["x-plain"] == "value", version
            assert msg.headers["correlation-id"] == "c1", version
            assert msg.headers["content-length"] == "5", version


@pytest.mark.parametrize("disconnect_receipt", [True, False])
def test_pipelined_frames_get_every_receipt_before_the_close(
    run_stomp: PolymqProcess, transport: str, disconnect_receipt: bool
) -> None:
    """ACK, SEND, UNSUBSCRIBE, BEGIN, COMMIT and DISCONNECT in one write: every receipt comes,
    the DISCONNECT's last, then the close."""
    q = f"/queue/{unique()}"
    raw = raw_client(run_stomp, transport)
    try:
        raw.connect()
        raw.frame("SUBSCRIBE", {"destination": q, "id": "1", "ack": "client-individual"})
        raw.frame("SEND", {"destination": q}, b"first")
        command, headers, _ = raw.read_frame()
        assert command == "MESSAGE"
        frames = [
            encode("ACK", {"id": headers["ack"], "receipt": "ack"}),
            encode("SEND", {"destination": q, "receipt": "send"}, b"second"),
            encode("UNSUBSCRIBE", {"id": "1", "receipt": "unsubscribe"}),
            encode("BEGIN", {"transaction": "t", "receipt": "begin"}),
            encode("SEND", {"destination": q, "transaction": "t"}, b"third"),
            encode("COMMIT", {"transaction": "t", "receipt": "commit"}),
            encode("DISCONNECT", {"receipt": "bye"} if disconnect_receipt else {}),
        ]
        raw.send(b"".join(frames))
        receipts = []
        while not raw.eof:
            try:
                command, headers, body = raw.read_frame()
            except AssertionError:
                break  # closed
            assert command == "RECEIPT", (command, headers, body)
            receipts.append(headers["receipt-id"])
        expected = {"ack", "send", "unsubscribe", "begin", "commit"}
        if disconnect_receipt:
            assert receipts[-1] == "bye"
            expected.add("bye")
        assert sorted(receipts) == sorted(expected)
        assert raw.closed_by_server()
    finally:
        raw.close()
    with clients(run_stomp, "tcp") as make:
        assert control(make(), f"/control/count-msgs{q}")["num-messages"] == "2"
