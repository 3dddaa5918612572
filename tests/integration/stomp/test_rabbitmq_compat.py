"""RabbitMQ's STOMP conventions (issue 16), each shown against polymq and, where the test
is parametrized with ``broker``, against a private RabbitMQ node with its STOMP plugins
(``rabbit_stomp`` in conftest.py: skipped where they are not installed), so that the same
test passes on both. Raw frames (``helpers.Raw``) over TCP and WebSocket, and stomp.py's
1.0/1.1/1.2 clients.

Both are reached the way RabbitMQ wants: ``host: /`` (RabbitMQ takes the host header for a
vhost and refuses any it does not have) and guest/guest (polymq runs without
authentication here and takes any login)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from polymq_server.auth.provider import hash_password

from ...procs import PolymqProcess
from ...rabbit import RabbitNode
from .helpers import (
    QUIET,
    WAIT,
    Clients,
    Raw,
    RawFrame,
    RawTcp,
    RawWs,
    StompClient,
    clients,
    unique,
)

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024
LOGIN = {"login": "guest", "passcode": "guest"}


@dataclass
class Broker:
    """Where a test's STOMP clients go: polymq or RabbitMQ (what ``StompClient`` needs)."""

    name: str
    ports: dict[str, int]

    def raw(self, transport: str) -> Raw:
        if transport == "tcp":
            return RawTcp(self.ports["stomp"])
        return RawWs(self.ports["stomp_ws"])


@pytest.fixture(scope="module")
def run_stomp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """``polymq run`` with a second vhost, ``other``, for STOMP and AMQP."""
    workdir: Path = tmp_path_factory.mktemp("stomp-compat")
    env = {"POLYMQ_STOMP_VHOSTS": "/,other", "POLYMQ_AMQP_VHOSTS": "/,other"}
    with PolymqProcess("run", workdir, env=env) as proc:
        yield proc


