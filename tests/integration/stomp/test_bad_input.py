"""Bad input over a live socket, TCP and WebSocket, against a ``polymq run`` with small
limits: every refusal is an ERROR frame with a ``message`` header (and the refused frame's
``receipt`` as ``receipt-id``) that the client reads *before* the connection closes; two
stomp.py bystanders (one per transport) connected for the whole module keep working
throughout; and messages whose RECEIPT a producer got are not lost when its connection is
then refused or killed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ...procs import PolymqProcess
from .helpers import (
    Clients,
    Raw,
    RawWs,
    StompClient,
    clients,
    control,
    encode,
    raw_client,
    unique,
)

pytestmark = pytest.mark.timeout(60)

MAX_FRAME = 64 * 1024
MAX_HEADERS = 16
MAX_HEADER_LENGTH = 1024
MAX_SUBSCRIPTIONS = 4
LIMITS = {
    "POLYMQ_STOMP_MAX_FRAME": str(MAX_FRAME),
    "POLYMQ_STOMP_MAX_HEADERS": str(MAX_HEADERS),
    "POLYMQ_STOMP_MAX_HEADER_LENGTH": str(MAX_HEADER_LENGTH),
    "POLYMQ_STOMP_MAX_SUBSCRIPTIONS": str(MAX_SUBSCRIPTIONS),
}


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir: Path = tmp_path_factory.mktemp("stomp-limits")
    with PolymqProcess("run", workdir, env=LIMITS) as proc:
        yield proc


class Bystanders:
    """A stomp.py client per transport, connected before the first bad input and used after
    each: TCP sends to WebSocket and back."""

    def __init__(self, proc: PolymqProcess) -> None:
        self.tcp = StompClient(proc, "tcp").connect()
        self.ws = StompClient(proc, "ws").connect()
        self.q_tcp, self.q_ws = f"/queue/{unique()}", f"/queue/{unique()}"
        self.tcp.subscribe(self.q_tcp)
        self.ws.subscribe(self.q_ws)
        self.rounds = 0

    def check(self) -> None:
        self.rounds += 1
        body = f"round {self.rounds}"
        self.tcp.send_receipted(self.q_ws, body)
        self.ws.send_receipted(self.q_tcp, body)
        assert self.ws.listener.wait_messages(self.rounds)[-1].body == body
        assert self.tcp.listener.wait_messages(self.rounds)[-1].body == body
        for c in (self.tcp, self.ws):
            assert c.conn.is_connected()
            assert not c.listener.errors
            assert not c.listener.disconnected.is_set()

    def close(self) -> None:
        self.tcp.close()
        self.ws.close()


@pytest.fixture(scope="module")
def bystanders(limited: PolymqProcess) -> Iterator[Bystanders]:
    b = Bystanders(limited)
    yield b
    b.close()


@pytest.fixture
def raw(limited: PolymqProcess, transport: str, bystanders: Bystanders) -> Iterator[Raw]:
    """A raw connection for bad input; the bystanders must work before and after."""
    bystanders.check()
    r = raw_client(limited, transport)
    yield r
    r.close()
    bystanders.check()


CONNECT = encode("CONNECT", {"accept-version": "1.2", "host": "localhost"})


@dataclass(frozen=True)
class Case:
    data: bytes  # sent after CONNECT (unless it starts with one itself, or ``before``)
    message: str  # the ERROR's message header
    detail: str = ""  # in the ERROR's body
    receipt: str | None = None  # the ERROR's receipt-id
    before: bool = False  # sent before any CONNECT


def frame(command: str, body: bytes = b"", /, **headers: str) -> bytes:
    return encode(command, headers, body)


SUB = "SUBSCRIBE"
CASES = {
    # before CONNECT
    "send-before-connect": Case(
        frame("SEND", b"early", destination="/queue/x"), "Illegal command", before=True
    ),
    "subscribe-before-connect": Case(
        frame(SUB, destination="/queue/x", id="1"), "Illegal command", before=True
    ),
    "unknown-command-first": Case(frame("HELLO"), "Bad command", "HELLO", before=True),
    "http-request": Case(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "Bad command", before=True),
    "tls-client-hello": Case(
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(1, 200)),
        "Bad command",
        before=True,
    ),
    "malformed-accept-version": Case(
        frame("CONNECT", **{"accept-version": "1.x", "host": "h"}),
        "Version mismatch",
        "Supported versions are 1.0,1.1,1.2",
        before=True,
    ),
    "malformed-heart-beat": Case(
        frame("CONNECT", **{"accept-version": "1.2", "heart-beat": "fast", "host": "h"}),
        "Invalid header",
        before=True,
    ),
    "heart-beat-of-non-ascii-digits": Case(  # int() takes them; RabbitMQ does not
        frame("CONNECT", **{"accept-version": "1.2", "heart-beat": "\u0661,\u0662", "host": "h"}),
        "Invalid header",
        "heart-beat",
        before=True,
    ),
    "heart-beat-of-400-digits": Case(  # past a float's range
        frame("CONNECT", **{"accept-version": "1.2", "heart-beat": "9" * 400 + ",0", "host": "h"}),
        "Invalid header",
        "heart-beat",
        before=True,
    ),
    # after CONNECT
    "connect-twice": Case(CONNECT, "Illegal command"),
    "unknown-command": Case(frame("PUBLISH", destination="/queue/x"), "Bad command"),
    "server-command": Case(frame("MESSAGE", destination="/queue/x"), "Bad command"),
    "garbage-bytes": Case(b"\xde\xad\xbe\xef\xff\n\n\0", "Bad command"),
    "nul-in-headers": Case(b"SEND\ndestination:/queue/\0x\n\n\0", "malformed frame"),
    "header-without-colon": Case(
        b"SEND\ndestination:/queue/x\nnocolon\n\nbody\0", "malformed header"
    ),
    "bad-escape": Case(frame("SEND", destination="/queue/x", x="a\\tb"), "invalid escape"),
    "frame-too-large": Case(
        frame("SEND", b"x" * (MAX_FRAME + 10), destination="/queue/x"),
        "frame too large",
        str(MAX_FRAME),
    ),
    "content-length-too-large": Case(
        b"SEND\ndestination:/queue/x\ncontent-length:100000000\n\nonly the start",
        "frame too large",
    ),
    "bad-content-length": Case(
        frame("SEND", b"abc", destination="/queue/x", **{"content-length": "three"}),
        "invalid content-length",
    ),
    "no-nul-after-content-length": Case(
        b"SEND\ndestination:/queue/x\ncontent-length:2\n\nabc\0", "malformed frame"
    ),
    "too-many-headers": Case(
        frame("SEND", destination="/queue/x", **{f"h{i}": "v" for i in range(MAX_HEADERS + 4)}),
        "too many headers",
        str(MAX_HEADERS),
    ),
    "header-too-long": Case(
        frame("SEND", destination="/queue/x", x="v" * (MAX_HEADER_LENGTH + 100)),
        "header too long",
        str(MAX_HEADER_LENGTH),
    ),
    "bad-ack-id": Case(
        frame("ACK", id="1.999", receipt="a"),
        "Invalid header",
        '"ACK" must include a valid "id" header',
        "a",
    ),
    "ack-id-of-a-superscript-digit": Case(  # isdigit(), but int() refuses it
        frame("ACK", id="\u00b2.1", receipt="a"),
        "Invalid header",
        '"ACK" must include a valid "id" header',
        "a",
    ),
    "bad-nack-id": Case(
        frame("NACK", id="nonsense"), "Invalid header", '"NACK" must include a valid "id" header'
    ),
    "ack-without-id": Case(frame("ACK"), "Missing header", '"id"'),
    "unknown-subscription": Case(
        frame("UNSUBSCRIBE", id="nope", receipt="u"), "No subscription found", "nope", "u"
    ),
    "duplicate-subscription": Case(
        frame(SUB, destination="/queue/d", id="1") + frame(SUB, destination="/queue/e", id="1"),
        "Duplicated subscription identifier",
    ),
    "subscribe-without-id": Case(frame(SUB, destination="/queue/x"), "Missing header"),
    "too-many-subscriptions": Case(
        b"".join(
            frame(SUB, destination=f"/queue/many{i}", id=str(i))
            for i in range(MAX_SUBSCRIPTIONS + 1)
        ),
        "Too many subscriptions",
        str(MAX_SUBSCRIPTIONS),
    ),
    "unknown-destination-prefix": Case(
        frame("SEND", b"lost", destination="/nowhere/x", receipt="r1"),
        "Unknown destination",
        "Valid destination types are: /temp-queue, /exchange, /topic, /queue, /amq/queue",
        "r1",
    ),
    "slash-in-a-name": Case(
        frame(SUB, destination="/queue/a/b", id="1"),
        "Invalid destination",
        "'/a/b' is not a valid queue destination",
    ),
    "bad-characters": Case(
        frame("SEND", destination="/queue/a b"), "Invalid destination", "/queue/a b"
    ),
    "missing-destination": Case(
        frame("SEND", b"where?"), "Missing destination", "\"SEND\" must include a 'destination'"
    ),
    "unknown-exchange": Case(
        frame("SEND", destination="/exchange/nosuch/x", receipt="x"),
        "not_found",
        "NOT_FOUND - no exchange 'nosuch' in vhost '/'",
        "x",
    ),
    "subscribe-to-an-unknown-exchange": Case(
        frame(SUB, destination="/exchange/nosuch", id="1"),
        "not_found",
        "NOT_FOUND - no exchange 'nosuch' in vhost '/'",
    ),
    "subscribe-to-control": Case(
        frame(SUB, destination="/control/count-msgs/queue/x", id="1"),
        "Invalid destination",
    ),
    "count-msgs-of-a-topic": Case(
        frame("SEND", destination="/control/count-msgs/topic/x", receipt="c"),
        "Invalid destination",
        receipt="c",
    ),
    "bad-priority": Case(
        frame("SEND", destination="/queue/x", priority="11"), "Invalid header", "priority"
    ),
    "bad-persistent": Case(
        frame("SEND", destination="/queue/x", persistent="maybe", receipt="p"),
        "Invalid header",
        receipt="p",
    ),
    "bad-prefetch": Case(
        frame(SUB, destination="/queue/x", id="1", **{"prefetch-count": "-5"}),
        "Invalid header",
    ),
    "bad-ack-timeout": Case(
        frame(SUB, destination="/queue/x", id="1", ack="client", **{"ack-timeout": "-1"}),
        "Invalid header",
    ),
    "bad-ack-mode": Case(
        frame(SUB, destination="/queue/x", id="1", ack="sometimes"), "Invalid header", "ack"
    ),
    "stream-offset-past-64-bits": Case(
        frame(SUB, destination="/stream/x", id="1", receipt="o", **{"x-stream-offset": "9" * 25}),
        "Invalid header",
        "x-stream-offset",
        "o",
    ),
    "stream-offset-past-a-sequence": Case(  # 2**63: past what a stream's sequences reach
        frame(SUB, destination="/stream/x", id="1", **{"x-stream-offset": "9223372036854775808"}),
        "Invalid header",
        "x-stream-offset",
    ),
    "stream-offset-on-a-queue": Case(
        frame(SUB, destination="/queue/x", id="1", **{"x-stream-offset": "first"}),
        "Invalid header",
    ),
    "unknown-transaction": Case(
        frame("SEND", destination="/queue/x", transaction="nope"), "Bad transaction"
    ),
    "commit-without-transaction": Case(frame("COMMIT"), "Missing transaction"),
    "duplicate-transaction": Case(
        frame("BEGIN", transaction="t") + frame("BEGIN", transaction="t"), "Bad transaction"
    ),
    "abort-unknown-transaction": Case(frame("ABORT", transaction="t"), "Bad transaction"),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_gets_an_error_frame_before_the_close(raw: Raw, case: Case) -> None:
    if not case.before:
        raw.connect()
    raw.send(case.data)
    _, headers, body = raw.read_error()
    assert headers["message"] == case.message, (headers, body)
    assert body and case.detail.encode() in body, body  # a body that explains
    assert headers.get("receipt-id") == case.receipt
    assert headers["content-type"] == "text/plain"
    assert raw.closed_by_server()


def test_frames_at_the_limits_are_accepted(raw: Raw, limited: PolymqProcess) -> None:
    """Exactly the maximum number of headers, a header line of the maximum length and a
    frame of about the maximum size go through, both ways."""
    q = f"/queue/{unique()}"
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": q, "id": "1", "receipt": "sub"})
    assert raw.read_frame()[0] == "RECEIPT"
    headers = {"destination": q, "receipt": "many"}
    headers |= {f"h{i}": "v" for i in range(MAX_HEADERS - len(headers))}
    raw.frame("SEND", headers, b"many headers")
    long_value = "v" * (MAX_HEADER_LENGTH - len("x-long:"))
    raw.frame("SEND", {"destination": q, "x-long": long_value, "receipt": "long"}, b"long")
    body = b"b" * (MAX_FRAME - 200)
    raw.frame("SEND", {"destination": q, "receipt": "big"}, body)
    frames = [raw.read_frame() for _ in range(6)]
    receipts = {h["receipt-id"] for c, h, _ in frames if c == "RECEIPT"}
    messages = [(h, b) for c, h, b in frames if c == "MESSAGE"]
    assert receipts == {"many", "long", "big"}
    assert [b for _, b in messages] == [b"many headers", b"long", body]
    assert messages[1][0]["x-long"] == long_value


def test_error_frame_survives_a_client_that_keeps_sending(raw: Raw) -> None:
    """The ERROR is readable even when the client goes on writing after its bad frame (a
    plain close with unread input would reset the connection and destroy the ERROR)."""
    raw.connect()
    raw.send(frame("SEND", destination="/nowhere"))
    try:
        for i in range(200):
            raw.send(frame("SEND", b"x" * 1000, destination=f"/queue/after{i}"))
    except OSError:
        pass  # the server may have closed already: what matters is what we can read
    _, headers, _ = raw.read_error()
    assert headers["message"] == "Unknown destination"


def test_frames_behind_a_refused_one_are_ignored(raw: Raw, limited: PolymqProcess) -> None:
    """Nothing the client pipelines behind a refused frame takes effect."""
    q = f"/queue/{unique()}"
    raw.connect()
    raw.send(frame("SEND", destination="/nowhere") + frame("SEND", b"after", destination=q))
    raw.read_error()
    assert raw.closed_by_server()
    with clients(limited, "tcp") as make:
        c = make()
        assert control(c, f"/control/count-msgs{q}")["num-messages"] == "0"


def test_oversized_websocket_message_gets_an_error_frame(
    limited: PolymqProcess, bystanders: Bystanders
) -> None:
    """A frame several times over the limit in one WebSocket message is refused like any
    other frame too large: ERROR first, then the close (not a bare WebSocket close)."""
    raw = RawWs(limited.ports["stomp_ws"])
    try:
        raw.connect()
        raw.send(frame("SEND", b"x" * (4 * MAX_FRAME), destination="/queue/x"))
        _, headers, _ = raw.read_error()
        assert headers["message"] == "frame too large"
        assert raw.closed_by_server()
    finally:
        raw.close()
    bystanders.check()


# ---- messages already acknowledged are not lost ------------------------------------------
def consume_all(make: Clients, q: str, receipted: list[str]) -> list[str]:
    """Subscribe to ``q`` and return what arrives once every receipted body has."""
    c = make()
    c.subscribe(q)
    c.listener.wait(lambda: set(receipted) <= set(c.listener.bodies()))
    time.sleep(0.3)  # let stragglers (sent, never receipted) arrive too
    return c.listener.bodies()


def test_receipted_sends_survive_a_refusal_on_the_same_connection(
    raw: Raw, limited: PolymqProcess
) -> None:
    q = f"/queue/{unique()}"
    raw.connect()
    raw.send(b"".join(frame("SEND", f"m{i}".encode(), destination=q, receipt=f"m{i}")
                      for i in range(5)))  # fmt: skip
    receipts = [raw.read_frame() for _ in range(5)]
    assert [h["receipt-id"] for _, h, _ in receipts] == [f"m{i}" for i in range(5)]
    raw.send(b"\xff\xfe garbage\n\n\0")
    raw.read_error()
    assert raw.closed_by_server()
    with clients(limited, "tcp") as make:
        got = consume_all(make, q, [f"m{i}" for i in range(5)])
    assert got == [f"m{i}" for i in range(5)]


@pytest.mark.parametrize("persistent", ["true", "false"])
def test_receipted_sends_survive_a_killed_producer(
    raw: Raw, limited: PolymqProcess, persistent: str
) -> None:
    """A producer pipelines 300 SENDs, reads some receipts and dies (TCP reset): every
    message it had a RECEIPT for is delivered, and none twice."""
    q = f"/queue/{unique()}"
    raw.connect()
    raw.send(
        b"".join(
            frame("SEND", f"m{i}".encode(), destination=q, receipt=f"m{i}", persistent=persistent)
            for i in range(300)
        )
    )
    receipted: list[str] = []
    while len(receipted) < 50:
        command, headers, _ = raw.read_frame()
        assert command == "RECEIPT", headers
        receipted.append(headers["receipt-id"])
    raw.kill()
    with clients(limited, "tcp") as make:
        got = consume_all(make, q, receipted)
    assert set(receipted) <= set(got)
    assert len(got) == len(set(got)), "a message was delivered twice"
    assert got == sorted(got, key=lambda b: int(b[1:])), "out of order"


def test_connection_limits_do_not_leak(limited: PolymqProcess, bystanders: Bystanders) -> None:
    """After every refusal above, a new client still gets its full quota of subscriptions."""
    with clients(limited, "ws") as make:
        c = make()
        for i in range(MAX_SUBSCRIPTIONS):
            c.subscribe(f"/queue/{unique()}", sid=str(i))
        assert not c.listener.errors
    bystanders.check()
