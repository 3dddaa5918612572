"""The STOMP frontend end to end, with stomp.py over TCP and over WebSocket against
``polymq run``: connect, queues, topics, receipts, acknowledgements, transactions, control
destinations, heart-beats, ERROR frames on bad input (the server serving others all along),
the WebSocket subprotocols, the page and the health endpoints. A smoke set: the exhaustive
suite lives next to it."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import stomp
import websocket

from polymq_server.auth.provider import hash_password

from ...procs import PolymqProcess
from .conftest import WAIT, RawStomp, Stomp, eventually, unique

Connect = Callable[..., Stomp]


def test_connect_negotiates_stomp_12(run_stomp: PolymqProcess) -> None:
    raw = RawStomp(run_stomp.ports["stomp"])
    try:
        raw.frame("STOMP", {"accept-version": "1.0,1.1,1.2", "host": "/"})
        command, headers, _ = raw.read_frame()
        assert command == "CONNECTED"
        assert headers["version"] == "1.2"
        assert headers["heart-beat"] == "0,0"  # the client asked for none
        assert headers["server"].startswith("polymq-stomp/")
    finally:
        raw.close()


def test_queue_send_and_receive_with_receipt_and_headers(connect: Connect) -> None:
    consumer, producer = connect(), connect()
    q = f"/queue/{unique()}"
    consumer.conn.subscribe(q, id="s1", ack="auto")
    producer.conn.send(
        q,
        "hello",
        content_type="text/plain",
        headers={"receipt": "r1", "priority": "7", "persistent": "true", "x-trace": "abc"},
    )
    producer.listener.wait_receipt("r1")
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == "hello"
    h = msg.headers
    assert h["destination"] == q
    assert h["subscription"] == "s1"
    assert h["content-type"] == "text/plain"
    assert h["priority"] == "7"
    assert h["persistent"] == "true"
    assert h["x-trace"] == "abc"
    assert h["redelivered"] == "false"
    assert h["message-id"]


def test_competing_consumers_share_a_queue(connect: Connect) -> None:
    a, b, producer = connect(), connect(), connect()
    q = f"/queue/{unique()}"
    a.conn.subscribe(q, id="1", ack="auto", headers={"prefetch-count": "1", "receipt": "ra"})
    b.conn.subscribe(q, id="1", ack="auto", headers={"prefetch-count": "1", "receipt": "rb"})
    a.listener.wait_receipt("ra")
    b.listener.wait_receipt("rb")
    for i in range(20):
        producer.conn.send(q, f"m{i}")
    eventually(lambda: len(a.listener.messages) + len(b.listener.messages) == 20)
    bodies = sorted(m.body for m in a.listener.messages + b.listener.messages)
    assert bodies == sorted(f"m{i}" for i in range(20))  # each message exactly once


def test_topic_pattern_fans_out(connect: Connect) -> None:
    base = unique()
    s1, s2, producer = connect(), connect(), connect()
    s1.conn.subscribe(f"/topic/{base}.*", id="p", headers={"receipt": "a"})
    s2.conn.subscribe(f"/topic/{base}.news", id="x", headers={"receipt": "b"})
    s1.listener.wait_receipt("a")
    s2.listener.wait_receipt("b")
    producer.conn.send(f"/topic/{base}.news", "extra", headers={"receipt": "r"})
    producer.listener.wait_receipt("r")
    [m1] = s1.listener.wait_messages(1)
    [m2] = s2.listener.wait_messages(1)
    assert m1.body == m2.body == "extra"
    assert m1.headers["destination"] == f"/topic/{base}.news"  # the topic, not the pattern


def test_client_individual_ack_and_redelivery(connect: Connect, run_stomp: PolymqProcess,
                                              transport: str) -> None:  # fmt: skip
    q = f"/queue/{unique()}"
    producer = connect()
    for body in ("one", "two"):
        producer.conn.send(q, body, headers={"receipt": body})
        producer.listener.wait_receipt(body)
    first = connect()
    first.conn.subscribe(q, id="s", ack="client-individual")
    msgs = first.listener.wait_messages(2)
    by_body = {m.body: m for m in msgs}
    first.conn.ack(by_body["one"].headers["ack"], receipt="acked")
    first.listener.wait_receipt("acked")
    first.conn.disconnect()  # "two" was never acked: it goes back to the queue
    second = connect()
    second.conn.subscribe(q, id="s", ack="client-individual")
    [again] = second.listener.wait_messages(1)
    assert again.body == "two"
    assert again.headers["redelivered"] == "true"
    time.sleep(0.3)
    assert len(second.listener.messages) == 1  # "one" was acked: gone for good


def test_nack_requeues(connect: Connect) -> None:
    q = f"/queue/{unique()}"
    c = connect()
    c.conn.subscribe(q, id="s", ack="client")
    c.conn.send(q, "again")
    [msg] = c.listener.wait_messages(1)
    c.conn.nack(msg.headers["ack"])
    msgs = c.listener.wait_messages(2)
    assert msgs[1].body == "again"
    assert msgs[1].headers["redelivered"] == "true"


def test_transaction_commit_and_abort(connect: Connect) -> None:
    q = f"/queue/{unique()}"
    consumer, producer = connect(), connect()
    consumer.conn.subscribe(q, id="s", ack="auto", headers={"receipt": "sub"})
    consumer.listener.wait_receipt("sub")
    producer.conn.begin("t1")
    producer.conn.send(q, "in t1", transaction="t1")
    producer.conn.begin("t2")
    producer.conn.send(q, "in t2", transaction="t2")
    producer.conn.abort("t2")
    time.sleep(0.3)
    assert consumer.listener.messages == []  # nothing before COMMIT
    producer.conn.commit("t1", headers={"receipt": "committed"})
    producer.listener.wait_receipt("committed")
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == "in t1"
    time.sleep(0.3)
    assert len(consumer.listener.messages) == 1  # the aborted one never comes


def test_control_destination_counts(connect: Connect, run_stomp: PolymqProcess) -> None:
    name = unique()
    c = connect()
    c.conn.subscribe(f"/queue/{name}x", id="s", headers={"receipt": "sub"})
    c.listener.wait_receipt("sub")
    for i in range(3):
        c.conn.send(f"/queue/{name}", f"m{i}", headers={"receipt": f"m{i}"})
        c.listener.wait_receipt(f"m{i}")
    # stomp.py keeps only a RECEIPT's id: read its other headers over a raw socket
    raw = RawStomp(run_stomp.ports["stomp"])
    try:
        raw.frame("CONNECT", {"accept-version": "1.2", "host": "/"})
        assert raw.read_frame()[0] == "CONNECTED"
        raw.frame("SEND", {"destination": f"/control/count-msgs/queue/{name}", "receipt": "n"})
        command, headers, _ = raw.read_frame()
        assert (command, headers["receipt-id"], headers["num-messages"]) == ("RECEIPT", "n", "3")
        dest = f"/control/count-subscribers/queue/{name}x"
        raw.frame("SEND", {"destination": dest, "receipt": "s"})
        command, headers, _ = raw.read_frame()
        assert (command, headers["receipt-id"], headers["num-subscribers"]) == ("RECEIPT", "s", "1")
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("verb", "ack_id"),
    [
        ("ACK", "no-such-id"),
        ("ACK", "\u00b2.1"),  # isdigit(), but int() refuses it
        ("NACK", "1.\u00b9"),
        ("ACK", "\u0661.\u0661"),  # digits int() takes, but not ASCII ones
        ("ACK", "9" * 5000 + ".1"),  # more digits than int() takes
        ("NACK", "0." + "9" * 5000),
    ],
    ids=["unknown", "superscript-index", "superscript-tag", "arabic", "long-index", "long-tag"],
)
def test_bad_ack_id_is_an_error_and_others_are_served(
    connect: Connect, verb: str, ack_id: str
) -> None:
    q = f"/queue/{unique()}"
    bystander = connect()
    bystander.conn.subscribe(q, id="s", ack="auto", headers={"receipt": "ready"})
    bystander.listener.wait_receipt("ready")
    bad = connect()
    (bad.conn.ack if verb == "ACK" else bad.conn.nack)(ack_id)
    error = bad.listener.wait_error()
    assert error.headers["message"] == "Invalid header"
    assert error.body == f'"{verb}" must include a valid "id" header\n'  # RabbitMQ's words
    bad.listener.disconnected.wait(WAIT)
    other = connect()  # the server goes on serving
    other.conn.send(q, "still here")
    [msg] = bystander.listener.wait_messages(1)
    assert msg.body == "still here"


def test_garbage_gets_an_error_frame_before_the_close(run_stomp: PolymqProcess) -> None:
    raw = RawStomp(run_stomp.ports["stomp"])
    try:
        raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        command, headers, body = raw.read_frame()
        assert command == "ERROR"
        assert headers["message"] == "Bad command"
        assert b"GET" in body
        assert raw.closed_by_server()
    finally:
        raw.close()
    raw = RawStomp(run_stomp.ports["stomp"])  # frames before CONNECT
    try:
        raw.frame("SEND", {"destination": "/queue/x"}, b"early")
        command, headers, _ = raw.read_frame()
        assert (command, headers["message"]) == ("ERROR", "Illegal command")
    finally:
        raw.close()


def test_unknown_destination_is_an_error_naming_the_accepted_forms(connect: Connect) -> None:
    c = connect()
    c.conn.send("/nowhere/x", "lost")
    error = c.listener.wait_error()
    assert error.headers["message"] == "Unknown destination"
    assert error.body == (
        "'/nowhere/x' is not a valid destination.\nValid destination types are: /temp-queue, "
        "/exchange, /topic, /queue, /amq/queue, /stream, /control.\n"
    )


def test_silent_client_is_disconnected_after_the_heart_beat(run_stomp: PolymqProcess) -> None:
    raw = RawStomp(run_stomp.ports["stomp"])
    try:
        # the client promises a heart-beat every 200 ms, then says nothing
        raw.frame("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "200,0"})
        command, headers, _ = raw.read_frame()
        assert (command, headers["heart-beat"]) == ("CONNECTED", "0,200")
        start = time.monotonic()
        command, headers, _ = raw.read_frame()
        assert (command, headers["message"]) == ("ERROR", "heart-beat timeout")
        assert 0.3 < time.monotonic() - start < 3.0
    finally:
        raw.close()


def test_heart_beating_client_stays_connected(run_stomp: PolymqProcess,
                                              transport: str) -> None:  # fmt: skip
    c = Stomp(run_stomp, transport, heartbeats=(200, 200)).connect()
    try:
        time.sleep(1.5)  # several intervals, both ways
        assert c.conn.is_connected()
        assert not c.listener.errors
        q = f"/queue/{unique()}"
        c.conn.subscribe(q, id="s")
        c.conn.send(q, "alive")
        assert c.listener.wait_messages(1)[0].body == "alive"
    finally:
        c.close()


def test_login_is_accepted_in_anonymous_mode(connect: Connect) -> None:
    c = connect(username="alice", passcode="anything")
    assert c.conn.is_connected()


def test_websocket_picks_a_stomp_subprotocol(run_stomp: PolymqProcess) -> None:
    url = f"ws://127.0.0.1:{run_stomp.ports['stomp_ws']}/ws"
    ws = websocket.create_connection(
        url, subprotocols=["v10.stomp", "v11.stomp", "v12.stomp"], timeout=WAIT
    )
    try:
        assert ws.getsubprotocol() == "v12.stomp"  # browsers refuse a socket without one
        ws.send("CONNECT\naccept-version:1.1,1.2\nhost:/\n\n\0")
        assert ws.recv().startswith("CONNECTED\n")
    finally:
        ws.close()


def test_page_stompjs_and_health_endpoints(run_stomp: PolymqProcess) -> None:
    base = f"http://127.0.0.1:{run_stomp.ports['stomp_ws']}"
    page = requests.get(base + "/", timeout=WAIT)
    assert page.status_code == 200
    assert "/static/stomp.umd.min.js" in page.text
    js = requests.get(base + "/static/stomp.umd.min.js", timeout=WAIT)
    assert js.status_code == 200
    assert "StompJs" in js.text
    assert requests.get(base + "/healthz", timeout=WAIT).status_code == 200
    assert requests.get(base + "/readyz", timeout=WAIT).json()["status"] == "ready"
    metrics = requests.get(base + "/metrics", timeout=WAIT).text
    assert 'polymq_stomp_frames_total{command="CONNECT",direction="in"}' in metrics
    assert 'polymq_stomp_connections{transport="tcp"}' in metrics
    assert 'polymq_stomp_errors_total{reason="ack"}' in metrics


def test_stomp_py_over_both_transports_sees_one_broker(run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    tcp = Stomp(run_stomp, "tcp").connect()
    ws = Stomp(run_stomp, "ws").connect()
    try:
        ws.conn.subscribe(q, id="s", headers={"receipt": "r"})
        ws.listener.wait_receipt("r")
        tcp.conn.send(q, "from tcp")
        assert ws.listener.wait_messages(1)[0].body == "from tcp"
    finally:
        tcp.close()
        ws.close()


def test_stomp_10_and_11_ack_by_message_id(run_stomp: PolymqProcess) -> None:
    q = f"/queue/{unique()}"
    c = stomp.Connection11([("127.0.0.1", run_stomp.ports["stomp"])])
    from .conftest import Collector

    listener = Collector()
    c.set_listener("l", listener)
    c.connect(wait=True)
    try:
        c.subscribe(q, id="s", ack="client")
        c.send(q, "eleven")
        [msg] = listener.wait_messages(1)
        assert "ack" not in msg.headers  # 1.1 acks by message-id
        c.ack(msg.headers["message-id"], "s", receipt="ok")
        listener.wait_receipt("ok")
        assert not listener.errors
    finally:
        c.disconnect()


def test_stream_replays_from_an_offset(connect: Connect) -> None:
    s = f"/stream/{unique()}"
    producer = connect()
    for i in range(3):
        producer.conn.send(s, f"e{i}", headers={"receipt": f"e{i}"})
        producer.listener.wait_receipt(f"e{i}")
    reader = connect()
    reader.conn.subscribe(s, id="r", ack="client", headers={"x-stream-offset": "first"})
    msgs = reader.listener.wait_messages(3)
    assert [m.body for m in msgs] == ["e0", "e1", "e2"]
    late = connect()
    late.conn.subscribe(s, id="r", headers={"x-stream-offset": "2"})
    assert [m.body for m in late.listener.wait_messages(2)] == ["e1", "e2"]


def test_temp_queue_reply_to(connect: Connect) -> None:
    service_q = f"/queue/{unique()}"
    server, caller = connect(), connect()
    server.conn.subscribe(service_q, id="svc", headers={"receipt": "svc"})
    server.listener.wait_receipt("svc")
    caller.conn.send(service_q, "ping", headers={"reply-to": "/temp-queue/answers"})
    [request] = server.listener.wait_messages(1)
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith("/queue/tmp.")  # the caller's private queue, by its real name
    server.conn.send(reply_to, "pong")
    [reply] = caller.listener.wait_messages(1)  # subscribed for the caller, as RabbitMQ does
    assert reply.body == "pong"
    assert reply.headers["subscription"] == "/temp-queue/answers"
    assert reply.headers["destination"] == "/temp-queue/answers"


def test_sigterm_says_shutting_down_then_exits_cleanly(tmp_path: Path) -> None:
    proc = PolymqProcess("run", tmp_path / "run").start()
    try:
        c = Stomp(proc, "tcp").connect()
        q = f"/queue/{unique()}"
        c.conn.send(q, "before", headers={"receipt": "r", "persistent": "true"})
        c.listener.wait_receipt("r")
        assert proc.stop() == 0, proc.log()
        error = c.listener.wait_error()
        assert error.headers["message"] == "shutting down"
        assert "Traceback" not in proc.log()
    finally:
        proc.kill()


def test_polymq_stomp_with_file_auth_against_a_separate_core(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text(
        json.dumps(
            {
                "users": {
                    "alice": {
                        "password_hash": hash_password("secret"),
                        "grants": [{"pattern": "queue/alice.*", "permissions": ["read", "write"]}],
                    },
                    "frontend": {
                        "password_hash": hash_password("fe-secret"),
                        "grants": [{"pattern": "*", "permissions": ["read", "write", "configure"]}],
                    },
                }
            }
        )
    )
    auth = ["--auth", f"file:{users}"]
    env = {"POLYMQ_CORE_USER": "frontend", "POLYMQ_CORE_PASSWORD": "fe-secret"}
    with PolymqProcess("core", tmp_path / "core", *auth) as core:
        core_addr = f"127.0.0.1:{core.ports['core']}"
        with PolymqProcess("stomp", tmp_path / "stomp", "--core", core_addr, *auth, env=env) as fe:
            assert set(fe.ports) == {"stomp", "stomp_ws"}
            refused = Stomp(fe, "tcp")
            with pytest.raises(stomp.exception.ConnectFailedException):
                refused.connect(username="alice", passcode="wrong")
            assert refused.listener.errors[0].headers["message"] == "Bad CONNECT"

            alice = Stomp(fe, "ws").connect(username="alice", passcode="secret")
            alice.conn.subscribe("/queue/alice.inbox", id="1", headers={"receipt": "ok"})
            alice.conn.send("/queue/alice.inbox", "mine")
            assert alice.listener.wait_messages(1)[0].body == "mine"
            alice.conn.send("/queue/bob.inbox", "not mine")
            error = alice.listener.wait_error()
            assert error.headers["message"] == "access_refused"
            assert "write permission" in error.body


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_tls_on_both_listeners(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    with PolymqProcess("run", tmp_path / "run", *tls) as proc:
        for transport, port in (("tcp", proc.ports["stomp"]), ("ws", proc.ports["stomp_ws"])):
            c = Stomp(proc, transport)
            c.conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(cert))
            c.connect()
            try:
                q = f"/queue/{unique()}"
                c.conn.subscribe(q, id="s")
                c.conn.send(q, f"secret over {transport}")
                assert c.listener.wait_messages(1)[0].body == f"secret over {transport}"
            finally:
                c.close()