@pytest.fixture(params=["polymq", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Broker:
    if request.param == "polymq":
        proc: PolymqProcess = request.getfixturevalue("run_stomp")
        return Broker("polymq", {k: proc.ports[k] for k in ("stomp", "stomp_ws", "amqp")})
    node: RabbitNode = request.getfixturevalue("rabbit_stomp")
    ports = {"stomp": node.stomp_port, "stomp_ws": node.web_stomp_port, "amqp": node.port}
    return Broker("rabbitmq", ports)


@pytest.fixture
def polymq(run_stomp: PolymqProcess) -> Broker:
    return Broker("polymq", {k: run_stomp.ports[k] for k in ("stomp", "stomp_ws")})


@pytest.fixture
def raws() -> Iterator[list[Raw]]:
    made: list[Raw] = []
    yield made
    for raw in made:
        raw.close()


def opened(raws: list[Raw], broker: Broker, transport: str, **headers: str) -> Raw:
    """A raw connection, CONNECTed (STOMP 1.2, ``host: /``, guest) unless ``headers`` say
    otherwise."""
    raw = broker.raw(transport)
    raws.append(raw)
    raw.connect(**{"host": "/", **LOGIN, **headers})
    return raw


@pytest.fixture
def client(broker: Broker, transport: str) -> Iterator[Clients]:
    with clients(broker, transport) as make:  # type: ignore[arg-type]  # duck-typed
        yield make


def stomppy(make: Clients, version: str = "1.2", **connect: str) -> StompClient:
    """A stomp.py client (``host: /``; stomp.py's 1.0 client sends no host: the default)."""
    ctor = {"vhost": "/"} if version != "1.0" else {}
    return make(version, ctor=ctor, username="guest", passcode="guest", **connect)


def until(raw: Raw, command: str, **headers: str) -> list[RawFrame]:
    """Frames read up to and including the first ``command`` frame with ``headers``."""
    got = []
    while True:
        frame = raw.read_frame()
        got.append(frame)
        if frame[0] == command and all(frame[1].get(k) == v for k, v in headers.items()):
            return got


def closes(broker: Broker, raw: Raw) -> None:
    """polymq closes the connection after an ERROR frame, as STOMP says a server must;
    RabbitMQ keeps it open after many (not shown here)."""
    if broker.name == "polymq":
        assert raw.closed_by_server()


def receipts(frames: list[RawFrame]) -> list[str]:
    return [h["receipt-id"] for c, h, _ in frames if c == "RECEIPT"]


# ---- 1. CONNECTED to a STOMP 1.0 client ----------------------------------------------------
def test_connected_to_a_stomp_10_client_says_version_and_heart_beat(
    broker: Broker, transport: str, raws: list[Raw]
) -> None:
    raw = broker.raw(transport)
    raws.append(raw)
    raw.frame("CONNECT", LOGIN)  # no accept-version: STOMP 1.0; no host
    command, headers, _ = raw.read_frame()
    assert command == "CONNECTED", headers
    assert (headers["version"], headers["heart-beat"]) == ("1.0", "0,0")


def test_stomppy_10_client_sees_version_10(broker: Broker) -> None:
    with clients(broker, "tcp") as make:  # type: ignore[arg-type]
        c = stomppy(make, "1.0")
        [connected] = c.listener.connected
        assert (connected.headers["version"], connected.headers["heart-beat"]) == ("1.0", "0,0")
        q = f"/queue/{unique()}"
        c.subscribe(q)
        c.send_receipted(q, "over 1.0")
        assert c.listener.wait_messages(1)[0].body == "over 1.0"


# ---- 7. virtual hosts, frame sizes, message-id -----------------------------------------
@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_host_slash_is_the_default_vhost(broker: Broker, version: str) -> None:
    with clients(broker, "tcp") as make:  # type: ignore[arg-type]
        a, b = stomppy(make, version), stomppy(make, "1.2")
        q = f"/queue/{unique()}"
        b.subscribe(q)
        a.send_receipted(q, f"from {version}")
        assert b.listener.wait_messages(1)[0].body == f"from {version}"


def test_an_unknown_vhost_is_refused(broker: Broker, transport: str, raws: list[Raw]) -> None:
    vhost = f"nosuch-{uuid.uuid4().hex[:8]}"
    raw = broker.raw(transport)
    raws.append(raw)
    raw.frame("CONNECT", {"accept-version": "1.2", "host": vhost, **LOGIN})
    _, headers, body = raw.read_error()
    assert headers["message"] == "Bad CONNECT"
    assert body.decode().startswith(f"Virtual host '{vhost}' access denied"), body
    closes(broker, raw)


def test_vhosts_keep_their_destinations_apart(
    polymq: Broker, run_stomp: PolymqProcess, raws: list[Raw]
) -> None:
    """polymq only (a second vhost on RabbitMQ needs rabbitmqctl): /queue/x in vhost
    ``other`` is not /queue/x of ``/``; it is AMQP's queue x in vhost ``other``."""
    name = unique("vq")
    in_other = opened(raws, polymq, "tcp", host="other")
    in_default = opened(raws, polymq, "ws", host="/")
    in_other.frame("SEND", {"destination": f"/queue/{name}", "receipt": "s"}, b"in other")
    until(in_other, "RECEIPT", **{"receipt-id": "s"})
    in_default.frame("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "1", "receipt": "r"})
    until(in_default, "RECEIPT", **{"receipt-id": "r"})
    # AMQP's queue of that name in vhost "other" holds it
    params = pika.ConnectionParameters(
        "127.0.0.1", run_stomp.ports["amqp"], "other", pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        method, _, body = ch.basic_get(name, auto_ack=True)
        assert body == b"in other", method
        ch.basic_publish("", name, b"from amqp")
    finally:
        conn.close()
    in_other.frame("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "1"})
    _, headers, body = until(in_other, "MESSAGE")[-1]
    assert (body, headers["destination"]) == (b"from amqp", f"/queue/{name}")
    time.sleep(QUIET)  # and nothing reached vhost / meanwhile
    in_default.frame("SEND", {"destination": "/queue/x", "receipt": "end"})
    assert receipts(until(in_default, "RECEIPT", **{"receipt-id": "end"})) == ["end"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_host_naming_the_server_is_the_default_vhost(
    polymq: Broker, raws: list[Raw], host: str
) -> None:
    """polymq only (RabbitMQ refuses them): STOMP 1.2 asks clients to send the host name
    they connected to, and stomp.py does; that is the default vhost ``/``."""
    q = f"/queue/{unique()}"
    by_name = opened(raws, polymq, "tcp", host=host)
    by_slash = opened(raws, polymq, "tcp", host="/")
    by_slash.frame("SUBSCRIBE", {"destination": q, "id": "1", "receipt": "r"})
    until(by_slash, "RECEIPT")
    by_name.frame("SEND", {"destination": q}, b"same vhost")
    assert until(by_slash, "MESSAGE")[-1][2] == b"same vhost"


def test_a_16_mib_frame_is_taken_once_logged_in(
    broker: Broker, transport: str, raws: list[Raw]
) -> None:
    q = f"/queue/{unique()}"
    raw = opened(raws, broker, transport)
    body = b"x" * (16 * MIB - 4096)
    raw.frame("SEND", {"destination": q, "receipt": "big", "content-length": str(len(body))}, body)
    raw.frame("SUBSCRIBE", {"destination": q, "id": "1"})
    frames = until(raw, "MESSAGE")
    assert "big" in receipts(frames)
    assert len(frames[-1][2]) == len(body)


def test_a_16_mib_body_to_a_topic_reaches_both_subscribers(
    broker: Broker, transport: str, raws: list[Raw]
) -> None:
    """A SEND of 16 MiB of body, and its headers, to a topic with two subscribers (issue 30,
    point 3): RabbitMQ takes it, and so does polymq's default frame limit."""
    topic = f"/topic/{unique()}"
    subscribers = [opened(raws, broker, transport), opened(raws, broker, "tcp")]
    for raw in subscribers:
        raw.frame("SUBSCRIBE", {"destination": topic, "id": "big", "receipt": "s"})
        until(raw, "RECEIPT")
    producer = opened(raws, broker, transport)
    body = b"0123456789abcdef" * (MIB // 16) * 16  # (RabbitMQ's Web-STOMP sends text)
    headers = {"destination": topic, "receipt": "big", "content-length": str(len(body))}
    producer.frame("SEND", headers, body)
    until(producer, "RECEIPT", **{"receipt-id": "big"})
    for raw in subscribers:
        [(_, got, received)] = messages_in(raw, 1)
        assert (got["subscription"], len(received)) == ("big", len(body))
        assert received == body


@pytest.mark.parametrize(
    "padding",
    [b"\0", b"\n\0", b"\0\n", b"\r\n\0\0\n", b"\0" * 5],
    ids=["nul", "eol-nul", "nul-eol", "mixed", "nuls"],
)
def test_newlines_and_nuls_between_frames_are_padding(
    broker: Broker, transport: str, raws: list[Raw], padding: bytes
) -> None:
    """EOLs and NULs between frames, right after a frame's NUL and before the next command
    (issue 30, point 3): RabbitMQ skips them, and so does polymq."""
    q = f"/queue/{unique()}"
    raw = opened(raws, broker, transport)
    subscribe = f"SUBSCRIBE\ndestination:{q}\nid:1\n\n\0".encode()
    send = f"SEND\ndestination:{q}\nreceipt:r\n\npadded\0".encode()
    raw.send(padding + subscribe + padding + send + padding)
    frames = until(raw, "MESSAGE")
    assert [c for c, _, _ in frames if c == "ERROR"] == []
    assert frames[-1][2] == b"padded"
    raw.frame("SEND", {"destination": q, "receipt": "after"}, b"still open")
    until(raw, "RECEIPT", **{"receipt-id": "after"})


def test_a_frame_before_login_is_64_kib_at_most(
    polymq: Broker, transport: str, raws: list[Raw]
) -> None:
    """polymq only (RabbitMQ 3.10 takes more before login)."""
    raw = polymq.raw(transport)
    raws.append(raw)
    raw.frame("CONNECT", {"accept-version": "1.2", "host": "/"}, b"x" * (64 * 1024))
    _, headers, body = raw.read_error()
    assert headers["message"] == "frame too large"
    assert b"65536" in body
    assert raw.closed_by_server()
    ok = polymq.raw(transport)  # a CONNECT below the limit is fine
    raws.append(ok)
    ok.frame("CONNECT", {"accept-version": "1.2", "host": "/"}, b"x" * (60 * 1024))
    assert ok.read_frame()[0] == "CONNECTED"


def test_send_with_a_message_id_header_is_refused(
    broker: Broker, transport: str, raws: list[Raw]
) -> None:
    raw = opened(raws, broker, transport)
    raw.frame("SEND", {"destination": f"/queue/{unique()}", "message-id": "mine", "receipt": "r"})
    _, headers, body = raw.read_error()
    assert headers["message"] == "Invalid header"
    assert b"'message-id' is not allowed on 'SEND'" in body
    closes(broker, raw)


# ---- 8. ERROR frames in RabbitMQ's words ---------------------------------------------------
# Each body is RabbitMQ 3.10's to the byte (its ``~n`` newlines included; issue 30, point 2),
# or, where ``prefix``, begins so (the list of destination types is each broker's own).
@dataclass(frozen=True)
class Wording:
    frames: list[tuple[str, dict[str, str]]]  # after a CONNECT (1.2) if ``login``
    message: str
    body: str
    login: bool = True
    prefix: bool = False


CONNECT_10 = ("CONNECT", LOGIN)  # no accept-version: STOMP 1.0


def invalid(destination: str, rest: str, kind: str, command: str = "SEND") -> Wording:
    frame = {"destination": destination} | ({"id": "1"} if command == "SUBSCRIBE" else {})
    return Wording(
        [(command, frame)], "Invalid destination", f"'{rest}' is not a valid {kind} destination\n"
    )


def unknown(destination: str, command: str = "SEND") -> Wording:
    """(Each lists its own destination types after these words.)"""
    frame = {"destination": destination} | ({"id": "1"} if command == "SUBSCRIBE" else {})
    return Wording(
        [(command, frame)],
        "Unknown destination",
        f"'{destination}' is not a valid destination.\nValid destination types are: /temp-queue, ",
        prefix=True,
    )


WORDINGS = {
    "send-without-destination": Wording(
        [("SEND", {"receipt": "r"})],
        "Missing destination",
        "\"SEND\" must include a 'destination' header\n",
    ),
    "subscribe-without-destination": Wording(
        [("SUBSCRIBE", {"id": "1"})],
        "Missing destination",
        "\"SUBSCRIBE\" must include a 'destination' header\n",
    ),
    "unknown-destination-prefix": unknown("/nowhere/x"),
    "something-else": unknown("/something/else", "SUBSCRIBE"),
    "empty-queue-name": invalid("/queue/", "/", "queue"),
    "queue-without-name": invalid("/queue", "", "queue"),
    "queue-a-b": invalid("/queue/a/b", "/a/b", "queue"),
    "topic-a-b": invalid("/topic/a/b", "/a/b", "topic", "SUBSCRIBE"),
    "empty-topic-name": invalid("/topic/", "/", "topic"),
    "exchange-a-b-c": invalid("/exchange/a/b/c", "/a/b/c", "exchange"),
    "exchange-without-name": invalid("/exchange//foo", "//foo", "exchange", "SUBSCRIBE"),
    "exchange-alone": invalid("/exchange", "", "exchange"),
    "empty-amq-queue-name": invalid("/amq/queue/", "/", "amqqueue"),
    "subscribe-to-a-missing-exchange": Wording(
        [("SUBSCRIBE", {"destination": "/exchange/nosuch/k", "id": "1"})],
        "not_found",
        "NOT_FOUND - no exchange 'nosuch' in vhost '/'",
    ),
    "send-with-message-id-to-a-bad-destination": Wording(
        [("SEND", {"destination": "/nowhere/x", "message-id": "mine"})],
        "Invalid header",
        "'message-id' is not allowed on 'SEND'.\n",
    ),
    "duplicate-subscription": Wording(
        [
            ("SUBSCRIBE", {"destination": "/queue/d1", "id": "s"}),
            ("SUBSCRIBE", {"destination": "/queue/d2", "id": "s"}),
        ],
        "Duplicated subscription identifier",
        "A subscription identified by 'T_s' already exists.",
    ),
    "duplicate-subscription-1.0": Wording(
        [CONNECT_10, *[("SUBSCRIBE", {"destination": "/queue/d1"})] * 2],
        "Duplicated subscription identifier",
        "A subscription identified by 'Q_/queue/d1' already exists.",
        login=False,
    ),
    "send-in-an-unknown-transaction": Wording(
        [("SEND", {"destination": "/queue/x", "transaction": "t9"})],
        "Bad transaction",
        'Invalid transaction identifier: "t9"\n',
    ),
    "commit-of-an-unknown-transaction": Wording(
        [("COMMIT", {"transaction": "t9"})],
        "Bad transaction",
        'Invalid transaction identifier: "t9"\n',
    ),
    "abort-of-an-unknown-transaction": Wording(
        [("ABORT", {"transaction": "t9"})],
        "Bad transaction",
        'Invalid transaction identifier: "t9"\n',
    ),
    "begin-without-transaction": Wording(
        [("BEGIN", {})], "Missing transaction", "\"BEGIN\" must include a 'transaction' header\n"
    ),
    "commit-without-transaction": Wording(
        [("COMMIT", {})],
        "Missing transaction",
        "\"COMMIT\" must include a 'transaction' header\n",
    ),
    "unsubscribe-unknown": Wording(
        [("UNSUBSCRIBE", {"id": "zz"})],
        "No subscription found",
        "UNSUBSCRIBE must refer to an existing subscription.\n"
        "Subscription to \"id='zz'\" not found.\n",
    ),
    "unsubscribe-without-id": Wording(
        [("UNSUBSCRIBE", {})],
        "Missing destination or id",
        "UNSUBSCRIBE must include a 'destination' or 'id' header",
    ),
    "ack-without-id": Wording(
        [("ACK", {})], "Missing header", '"ACK" must include the "id" header\n'
    ),
    "nack-without-id": Wording(
        [("NACK", {})], "Missing header", '"NACK" must include the "id" header\n'
    ),
    "ack-without-message-id-1.0": Wording(
        [CONNECT_10, ("ACK", {})],
        "Missing header",
        '"ACK" must include the "message-id" header\n',
        login=False,
    ),
    "ack-of-nothing": Wording(
        [("ACK", {"id": "zz"})], "Invalid header", '"ACK" must include a valid "id" header\n'
    ),
    "unknown-command": Wording([("FOO", {})], "Bad command", 'Could not interpret command "FOO"\n'),
    "unknown-command-1.0": Wording(
        [CONNECT_10, ("BAR", {})],
        "Bad command",
        'Could not interpret command "BAR"\n',
        login=False,
    ),
    "send-before-connect": Wording(
        [("SEND", {"destination": "/queue/x"})],
        "Illegal command",
        "You must log in using CONNECT first",
        login=False,
    ),
    "no-common-version": Wording(
        [("CONNECT", {"accept-version": "3.0", "host": "/", **LOGIN})],
        "Version mismatch",
        "Supported versions are 1.0,1.1,1.2\n",
        login=False,
    ),
    "no-version-at-all": Wording(
        [("CONNECT", {"accept-version": "x.y,", "host": "/", **LOGIN})],
        "Version mismatch",
        "Supported versions are 1.0,1.1,1.2\n",
        login=False,
    ),
}


@pytest.mark.parametrize("case", list(WORDINGS.values()), ids=list(WORDINGS))
def test_error_frames_say_what_rabbitmq_says(
    broker: Broker, raws: list[Raw], case: Wording
) -> None:
    raw = broker.raw("tcp")
    raws.append(raw)
    if case.login:
        raw.connect(**{"host": "/", **LOGIN})
    for command, headers in case.frames:
        raw.frame(command, headers)
    _, headers, body = until(raw, "ERROR")[-1]
    assert headers["message"] == case.message, (headers, body)
    assert headers["version"] == "1.0,1.1,1.2", headers  # on every ERROR
    if case.prefix:
        assert body.startswith(case.body.encode()), body
    else:
        assert body == case.body.encode()
    closes(broker, raw)


@pytest.fixture(scope="module")
def run_stomp_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """``polymq run`` that checks logins: guest/guest, as RabbitMQ's default user."""
    workdir: Path = tmp_path_factory.mktemp("stomp-compat-auth")
    users = workdir / "users.json"
    grants = [{"pattern": "*", "permissions": ["read", "write", "configure"]}]
    guest = {"password_hash": hash_password("guest"), "grants": grants}
    users.write_text(json.dumps({"users": {"guest": guest}}))
    with PolymqProcess("run", workdir / "run", "--auth", f"file:{users}") as proc:
        yield proc


@pytest.mark.parametrize("name", ["polymq", "rabbitmq"])
def test_a_failed_login_says_access_refused_for_the_user(
    request: pytest.FixtureRequest, raws: list[Raw], transport: str, name: str
) -> None:
    """Exactly ``Access refused for user '<login>'`` and a newline: the reason is the
    broker's to log, not the client's to read (issue 30, point 2)."""
    if name == "polymq":
        proc: PolymqProcess = request.getfixturevalue("run_stomp_auth")
        broker = Broker(name, {k: proc.ports[k] for k in ("stomp", "stomp_ws")})
    else:
        node: RabbitNode = request.getfixturevalue("rabbit_stomp")
        broker = Broker(name, {"stomp": node.stomp_port, "stomp_ws": node.web_stomp_port})
    raw = broker.raw(transport)
    raws.append(raw)
    raw.frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                          "passcode": "not the password"})  # fmt: skip
    _, headers, body = raw.read_error()
    assert (headers["message"], body) == ("Bad CONNECT", b"Access refused for user 'guest'\n")
    closes(broker, raw)


# ---- 6. receipts inside a transaction ------------------------------------------------------
@pytest.mark.parametrize("end", ["COMMIT", "ABORT"])
def test_a_send_in_a_transaction_has_its_receipt_at_commit(
    broker: Broker, transport: str, raws: list[Raw], end: str
) -> None:
    q = f"/queue/{unique()}"
    raw = opened(raws, broker, transport)
    raw.frame("BEGIN", {"transaction": "t", "receipt": "begun"})
    raw.frame("SEND", {"destination": q, "transaction": "t", "receipt": "in-tx"}, b"a")
    time.sleep(QUIET)
    raw.frame("SEND", {"destination": q, "receipt": "outside"}, b"b")
    assert receipts(until(raw, "RECEIPT", **{"receipt-id": "outside"})) == ["begun", "outside"]
    raw.frame(end, {"transaction": "t", "receipt": "ended"})
    raw.frame("SEND", {"destination": q, "receipt": "after"}, b"c")
    want = {"ended", "after"} | ({"in-tx"} if end == "COMMIT" else set())
    got: set[str] = set()
    while not want <= got:  # (RabbitMQ sends the SEND's after the COMMIT's, polymq before)
        got.update(receipts([raw.read_frame()]))
    assert got == want  # and none for an aborted SEND


def test_the_receipt_of_an_ack_in_a_transaction_comes_at_once(client: Clients) -> None:
    """Unlike a SEND's, an ACK's receipt in a transaction comes at once, as RabbitMQ sends it
    (a client may wait for it before its COMMIT); the ACK takes effect at COMMIT."""
    q = f"/queue/{unique()}"
    c = stomppy(client)
    c.subscribe(q, ack="client-individual")
    c.send_receipted(q, "m")
    [m] = c.listener.wait_messages(1)
    c.conn.begin("tx")
    c.conn.ack(m.headers["ack"], "tx", receipt="acked")
    c.listener.wait_receipt("acked")
    c.conn.commit("tx", headers={"receipt": "committed"})
    c.listener.wait_receipt("committed")
    assert not c.listener.errors


# ---- 5. flow control of a topic subscription with a prefetch ------------------------------
def messages_in(raw: Raw, total: int = 0, got: list[RawFrame] | None = None) -> list[RawFrame]:
    """The MESSAGE frames in ``got`` (what was read already, other frames dropped) and read
    now, until there are ``total`` (each within WAIT) and none more within QUIET."""
    frames = [f for f in got or [] if f[0] == "MESSAGE"]
    while True:
        try:
            frame = raw.read_frame() if len(frames) < total else raw.read_frame(QUIET)
        except AssertionError:
            if raw.eof or len(frames) < total:
                raise
            return frames
        assert frame[0] == "MESSAGE", frame
        frames.append(frame)


@pytest.mark.parametrize("ack", ["client-individual", "client"])
def test_a_topic_subscription_with_a_prefetch_waits_for_acks(
    broker: Broker, transport: str, raws: list[Raw], ack: str
) -> None:
    base = unique("fc")
    consumer = opened(raws, broker, transport)
    consumer.frame(
        "SUBSCRIBE",
        {"destination": f"/topic/{base}.*", "id": "f", "ack": ack, "prefetch-count": "2",
         "receipt": "sub"},
    )  # fmt: skip
    until(consumer, "RECEIPT")
    producer = opened(raws, broker, "tcp")
    for i in range(9):
        producer.frame("SEND", {"destination": f"/topic/{base}.m{i}"}, f"m{i}".encode())
    producer.frame("SEND", {"destination": f"/topic/{base}.m9", "receipt": "sent"}, b"m9")
    until(producer, "RECEIPT")
    got: list[RawFrame] = []
    while len(got) < 10:
        batch = messages_in(consumer, min(2, 10 - len(got)))
        assert len(batch) == min(2, 10 - len(got)), batch  # the window: no more, no ERROR
        got += batch
        last = batch[-1][1]["ack"]
        if ack == "client":
            consumer.frame("ACK", {"id": last})  # cumulative
        else:
            for frame in batch:
                consumer.frame("ACK", {"id": frame[1]["ack"]})
    assert [b for _, _, b in got] == [f"m{i}".encode() for i in range(10)]
    assert [h["destination"] for _, h, _ in got] == [f"/topic/{base}.m{i}" for i in range(10)]
    assert messages_in(consumer) == []


def test_stomppy_11_topic_subscription_with_a_prefetch(broker: Broker) -> None:
    t = f"/topic/{unique()}"
    with clients(broker, "tcp") as make:  # type: ignore[arg-type]
        c, producer = stomppy(make, "1.1"), stomppy(make)
        c.subscribe(t, ack="client-individual", **{"prefetch-count": "1"})
        for i in range(3):
            producer.send_receipted(t, f"m{i}")
        for n in range(1, 4):
            msgs = c.listener.wait_messages(n)
            time.sleep(QUIET / 2)
            assert len(c.listener.messages) == n  # one at a time
            c.conn.ack(msgs[-1].headers["message-id"], msgs[-1].headers["subscription"])
        assert [m.body for m in c.listener.messages] == ["m0", "m1", "m2"]
        assert not c.listener.errors


# ---- 3. durable topic subscriptions ------------------------------------------------------
DURABLE = {"durable": "true", "auto-delete": "false"}


def durable_sub(raw: Raw, topic: str, sid: str, **headers: str) -> list[RawFrame]:
    """SUBSCRIBE durably; the MESSAGE frames that came before its RECEIPT."""
    raw.frame(
        "SUBSCRIBE", {"destination": topic, "id": sid, "receipt": "sub", **DURABLE, **headers}
    )
    return [f for f in until(raw, "RECEIPT", **{"receipt-id": "sub"}) if f[0] == "MESSAGE"]


def publish(raw: Raw, destination: str, *bodies: bytes, **headers: str) -> None:
    for body in bodies:
        raw.frame("SEND", {"destination": destination, "receipt": "p", **headers}, body)
        until(raw, "RECEIPT", **{"receipt-id": "p"})


def leave(raw: Raw) -> None:
    """DISCONNECT, and wait for its RECEIPT or the close (RabbitMQ's Web-STOMP closes
    without the RECEIPT)."""
    raw.frame("DISCONNECT", {"receipt": "bye"})
    try:
        until(raw, "RECEIPT", **{"receipt-id": "bye"})
    except AssertionError:
        assert raw.eof


@pytest.mark.parametrize("header", ["durable", "persistent"])
def test_a_durable_subscription_keeps_what_comes_while_away(
    broker: Broker, transport: str, raws: list[Raw], header: str
) -> None:
    topic, client_id = f"/topic/{unique()}", unique("cl")
    sub = {"client-id": client_id}
    first = opened(raws, broker, transport, **sub)
    headers = {header: "true", "auto-delete": "false"}
    first.frame("SUBSCRIBE", {"destination": topic, "id": "d", "receipt": "s", **headers})
    until(first, "RECEIPT")
    producer = opened(raws, broker, "tcp")
    publish(producer, topic, b"while here")
    assert until(first, "MESSAGE")[-1][2] == b"while here"
    leave(first)
    publish(producer, topic, b"away 1", b"away 2")
    back = opened(raws, broker, transport, **sub)
    back.frame("SUBSCRIBE", {"destination": topic, "id": "d", "receipt": "s", **headers})
    got = messages_in(back, 2, until(back, "RECEIPT"))
    assert [(h["destination"], h["subscription"], b) for _, h, b in got] == [
        (topic, "d", b"away 1"),
        (topic, "d", b"away 2"),
    ]
    # UNSUBSCRIBE with durable:true deletes it: nothing is kept any more
    back.frame("UNSUBSCRIBE", {"id": "d", "durable": "true", "receipt": "u"})
    until(back, "RECEIPT", **{"receipt-id": "u"})
    publish(producer, topic, b"nobody")
    again = opened(raws, broker, transport, **sub)
    again.frame("SUBSCRIBE", {"destination": topic, "id": "d", "receipt": "s", **headers})
    until(again, "RECEIPT")
    assert messages_in(again) == []
    again.frame("UNSUBSCRIBE", {"id": "d", "durable": "true"})


@pytest.mark.parametrize("header", ["durable", "persistent"])
def test_a_durable_subscription_outlives_a_plain_unsubscribe(
    broker: Broker, transport: str, raws: list[Raw], header: str
) -> None:
    """A plain UNSUBSCRIBE only stops the deliveries: the queue keeps what comes meanwhile
    for a SUBSCRIBE again with the same id, which has its RECEIPT and then that message
    (issue 30, point 1); only an UNSUBSCRIBE with ``durable: true`` (or ``persistent:
    true``) deletes it."""
    topic = f"/topic/{unique()}"
    headers = {header: "true", "auto-delete": "false"}
    raw = opened(raws, broker, transport, **{"client-id": unique("cl")})
    producer = opened(raws, broker, "tcp")
    assert durable_sub(raw, topic, "d", **headers) == []
    publish(producer, topic, b"while subscribed")
    assert until(raw, "MESSAGE")[-1][2] == b"while subscribed"
    raw.frame("UNSUBSCRIBE", {"id": "d", "receipt": "u1"})
    until(raw, "RECEIPT", **{"receipt-id": "u1"})
    publish(producer, topic, b"while unsubscribed")
    assert durable_sub(raw, topic, "d", **headers) == []  # the RECEIPT comes first
    got = messages_in(raw, 1)
    assert [(h["subscription"], b) for _, h, b in got] == [("d", b"while unsubscribed")]
    # UNSUBSCRIBE with the durable header deletes the queue: nothing is kept after it
    raw.frame("UNSUBSCRIBE", {"id": "d", header: "true", "receipt": "u2"})
    until(raw, "RECEIPT", **{"receipt-id": "u2"})
    publish(producer, topic, b"after the delete")
    assert messages_in(raw, 0, durable_sub(raw, topic, "d", **headers)) == []
    raw.frame("UNSUBSCRIBE", {"id": "d", header: "true"})


def test_a_durable_subscription_without_auto_delete_false_goes_with_its_subscriber(
    broker: Broker, raws: list[Raw]
) -> None:
    topic = f"/topic/{unique()}"
    first = opened(raws, broker, "tcp")
    first.frame("SUBSCRIBE", {"destination": topic, "id": "d", "durable": "true", "receipt": "s"})
    until(first, "RECEIPT")
    leave(first)
    producer = opened(raws, broker, "tcp")
    publish(producer, topic, b"while away")
    back = opened(raws, broker, "tcp")
    back.frame("SUBSCRIBE", {"destination": topic, "id": "d", "durable": "true", "receipt": "s"})
    until(back, "RECEIPT")
    assert messages_in(back) == []


def test_shared_durable_subscriptions_share_the_messages(broker: Broker, raws: list[Raw]) -> None:
    topic = f"/topic/{unique()}"
    a, b = opened(raws, broker, "tcp"), opened(raws, broker, "ws")
    for raw in (a, b):
        durable_sub(raw, topic, "shared", ack="client-individual", **{"prefetch-count": "1"})
    producer = opened(raws, broker, "tcp")
    publish(producer, topic, *[f"m{i}".encode() for i in range(6)])
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    deadline = time.monotonic() + WAIT
    while len(got["a"]) + len(got["b"]) < 6:
        assert time.monotonic() < deadline, got
        for name, raw in (("a", a), ("b", b)):
            for _, headers, body in messages_in(raw):
                got[name].append(body)
                raw.frame("ACK", {"id": headers["ack"]})
    assert got["a"] and got["b"], got  # both had some
    assert sorted(got["a"] + got["b"]) == [f"m{i}".encode() for i in range(6)]  # once each
    a.frame("UNSUBSCRIBE", {"id": "shared", "durable": "true", "receipt": "u"})
    until(a, "RECEIPT", **{"receipt-id": "u"})


@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_a_durable_subscription_needs_an_id(broker: Broker, raws: list[Raw], version: str) -> None:
    raw = opened(raws, broker, "tcp", **{"accept-version": version})
    raw.frame("SUBSCRIBE", {"destination": f"/topic/{unique()}", **DURABLE})
    _, headers, body = raw.read_error()
    assert headers["message"] == "Missing Header"
    assert b"Header 'id' is required for durable subscriptions" in body
    closes(broker, raw)


# ---- 4. x-queue-name and x- queue arguments ------------------------------------------------
def test_x_queue_name_names_the_queue_behind_a_topic_subscription(
    broker: Broker, transport: str, raws: list[Raw]
) -> None:
    topic, name = f"/topic/{unique()}", unique("named")
    consumer = opened(raws, broker, transport)
    consumer.frame(
        "SUBSCRIBE", {"destination": topic, "id": "x", "x-queue-name": name, "receipt": "s"}
    )
    until(consumer, "RECEIPT")
    producer = opened(raws, broker, "tcp")
    publish(producer, topic, b"through the topic")
    publish(producer, f"/amq/queue/{name}", b"straight to the queue")
    got = [(h["destination"], b) for _, h, b in messages_in(consumer, 2)]
    assert got == [(topic, b"through the topic"), (f"/queue/{name}", b"straight to the queue")]


def test_x_queue_name_on_amq_direct_makes_a_queue_bound_with_the_key(
    broker: Broker, transport: str, raws: list[Raw], amqp: Channel
) -> None:
    """SUBSCRIBE ``/exchange/amq.direct/K`` with ``x-queue-name: Q``: a real queue Q, bound
    to amq.direct with key K (issue 30, point 4), that AMQP publishes to by its name."""
    key, name = unique("key"), unique("named")
    consumer = opened(raws, broker, transport)
    consumer.frame(
        "SUBSCRIBE",
        {"destination": f"/exchange/amq.direct/{key}", "id": "x", "x-queue-name": name,
         "receipt": "s"},
    )  # fmt: skip
    until(consumer, "RECEIPT")
    amqp.basic_publish("", name, b"to the queue by its name")
    amqp.basic_publish("amq.direct", key, b"through amq.direct")
    amqp.basic_publish("amq.direct", unique("other"), b"another key")
    got = [(h["subscription"], h["destination"], b) for _, h, b in messages_in(consumer, 2)]
    assert got == [
        ("x", f"/queue/{name}", b"to the queue by its name"),
        ("x", f"/exchange/amq.direct/{key}", b"through amq.direct"),
    ]
    consumer.frame("UNSUBSCRIBE", {"id": "x", "receipt": "u"})
    until(consumer, "RECEIPT", **{"receipt-id": "u"})


def test_x_max_length_on_a_topic_subscription(broker: Broker, raws: list[Raw]) -> None:
    """x-max-length 2 (RabbitMQ drops the oldest by default): a durable subscription away
    while five come back to the last two."""
    topic = f"/topic/{unique()}"
    first = opened(raws, broker, "tcp")
    durable_sub(first, topic, "m", **{"x-max-length": "2"})
    leave(first)
    producer = opened(raws, broker, "tcp")
    publish(producer, topic, *[f"m{i}".encode() for i in range(5)])
    back = opened(raws, broker, "tcp")
    got = messages_in(back, 2, durable_sub(back, topic, "m", **{"x-max-length": "2"}))
    assert [b for _, _, b in got] == [b"m3", b"m4"]
    back.frame("UNSUBSCRIBE", {"id": "m", "durable": "true"})


def holding(raws: list[Raw], broker: Broker, q: str, **args: str) -> tuple[Raw, Raw, str]:
    """A consumer of ``q`` (one message at a time) holding a first message unacknowledged,
    a producer, and that message's ack id. ``args`` (x- headers) go on every frame: RabbitMQ
    declares a SEND's queue too, with its own."""
    consumer = opened(raws, broker, "tcp")
    consumer.frame(
        "SUBSCRIBE",
        {"destination": q, "id": "h", "ack": "client-individual", "prefetch-count": "1",
         "receipt": "s", **args},
    )  # fmt: skip
    until(consumer, "RECEIPT")
    producer = opened(raws, broker, "tcp")
    publish(producer, q, b"first", **args)
    [(_, headers, body)] = until(consumer, "MESSAGE")
    assert body == b"first"
    return consumer, producer, headers["ack"]


def test_x_message_ttl_on_a_queue_subscription(broker: Broker, raws: list[Raw]) -> None:
    q, ttl = f"/queue/{unique()}", {"x-message-ttl": "300"}
    consumer, producer, first = holding(raws, broker, q, **ttl)
    publish(producer, q, b"expires while waiting", **ttl)
    time.sleep(0.8)
    consumer.frame("ACK", {"id": first})
    publish(producer, q, b"fresh", **ttl)
    assert [b for _, _, b in until(consumer, "MESSAGE")] == [b"fresh"]


def test_x_max_priority_on_a_queue_subscription(broker: Broker, raws: list[Raw]) -> None:
    q, priorities = f"/queue/{unique()}", {"x-max-priority": "9"}
    consumer, producer, first = holding(raws, broker, q, **priorities)
    for priority, body in [("1", b"low"), ("8", b"high"), ("4", b"mid")]:
        publish(producer, q, body, priority=priority, **priorities)
    consumer.frame("ACK", {"id": first})
    order = []
    for _ in range(3):
        [(_, headers, body)] = until(consumer, "MESSAGE")
        order.append(body)
        consumer.frame("ACK", {"id": headers["ack"]})
    assert order == [b"high", b"mid", b"low"]


# ---- 2. /exchange/<name>[/<key>] for every exchange ------------------------------------------
def test_amq_fanout(broker: Broker, transport: str, raws: list[Raw]) -> None:
    with_key, without = opened(raws, broker, transport), opened(raws, broker, "tcp")
    with_key.frame("SUBSCRIBE", {"destination": "/exchange/amq.fanout/ignored", "id": "1",
                                 "receipt": "s"})  # fmt: skip
    without.frame("SUBSCRIBE", {"destination": "/exchange/amq.fanout", "id": "1", "receipt": "s"})
    for raw in (with_key, without):
        until(raw, "RECEIPT")
    producer = opened(raws, broker, "tcp")
    body = unique("fan").encode()  # (other tests' messages may cross amq.fanout too)
    publish(producer, f"/exchange/amq.fanout/{body.decode()}", body)
    for raw in (with_key, without):
        dest = f"/exchange/amq.fanout/{body.decode()}"
        assert until(raw, "MESSAGE", destination=dest)[-1][2] == body


def test_an_unknown_exchange_is_not_found(broker: Broker, raws: list[Raw]) -> None:
    raw = opened(raws, broker, "tcp")
    raw.frame("SEND", {"destination": "/exchange/nosuch/a", "receipt": "r"})
    _, headers, body = raw.read_error()
    assert headers["message"] == "not_found"
    assert body == b"NOT_FOUND - no exchange 'nosuch' in vhost '/'"


@pytest.fixture
def amqp(broker: Broker) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    params = pika.ConnectionParameters(
        "127.0.0.1", broker.ports["amqp"], "/", pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    try:
        yield conn.channel()
    finally:
        conn.close()


def test_exchanges_declared_over_amqp(
    broker: Broker, raws: list[Raw], amqp: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    fan, direct, topic, q = unique("fan"), unique("dir"), unique("top"), unique("q")
    amqp.exchange_declare(fan, "fanout", auto_delete=True)
    amqp.exchange_declare(direct, "direct", auto_delete=True)
    amqp.exchange_declare(topic, "topic", auto_delete=True)
    amqp.queue_declare(q, auto_delete=False)
    amqp.queue_bind(q, direct, "k")
    stomp = opened(raws, broker, "tcp")
    for sid, destination in [("f", f"/exchange/{fan}"), ("t", f"/exchange/{topic}/a.*")]:
        stomp.frame("SUBSCRIBE", {"destination": destination, "id": sid, "receipt": sid})
        until(stomp, "RECEIPT", **{"receipt-id": sid})
    # AMQP publishes, STOMP subscribers get them, named by exchange and key
    amqp.basic_publish(fan, "any.key", b"fanned")
    amqp.basic_publish(topic, "a.b", b"matched")
    amqp.basic_publish(topic, "b.b", b"not matched")
    got = [(h["subscription"], h["destination"], b) for _, h, b in messages_in(stomp, 2)]
    assert sorted(got) == [
        ("f", f"/exchange/{fan}/any.key", b"fanned"),
        ("t", f"/exchange/{topic}/a.b", b"matched"),
    ]
    # STOMP sends, the AMQP queue bound to the direct exchange gets it
    publish(stomp, f"/exchange/{direct}/k", b"from stomp")
    publish(stomp, f"/exchange/{direct}/other", b"unbound key")
    method, _, body = amqp.basic_get(q, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == (direct, "k", b"from stomp")
    assert amqp.basic_get(q, auto_ack=True) == (None, None, None)
    amqp.queue_delete(q)


def test_amq_topic_is_stomps_topic(
    broker: Broker, raws: list[Raw], amqp: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    """AMQP's amq.topic with key K is STOMP's /topic/K (and /exchange/amq.topic/K), both
    ways, patterns included (issue 16, point 14)."""
    base, q = unique("ns"), unique("q")
    key = f"{base}.news"
    amqp.queue_declare(q, exclusive=True)
    amqp.queue_bind(q, "amq.topic", f"{base}.#")
    stomp = opened(raws, broker, "tcp")
    for sid, destination in [("p", f"/topic/{base}.*"), ("x", f"/exchange/amq.topic/{key}")]:
        stomp.frame("SUBSCRIBE", {"destination": destination, "id": sid, "receipt": sid})
        until(stomp, "RECEIPT", **{"receipt-id": sid})
    # AMQP publishes to amq.topic: both STOMP subscriptions get it, named /topic/K
    amqp.basic_publish("amq.topic", key, b"from amqp")
    got = [(h["subscription"], h["destination"], b) for _, h, b in messages_in(stomp, 2)]
    assert sorted(got) == [
        ("p", f"/topic/{key}", b"from amqp"),
        ("x", f"/topic/{key}", b"from amqp"),
    ]
    method, _, body = amqp.basic_get(q, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == ("amq.topic", key, b"from amqp")
    # STOMP sends to /topic/K: the AMQP queue bound to amq.topic gets it
    producer = opened(raws, broker, "tcp")
    publish(producer, f"/topic/{key}", b"from stomp")
    assert len(messages_in(stomp, 2)) == 2
    method, _, body = amqp.basic_get(q, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == ("amq.topic", key, b"from stomp")
    assert amqp.basic_get(q, auto_ack=True) == (None, None, None)


# ---- 2b. headers exchanges and exchange-to-exchange bindings (stomp.py and pika) -----------
# Each STOMP side is one stomp.py client over TCP: a binding made over AMQP routes polymq's
# STOMP SENDs once the STOMP frontend reads it, within its records' cache time (2 s), so
# the bindings of a test are all made before its first SEND (and amq.headers and amq.match
# are sent to once per broker).
Channel = pika.adapters.blocking_connection.BlockingChannel


@pytest.fixture
def stomp_tcp(broker: Broker) -> Iterator[StompClient]:
    with clients(broker, "tcp") as make:  # type: ignore[arg-type]  # duck-typed
        yield stomppy(make)


def got(amqp: Channel, queue: str) -> list[tuple[str, str, bytes, dict[str, object]]]:
    """(exchange, routing key, body, headers) of what ``queue`` holds, taken."""
    out = []
    while True:
        method, props, body = amqp.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        headers = {k: v for k, v in (props.headers or {}).items() if k in ("c", "s")}
        out.append((method.exchange, method.routing_key, body, headers))


def declared(amqp: Channel, *queues: str) -> None:
    for q in queues:
        amqp.queue_declare(q, auto_delete=False)


def test_send_to_headers_exchanges(broker: Broker, stomp_tcp: StompClient, amqp: Channel) -> None:
    own = unique("hdr")
    amqp.exchange_declare(own, "headers", auto_delete=True)
    color, size = unique("red"), unique("big")
    queues = {}
    for exchange in ("amq.headers", "amq.match", own):
        every, either, other = unique("all"), unique("any"), unique("none")
        declared(amqp, every, either, other)
        amqp.queue_bind(every, exchange, arguments={"x-match": "all", "c": color, "s": size})
        amqp.queue_bind(either, exchange, arguments={"x-match": "any", "c": color, "s": "no"})
        amqp.queue_bind(other, exchange, arguments={"c": unique("blue")})
        queues[exchange] = (every, either, other)
    for exchange, (every, either, other) in queues.items():
        stomp_tcp.send_receipted(f"/exchange/{exchange}", "both", c=color, s=size)
        stomp_tcp.send_receipted(f"/exchange/{exchange}/a.key", "any", c=color, s="small")
        assert got(amqp, every) == [(exchange, "", b"both", {"c": color, "s": size})]
        assert got(amqp, either) == [  # STOMP headers are AMQP longstr headers
            (exchange, "", b"both", {"c": color, "s": size}),
            (exchange, "a.key", b"any", {"c": color, "s": "small"}),
        ]
        assert got(amqp, other) == []
        for q in (every, either, other):
            amqp.queue_delete(q)


def test_send_to_amq_direct_goes_through_its_bindings(
    broker: Broker, stomp_tcp: StompClient, amqp: Channel
) -> None:
    """SEND ``/exchange/amq.direct/K`` is a basic.publish to amq.direct with key K: the
    queues bound with K get it (an AMQP one, a SUBSCRIBE's own, one named by
    ``x-queue-name``), the queue named K (the default exchange's) does not."""
    key, bound, named = unique("key"), unique("bound"), unique("named")
    declared(amqp, bound, key)
    amqp.queue_bind(bound, "amq.direct", key)
    destination = f"/exchange/amq.direct/{key}"
    stomp_tcp.subscribe(destination, "own")
    stomp_tcp.subscribe(destination, "named", **{"x-queue-name": named})
    stomp_tcp.send_receipted(destination, "through amq.direct")
    stomp_tcp.send_receipted(f"/exchange/amq.direct/{unique('other')}", "another key")
    stomp_tcp.listener.wait_messages(2)
    time.sleep(QUIET)
    shown = sorted(
        (m.headers["subscription"], m.headers["destination"], m.body)
        for m in stomp_tcp.listener.messages
    )
    assert shown == [
        ("named", destination, "through amq.direct"),
        ("own", destination, "through amq.direct"),
    ]
    assert [g[:3] for g in got(amqp, bound)] == [("amq.direct", key, b"through amq.direct")]
    assert got(amqp, key) == []
    for q in (bound, key):
        amqp.queue_delete(q)


def test_send_to_amq_fanout_reaches_its_bound_queues(
    broker: Broker, stomp_tcp: StompClient, amqp: Channel
) -> None:
    bound = unique("fanned")
    declared(amqp, bound)
    amqp.queue_bind(bound, "amq.fanout")
    body = unique("fan")  # (other tests' messages may cross amq.fanout too)
    stomp_tcp.send_receipted(f"/exchange/amq.fanout/{body}", body)
    assert ("amq.fanout", body, body.encode()) in [g[:3] for g in got(amqp, bound)]
    amqp.queue_delete(bound)


def test_send_follows_exchange_bindings(
    broker: Broker, stomp_tcp: StompClient, amqp: Channel
) -> None:
    source, fan, hdr = unique("src"), unique("fan"), unique("hdr")
    amqp.exchange_declare(source, "direct", auto_delete=True)
    amqp.exchange_declare(fan, "fanout", auto_delete=True)
    amqp.exchange_declare(hdr, "headers", auto_delete=True)
    amqp.exchange_bind(destination=fan, source=source, routing_key="k")
    amqp.exchange_bind(destination=hdr, source=fan)
    on_source, on_fan, on_both, on_hdr = unique("qs"), unique("qf"), unique("qb"), unique("qh")
    declared(amqp, on_source, on_fan, on_both, on_hdr)
    amqp.queue_bind(on_source, source, "k")
    amqp.queue_bind(on_fan, fan)
    amqp.queue_bind(on_both, source, "k")
    amqp.queue_bind(on_both, fan)
    amqp.queue_bind(on_hdr, hdr, arguments={"x-match": "all", "h": "yes"})
    stomp_tcp.send_receipted(f"/exchange/{source}/k", "bound", h="yes")
    stomp_tcp.send_receipted(f"/exchange/{source}/other", "not bound", h="yes")
    for q in (on_source, on_fan, on_both, on_hdr):  # each queue once, told E and K
        assert [g[:3] for g in got(amqp, q)] == [(source, "k", b"bound")], q
        amqp.queue_delete(q)


def test_subscribe_to_a_headers_exchange(
    broker: Broker, stomp_tcp: StompClient, amqp: Channel
) -> None:
    """RabbitMQ binds the subscription's queue with no arguments: it gets every message."""
    own = unique("hdr")
    amqp.exchange_declare(own, "headers", auto_delete=True)
    stomp_tcp.subscribe(f"/exchange/{own}", "plain", h="only")  # not a binding argument
    stomp_tcp.subscribe(f"/exchange/{own}/some.key", "keyed")
    props = pika.BasicProperties(headers={"h": "anything"})
    amqp.basic_publish(own, "", b"no key", props)
    amqp.basic_publish(own, "a.key", b"a key", props)
    frames = stomp_tcp.listener.wait_messages(4)
    time.sleep(QUIET)
    shown = sorted(
        (m.headers["subscription"], m.headers["destination"], m.body, m.headers["h"])
        for m in stomp_tcp.listener.messages
    )
    assert len(frames) == 4
    assert shown == [  # as RabbitMQ names them: no key, no trailing /
        ("keyed", f"/exchange/{own}", "no key", "anything"),
        ("keyed", f"/exchange/{own}/a.key", "a key", "anything"),
        ("plain", f"/exchange/{own}", "no key", "anything"),
        ("plain", f"/exchange/{own}/a.key", "a key", "anything"),
    ]


def test_message_destination_is_where_it_was_sent(
    broker: Broker, stomp_tcp: StompClient, amqp: Channel
) -> None:
    """A MESSAGE names the exchange and key a message was published to, not the exchange
    (bound to it) that the subscription listens to."""
    source, fan = unique("src"), unique("fan")
    amqp.exchange_declare(source, "topic", auto_delete=True)
    amqp.exchange_declare(fan, "fanout", auto_delete=True)
    amqp.exchange_bind(destination=fan, source=source, routing_key="a.*")
    stomp_tcp.subscribe(f"/exchange/{fan}", "fan")
    stomp_tcp.subscribe(f"/exchange/{source}/#", "src")
    stomp_tcp.send_receipted(f"/exchange/{source}/a.b", "from stomp")
    amqp.basic_publish(source, "a.c", b"from amqp")
    amqp.basic_publish(fan, "", b"to the fanout")
    stomp_tcp.listener.wait_messages(5)
    time.sleep(QUIET)
    shown = sorted(
        (m.headers["subscription"], m.headers["destination"], m.body)
        for m in stomp_tcp.listener.messages
    )
    assert shown == [
        ("fan", f"/exchange/{fan}", "to the fanout"),
        ("fan", f"/exchange/{source}/a.b", "from stomp"),
        ("fan", f"/exchange/{source}/a.c", "from amqp"),
        ("src", f"/exchange/{source}/a.b", "from stomp"),
        ("src", f"/exchange/{source}/a.c", "from amqp"),
    ]
