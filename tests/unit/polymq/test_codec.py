"""Tests for polymq.codec: the sans-IO wire codec.

Every received byte stream goes through ``tr`` (whole, one byte at a time, with trailing data)
and every event round-trips through a ``ConnectionPair``; see ``helpers.py``.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymq import codec
from polymq.codec import (
    DEFAULT_MAX_FRAME,
    EVENT_BYTES,
    NEED_DATA,
    PREAMBLE,
    PROTOCOL_VERSION,
    TRANSITIONS,
    Connection,
    Role,
    State,
    weight,
)
from polymq.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from polymq.events import (
    EVENT_TYPES,
    Ack,
    Bind,
    Bindings,
    Cancelled,
    CursorClose,
    CursorOpen,
    CursorPoll,
    Declare,
    Delete,
    Deliver,
    Event,
    Fail,
    Goodbye,
    Hello,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    MetaGet,
    MetaSet,
    Nack,
    Ok,
    Peek,
    Peeked,
    Ping,
    Polled,
    Publish,
    Pull,
    Pulled,
    Purge,
    Settle,
    Stats,
    Subscribe,
    Unbind,
    Unsubscribe,
    Welcome,
)
from polymq.types import WIRE_FIELDS, Message

from .helpers import (
    HELLO,
    WELCOME,
    ConnectionPair,
    chunked,
    frame,
    get_all_events,
    open_connection,
    receive,
    tr,
)

FULL_MESSAGE = Message(
    body=b"\x00\x01\x00\xff binary\x00",
    content_type="text/plain; charset=utf-8",
    headers={"x-ünïcode": "välue ✓ 日本", "empty": "", "nul": "a\x00b"},
    priority=9,
    persistent=True,
    expires=1_700_000_000.25,
    ack_timeout=2.5,
    correlation_id="corr-42",
    reply_to="queue/replies",
    id="0190b7e8-msg",
    seq=2**40 + 1,
    timestamp=1_699_999_999.125,
    delivery_count=3,
    destination="queue/orders",
)
PLAIN_MESSAGE = Message(b"")

# Representative events each side sends once OPEN: every client request and server answer.
CLIENT_EVENTS: list[Event] = [
    Publish(1, "queue/orders", [FULL_MESSAGE, PLAIN_MESSAGE]),
    Publish(0, "topic/news.sport", [Message(b"fire and forget")]),
    Publish(2, "channel/rpc", [Message(b"\x00")], role="client"),
    Publish(3, "stream/events", [Message(b"r")], batch_id="spark-0-1", batch_ttl=60.0),
    Declare(
        3,
        "queue/orders",
        {"durable": True, "max_length": 10, "overflow": "drop-oldest", "idle_ttl": 1.5},
    ),
    Declare(4, "stream/log", {}),
    Delete(5, "topic/news"),
    Purge(6, "queue/orders"),
    Subscribe(7, 1, "topic/news.#", {"ack_mode": "client", "offset": {"timestamp": 1.5}}),
    Unsubscribe(8, 1),
    Ack(9, 1, [1, 2, 3], True),
    Ack(0, 2, []),
    Nack(10, 1, [4, 5], False, True),
    Nack(11, 1, [6]),
    Pull(12, "queue/jobs", 32, 0.5, 30.0),
    Settle(13, ["lease-1", "lease-2"], "requeue"),
    Stats(14, "stream/log"),
    MetaGet(15, "queue/orders"),
    MetaSet(16, "queue/orders", {"owner": "ops", "ключ": "значение"}),
    KvGet(17, "config/ünï"),
    KvPut(18, "config/x", b"\x00value\x00\xff"),
    KvDelete(19, "config/x"),
    KvList(20, "config/", 100),
    Ping(2**63 - 1),
    CursorOpen(20, "topic/news.#", {"offset": "first", "ttl": 60.0, "buffer": 100}),
    CursorPoll(21, "c-1", None, 100, 2.5),
    CursorPoll(22, "c-1", 42, 1, 0.0),
    CursorClose(23, "c-1"),
    Bind(24, "topic/amqp.vh.orders.#", "queue/audit"),
    Bind(25, "topic/news.sp*", "queue/ünï"),
    Unbind(26, "topic/amqp.vh.orders.*.eu", "queue/audit"),
    Bindings(27, "queue/audit"),
    Peek(28, "queue/orders", 10),
    Peek(29, "channel/rpc", 100, "client"),
]
SERVER_EVENTS: list[Event] = [
    Ok(1),
    Ok(2, {"count": 3, "nested": [1, "a", None, b"\x00\x01", 1.5, True, {"k": "v"}]}),
    Fail(3, "not-found", "no queue 'orders' — ünïcode"),
    Deliver(1, [1, 2], [FULL_MESSAGE, PLAIN_MESSAGE]),
    Pulled(12, ["lease-1"], [FULL_MESSAGE]),
    Polled(21, 7, ["", "queue/q|3|9"], [FULL_MESSAGE, PLAIN_MESSAGE]),
    Peeked(28, [FULL_MESSAGE, PLAIN_MESSAGE]),
    Peeked(29, []),
    Cancelled(1, "slow-consumer", "the subscriber's buffer overflowed"),
]


def test_samples_cover_every_event_type() -> None:
    covered = {type(e) for e in [*CLIENT_EVENTS, *SERVER_EVENTS]} | {Hello, Welcome, Goodbye}
    assert covered == set(EVENT_TYPES.values())


# ---- handshake --------------------------------------------------------------------------


def test_handshake_states_and_preamble() -> None:
    pair = ConnectionPair()
    assert pair.client.state is State.HELLO
    assert pair.server.state is State.PREAMBLE

    data = pair.send(Role.CLIENT, HELLO)
    assert data.startswith(PREAMBLE)
    assert pair.client.state is State.WELCOME
    assert pair.server.state is State.WELCOME

    data = pair.send(Role.SERVER, WELCOME)
    assert not data.startswith(PREAMBLE)
    assert pair.client.state is State.OPEN
    assert pair.server.state is State.OPEN

    # the preamble goes once, ahead of the client's first frame only
    data = pair.send(Role.CLIENT, Ping(1))
    assert not data.startswith(PREAMBLE)
    assert data == frame([Ping.OP, 1])


def test_wire_format_is_pinned() -> None:
    """The bytes on the wire, by hand: preamble, big-endian length, msgpack ops in field order."""
    assert PREAMBLE == b"PMQ\x01"
    assert PROTOCOL_VERSION == 1
    client = Connection(Role.CLIENT)
    data = client.send(Hello(1, "py", "alice", "pw"))
    payload = msgpack.packb([[1, 1, "py", "alice", "pw", None]], use_bin_type=True)
    assert data == b"PMQ\x01" + len(payload).to_bytes(4, "big") + payload
    server = open_connection(Role.SERVER)
    assert server.send(Ok(5, b"\x00")) == frame([40, 5, b"\x00"])
    # bytes are msgpack bin, str is msgpack str: they do not collapse into one another
    assert b"\xc4\x01\x00" in server.send(Ok(6, b"\x00"))
    assert b"\xa1x" in server.send(Ok(7, "x"))


def test_server_reads_preamble_and_hello() -> None:
    data = PREAMBLE + frame([Hello.OP, 1, "py", None, "secret", "tok"])
    tr(
        lambda: Connection(Role.SERVER),
        data,
        [Hello(1, "py", None, "secret", "tok")],
        state=State.WELCOME,
    )


def test_server_reads_preamble_alone() -> None:
    tr(lambda: Connection(Role.SERVER), PREAMBLE, [], state=State.HELLO)


def test_hello_optional_fields_may_be_left_off() -> None:
    data = PREAMBLE + frame([Hello.OP, 1, "py"])
    tr(lambda: Connection(Role.SERVER), data, [Hello(1, "py")], state=State.WELCOME)


def test_client_reads_welcome() -> None:
    def make() -> Connection:
        client = Connection(Role.CLIENT)
        client.send(HELLO)
        return client

    welcome = Welcome(1, "polymq-core/0.1", "s-ü", {"max_frame": 1 << 20, "max_wait": 60.0})
    tr(make, frame([Welcome.OP, *dataclasses.astuple(welcome)]), [welcome], state=State.OPEN)


def test_pipelined_requests_after_hello_before_welcome() -> None:
    pair = ConnectionPair()
    pair.send(Role.CLIENT, HELLO)
    pair.send(Role.CLIENT, Publish(1, "queue/a", [Message(b"x")]))
    pair.send(Role.CLIENT, [Ping(2), Subscribe(3, 1, "topic/t", {})])
    assert pair.server.state is State.WELCOME
    # the server answers nothing before its Welcome ...
    with pytest.raises(LocalProtocolError):
        pair.server.send(Ok(1))
    assert pair.server.state is State.WELCOME
    # ... and everything after it
    pair.send(Role.SERVER, [WELCOME, Ok(1), Ok(2), Ok(3)])
    assert pair.client.state is State.OPEN


def test_pipelined_requests_in_one_read() -> None:
    client = Connection(Role.CLIENT)
    data = client.send(HELLO) + client.send(Ping(1)) + client.send_many([Ping(2), Ping(3)])
    tr(
        lambda: Connection(Role.SERVER),
        data,
        [HELLO, Ping(1), Ping(2), Ping(3)],
        state=State.WELCOME,
    )


# ---- every event round-trips -----------------------------------------------------------------


@pytest.mark.parametrize("event", CLIENT_EVENTS, ids=lambda e: type(e).__name__)
def test_client_event_round_trips(event: Event) -> None:
    pair = ConnectionPair()
    pair.handshake()
    data = pair.send(Role.CLIENT, event)
    tr(lambda: open_connection(Role.SERVER), data, [event], state=State.OPEN)


@pytest.mark.parametrize("event", SERVER_EVENTS, ids=lambda e: type(e).__name__)
def test_server_event_round_trips(event: Event) -> None:
    pair = ConnectionPair()
    pair.handshake()
    data = pair.send(Role.SERVER, event)
    tr(lambda: open_connection(Role.CLIENT), data, [event], state=State.OPEN)


def test_message_round_trips_every_field() -> None:
    pair = ConnectionPair()
    pair.handshake()
    pair.send(Role.CLIENT, Publish(1, "queue/orders", [FULL_MESSAGE]))
    pair.send(Role.SERVER, Deliver(3, [99], [FULL_MESSAGE]))
    # and the received message is equal field by field, with the right types
    server = open_connection(Role.SERVER)
    server.receive_data(open_connection(Role.CLIENT).send(Publish(1, "q", [FULL_MESSAGE])))
    (ev,) = get_all_events(server)
    assert isinstance(ev, Publish)
    (got,) = ev.messages
    for name in WIRE_FIELDS:
        assert getattr(got, name) == getattr(FULL_MESSAGE, name), name
        assert type(getattr(got, name)) is type(getattr(FULL_MESSAGE, name)), name
    assert got.redelivered


def test_bytearray_body_arrives_as_bytes() -> None:
    pair = ConnectionPair()
    pair.handshake()
    body = bytearray(b"\x00ab")
    pair.send(Role.CLIENT, Publish(1, "queue/a", [Message(body)]))  # type: ignore[arg-type]
    data = open_connection(Role.CLIENT).send(Publish(1, "queue/a", [Message(body)]))  # type: ignore[arg-type]
    server = open_connection(Role.SERVER)
    server.receive_data(data)
    (ev,) = get_all_events(server)
    assert isinstance(ev, Publish)
    assert type(ev.messages[0].body) is bytes


def test_send_many_is_one_frame() -> None:
    pair = ConnectionPair()
    pair.handshake()
    data = pair.send(Role.CLIENT, CLIENT_EVENTS)
    (length,) = struct.unpack_from(">I", data)
    assert length == len(data) - 4  # one length prefix for all of them
    tr(lambda: open_connection(Role.SERVER), data, CLIENT_EVENTS, state=State.OPEN)

    data = pair.send(Role.SERVER, SERVER_EVENTS)
    assert struct.unpack_from(">I", data)[0] == len(data) - 4
    tr(lambda: open_connection(Role.CLIENT), data, SERVER_EVENTS, state=State.OPEN)


def test_send_many_large_batch() -> None:
    pair = ConnectionPair()
    pair.handshake()
    acks = [Ack(0, 1, [i]) for i in range(2000)]
    data = pair.send(Role.CLIENT, acks)
    assert struct.unpack_from(">I", data)[0] == len(data) - 4


def test_send_frames_packs_small_events_together_and_a_big_one_alone() -> None:
    client = open_connection(Role.CLIENT)
    events = [Ack(0, 1, [i]) for i in range(5)]
    frames = client.send_frames(events, [10, 10, 100, 10, 10], frame_bytes=25)
    # 10+10 | 100 (alone) | 10+10
    assert [struct.unpack_from(">I", f)[0] == len(f) - 4 for f in frames] == [True] * 3
    tr(lambda: open_connection(Role.SERVER), b"".join(frames), events, state=State.OPEN)
    counts = [len(msgpack.unpackb(f[4:])) for f in frames]
    assert counts == [2, 1, 2]


@pytest.mark.parametrize("event", [*CLIENT_EVENTS, *SERVER_EVENTS], ids=lambda e: type(e).__name__)
def test_an_events_weight_counts_its_bodies(event: Event) -> None:
    bodies = [m.body for m in getattr(event, "messages", [])]
    assert weight(event) == EVENT_BYTES * (1 + len(bodies)) + sum(map(len, bodies))
    assert weight(event, b"x" * 5) == 5  # its encoded op, when at hand


def test_send_many_of_nothing_is_an_empty_frame() -> None:
    pair = ConnectionPair()
    pair.handshake()
    assert pair.send(Role.SERVER, []) == frame()


def test_many_frames_in_one_read_and_split_anywhere() -> None:
    pair = ConnectionPair()
    pair.handshake()
    data = b"".join(pair.conn[Role.SERVER].send(e) for e in SERVER_EVENTS)
    for cut in range(len(data) + 1):
        client = open_connection(Role.CLIENT)
        events, exc = receive(client, chunked(data, [cut]))
        assert exc is None
        assert events == SERVER_EVENTS


# ---- state machine --------------------------------------------------------------------------


def _sender_in(role: Role, state: State) -> Connection:
    """A ``role`` connection in ``state``, reached by sending and receiving real frames."""
    pair = ConnectionPair()
    if state is State.PREAMBLE:
        assert role is Role.SERVER
    elif state is State.HELLO and role is Role.SERVER:
        pair.server.receive_data(PREAMBLE)
        assert get_all_events(pair.server) == []
    elif state in (State.WELCOME, State.OPEN):
        pair.send(Role.CLIENT, HELLO)
        if state is State.OPEN:
            pair.send(Role.SERVER, WELCOME)
    elif state is State.CLOSED:
        pair.handshake()
        pair.conn[role].goodbye("bye", "")
    elif state is State.ERROR:
        pair.handshake()
        pair.conn[role].receive_data(frame(payload=b"\xc1"))
        with pytest.raises(RemoteProtocolError):
            pair.conn[role].next_event()
    conn = pair.conn[role]
    assert conn.state is state
    return conn


def _sample(cls: type[Event]) -> Event:
    for e in [HELLO, WELCOME, Goodbye("bye", "done"), *CLIENT_EVENTS, *SERVER_EVENTS]:
        if type(e) is cls:
            return e
    raise AssertionError(cls)  # pragma: no cover


@pytest.mark.parametrize(
    ("state", "cls", "sender", "nxt"),
    [(s, c, r, n) for (s, c, r), n in TRANSITIONS.items()],
    ids=lambda v: getattr(v, "__name__", getattr(v, "value", str(v))),
)
def test_transition_table_holds_both_ways(
    state: State, cls: type[Event], sender: Role, nxt: State
) -> None:
    event = _sample(cls)
    conn = _sender_in(sender, state)
    data = conn.send(event)
    assert conn.state is nxt
    # the peer, in the same state, receives it and moves the same way
    peer_role = Role.SERVER if sender is Role.CLIENT else Role.CLIENT
    peer_state = State.PREAMBLE if peer_role is Role.SERVER and state is State.HELLO else state

    def make() -> Connection:
        return _sender_in(peer_role, peer_state)

    if peer_state is State.PREAMBLE and not data.startswith(PREAMBLE):
        data = PREAMBLE + data
    tr(make, data, [event], state=nxt)


ILLEGAL_SENDS: list[tuple[Role, State, Event]] = [
    # clients never send server events, servers never send client events
    (Role.CLIENT, State.HELLO, WELCOME),
    (Role.CLIENT, State.OPEN, WELCOME),
    (Role.CLIENT, State.OPEN, Ok(1)),
    (Role.CLIENT, State.OPEN, Deliver(1, [1], [PLAIN_MESSAGE])),
    (Role.SERVER, State.OPEN, HELLO),
    (Role.SERVER, State.OPEN, Ping(1)),
    (Role.SERVER, State.OPEN, Publish(1, "queue/a", [])),
    # ordering: Hello first, once; Welcome after Hello, once
    (Role.CLIENT, State.HELLO, Ping(1)),
    (Role.CLIENT, State.HELLO, Publish(1, "queue/a", [])),
    (Role.CLIENT, State.WELCOME, HELLO),
    (Role.CLIENT, State.OPEN, HELLO),
    (Role.SERVER, State.PREAMBLE, WELCOME),
    (Role.SERVER, State.HELLO, WELCOME),
    (Role.SERVER, State.OPEN, WELCOME),
    (Role.SERVER, State.PREAMBLE, Ok(1)),
    (Role.SERVER, State.HELLO, Ok(1)),
    (Role.SERVER, State.WELCOME, Ok(1)),
    (Role.SERVER, State.WELCOME, Deliver(1, [1], [PLAIN_MESSAGE])),
    # nothing after a Goodbye
    (Role.CLIENT, State.CLOSED, Ping(1)),
    (Role.CLIENT, State.CLOSED, Goodbye("bye", "")),
    (Role.SERVER, State.CLOSED, Ok(1)),
    (Role.SERVER, State.CLOSED, Goodbye("bye", "")),
    # nor once the peer has sent garbage (only goodbye() then)
    (Role.CLIENT, State.ERROR, Ping(1)),
    (Role.SERVER, State.ERROR, Ok(1)),
    (Role.SERVER, State.ERROR, Deliver(1, [1], [PLAIN_MESSAGE])),
]


@pytest.mark.parametrize(("role", "state", "event"), ILLEGAL_SENDS)
def test_illegal_send_raises_local_error_and_changes_nothing(
    role: Role, state: State, event: Event
) -> None:
    conn = _sender_in(role, state)
    with pytest.raises(LocalProtocolError, match=type(event).__name__):
        conn.send(event)
    assert conn.state is state
    with pytest.raises(LocalProtocolError):
        conn.send_many([event])
    assert conn.state is state


@pytest.mark.parametrize(
    ("role", "state", "event"),
    # A server in PREAMBLE has no client peer in that state, a connection in ERROR reads
    # nothing more, and what arrives after our own Goodbye is left unspecified here.
    [c for c in ILLEGAL_SENDS if c[1] not in (State.PREAMBLE, State.CLOSED, State.ERROR)],
)
def test_illegal_receive_raises_remote_error(role: Role, state: State, event: Event) -> None:
    """What a connection may not send, its peer (in the same state) may not receive."""
    peer = Role.SERVER if role is Role.CLIENT else Role.CLIENT
    prefix = PREAMBLE if peer is Role.SERVER and state is State.HELLO else b""

    def make() -> Connection:
        return _sender_in(peer, State.PREAMBLE if prefix else state)

    tr(make, prefix + frame([event.OP, *_fields(event)]), [], error="may not send")


def _fields(event: Event) -> list[Any]:
    out: list[Any] = []
    for f in dataclasses.fields(event):  # type: ignore[arg-type]
        v = getattr(event, f.name)
        out.append([m.to_wire() for m in v] if f.name == "messages" else v)
    return out


def test_failed_send_many_leaves_state_and_preamble_alone() -> None:
    pair = ConnectionPair()
    with pytest.raises(LocalProtocolError):
        pair.client.send_many([HELLO, WELCOME])  # the Hello is fine, the Welcome is not
    assert pair.client.state is State.HELLO
    # nothing went out, so the next send still carries the preamble and a Hello is still due
    pair.handshake()


def test_oversized_frame_is_refused_locally_and_the_connection_stays_usable() -> None:
    pair = ConnectionPair(max_frame=256)
    pair.handshake()
    big = Publish(1, "queue/a", [Message(b"x" * 300)])
    with pytest.raises(LocalProtocolError, match="exceeds 256"):
        pair.client.send(big)
    assert pair.client.state is State.OPEN
    pair.send(Role.CLIENT, Publish(2, "queue/a", [Message(b"x" * 100)]))


@pytest.mark.parametrize(
    "event",
    [
        Ok(1, object()),  # not msgpack at all
        Ok(1, 2**64),  # an int msgpack cannot hold
        Ok(1, {"\ud800": "lone surrogate"}),
        Fail(1, "bad", "\udfff"),
    ],
    ids=["object", "int-too-big", "surrogate-key", "surrogate-str"],
)
def test_unencodable_event_raises_local_error(event: Event) -> None:
    pair = ConnectionPair()
    pair.handshake()
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        pair.server.send_many([Ok(0), event])
    assert pair.server.state is State.OPEN
    pair.send(Role.SERVER, Ok(2))  # the packer is not left holding half a frame


def test_local_and_remote_errors_are_protocol_errors() -> None:
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert RemoteProtocolError("x").error_status_hint == 400
    assert RemoteProtocolError("x", 413).error_status_hint == 413


# ---- remote errors ----------------------------------------------------------------------------


def _server() -> Connection:
    return Connection(Role.SERVER)


def _opened_server() -> Connection:
    return open_connection(Role.SERVER)


def _opened_client() -> Connection:
    return open_connection(Role.CLIENT)


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PMQ\x02" + frame([Hello.OP, 2, "py"]),  # another protocol version
        b"\x00\x00\x00\x05",
        b"pmq\x01",
        b"PMX",
    ],
)
def test_bad_preamble(data: bytes) -> None:
    tr(_server, data, [], error="bad preamble")


@pytest.mark.parametrize("data", [b"G", b"PX", b"PMQ\x00"])
def test_bad_preamble_is_detected_before_four_bytes(data: bytes) -> None:
    server = _server()
    server.receive_data(data)
    with pytest.raises(RemoteProtocolError, match="bad preamble"):
        server.next_event()
    assert server.state is State.ERROR


@pytest.mark.parametrize("data", [b"P", b"PM", b"PMQ"])
def test_partial_good_preamble_waits(data: bytes) -> None:
    tr(_server, data, [], state=State.PREAMBLE, trailing=False)


def test_frame_over_max_frame_is_refused_from_its_header() -> None:
    def make() -> Connection:
        return Connection(Role.SERVER, max_frame=1024)

    # only the length has arrived: no need to wait for (or buffer) a megabyte of payload
    tr(
        make,
        PREAMBLE + struct.pack(">I", 1025),
        [],
        error="exceeds the maximum of 1024",
        status=413,
    )
    tr(make, PREAMBLE + struct.pack(">I", 2**32 - 1), [], error="exceeds", status=413)


def test_frame_of_exactly_max_frame_is_accepted() -> None:
    data = frame([Hello.OP, 1, "py", "x" * 40])
    size = len(data) - 4
    tr(lambda: Connection(Role.SERVER, max_frame=size), PREAMBLE + data, [Hello(1, "py", "x" * 40)])
    tr(
        lambda: Connection(Role.SERVER, max_frame=size - 1),
        PREAMBLE + data,
        [],
        error="exceeds",
        status=413,
    )


def test_default_max_frame() -> None:
    assert DEFAULT_MAX_FRAME == 64 * 1024 * 1024
    assert Connection(Role.SERVER).max_frame == DEFAULT_MAX_FRAME


_HELLO_FRAME = frame([Hello.OP, 1, "py"])


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b"\xc1", "not valid msgpack"),  # a byte msgpack never uses
        (b"\x92\x01", "not valid msgpack"),  # an array of 2 holding 1
        (msgpack.packb([]) + b"\x00", "not valid msgpack"),  # extra data after the object
        (b"\x91\xa1\xff", "not valid msgpack"),  # a str that is not UTF-8
        (msgpack.packb([[Declare.OP, 1, "queue/a", {1: 2}]]), "not valid msgpack"),  # int key
        (msgpack.packb({"ops": []}), "list of operations"),
        (msgpack.packb(26), "list of operations"),
        (msgpack.packb(b"\x91\x1a"), "list of operations"),
        (msgpack.packb([26]), "operation must be a list"),
        (msgpack.packb([[]]), "operation must be a list"),
        (msgpack.packb([["ping", 1]]), "operation must be a list"),
        (msgpack.packb([[True, 1, "py"]]), "operation must be a list"),  # true is not opcode 1
        (msgpack.packb([[26.0, 1]]), "operation must be a list"),
        (msgpack.packb([[99, 1]]), "unknown opcode 99"),
        (msgpack.packb([[0]]), "unknown opcode 0"),
        (msgpack.packb([[-1]]), "unknown opcode -1"),
        (msgpack.packb([[Ping.OP]]), "Ping takes 1..1 fields, got 0"),
        (msgpack.packb([[Ping.OP, 1, 2]]), "Ping takes 1..1 fields, got 2"),
        (msgpack.packb([[Nack.OP, 1, 1]]), "Nack takes 3..5 fields, got 2"),
        (msgpack.packb([[Nack.OP, 1, 1, [1], True, False, 0]]), "Nack takes 3..5"),
        (msgpack.packb([[Ping.OP, "1"]]), "Ping.rid must be a non-negative integer"),
        (msgpack.packb([[Ping.OP, None]]), "Ping.rid must be a non-negative integer"),
        (msgpack.packb([[Ping.OP, 1.0]]), "Ping.rid must be a non-negative integer"),
        (msgpack.packb([[Ping.OP, -1]]), "Ping.rid must be a non-negative integer"),
        (msgpack.packb([[Ping.OP, True]]), "Ping.rid must be a non-negative integer"),
        (msgpack.packb([[Ping.OP, 2**63]]), "Ping.rid must be a non-negative integer"),
        (msgpack.packb([[Unsubscribe.OP, 1, -5]]), "Unsubscribe.sid must be a non-negative"),
        (msgpack.packb([[Ack.OP, 1, False, [1]]]), "Ack.sid must be a non-negative integer"),
    ],
)
@pytest.mark.parametrize("keep_raw", [False, True], ids=["decoded", "keeping-raw"])
def test_malformed_frame_from_client(payload: bytes, error: str, keep_raw: bool) -> None:
    data = PREAMBLE + _HELLO_FRAME + frame(payload=payload)
    tr(_kept(_server, keep_raw), data, [Hello(1, "py")], error=error)


def _publish(*messages: Any) -> bytes:
    return bytes(msgpack.packb([[Publish.OP, 1, "queue/a", list(messages)]], use_bin_type=True))


GOOD_WIRE_MESSAGE = PLAIN_MESSAGE.to_wire()


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (msgpack.packb([[Publish.OP, 1, "queue/a", "not a list"]]), "messages must be a list"),
        (msgpack.packb([[Publish.OP, 1, "queue/a", None]]), "messages must be a list"),
        (_publish(5), "malformed message in Publish"),
        (_publish(GOOD_WIRE_MESSAGE, [b"body only"]), "malformed message in Publish"),
        (_publish([*GOOD_WIRE_MESSAGE, "extra"]), "malformed message in Publish"),
        (_publish({"body": b"x"}), "malformed message in Publish"),
        (
            _publish([*GOOD_WIRE_MESSAGE[:4], "yes", *GOOD_WIRE_MESSAGE[5:]]),  # persistent
            "malformed message in Publish",
        ),
        (
            _publish([*GOOD_WIRE_MESSAGE[:9], 7, *GOOD_WIRE_MESSAGE[10:]]),  # id
            "malformed message in Publish",
        ),
    ],
)
@pytest.mark.parametrize("keep_raw", [False, True], ids=["decoded", "keeping-raw"])
def test_malformed_message_list(payload: bytes, error: str, keep_raw: bool) -> None:
    tr(_kept(_opened_server, keep_raw), frame(payload=payload), [], error=error)


@pytest.mark.parametrize("op", [Deliver.OP, Pulled.OP])
@pytest.mark.parametrize("keep_raw", [False, True], ids=["decoded", "keeping-raw"])
def test_malformed_message_list_from_server(op: int, keep_raw: bool) -> None:
    payload = msgpack.packb([[op, 1, [1], [[b"short"]]]], use_bin_type=True)
    tr(_kept(_opened_client, keep_raw), frame(payload=payload), [], error="malformed message in")


@pytest.mark.parametrize("keep_raw", [False, True], ids=["decoded", "keeping-raw"])
def test_events_before_a_bad_frame_come_out_first_however_chunked(keep_raw: bool) -> None:
    make = _kept(_opened_server, keep_raw)
    data = frame([Ping.OP, 1], [Ping.OP, 2]) + frame([Ping.OP, 3]) + frame(payload=b"\xc1")
    tr(make, data, [Ping(1), Ping(2), Ping(3)], error="not valid msgpack")
    # and a bad op after good ones in the same frame: the good ones first
    data = frame([Ping.OP, 1], [Ping.OP, -1])
    tr(make, data, [Ping(1)], error="non-negative")


# ---- passing operations through (keep_raw) ---------------------------------------------------


def _kept(make: Callable[[], Connection], keep_raw: bool) -> Callable[[], Connection]:
    def kept() -> Connection:
        conn = make()
        conn.keep_raw = keep_raw
        return conn

    return kept


def _relayed(sender: Role, events: list[Event]) -> tuple[list[Event], list[bytes | None], bytes]:
    """``events`` sent by ``sender`` to a connection keeping raw ops, then passed on by a
    second ``sender`` connection with those ops: what the second's peer receives, the ops
    kept, and the bytes passed on."""
    first, relay = ConnectionPair(), ConnectionPair()
    first.handshake()
    relay.handshake()
    receiver = first.conn[Role.CLIENT if sender is Role.SERVER else Role.SERVER]
    receiver.keep_raw = True
    receiver.receive_data(first.conn[sender].send_many(events))
    got: list[Event] = []
    raws: list[bytes | None] = []
    while (event := receiver.next_event()) is not NEED_DATA:
        assert isinstance(event, Event)
        got.append(event)
        raws.append(receiver.raw)
    assert got == events
    data = relay.conn[sender].send_many(got, raws)
    final = relay.conn[Role.CLIENT if sender is Role.SERVER else Role.SERVER]
    final.receive_data(data)
    return get_all_events(final), raws, data


@pytest.mark.parametrize(
    ("sender", "samples"), [(Role.CLIENT, CLIENT_EVENTS), (Role.SERVER, SERVER_EVENTS)]
)
def test_ops_kept_raw_pass_through_unchanged(sender: Role, samples: list[Event]) -> None:
    passed, raws, data = _relayed(sender, samples)
    assert passed == samples
    carrying = (Publish, Deliver, Pulled, Polled, Peeked)
    assert [raw is not None for raw in raws] == [isinstance(e, carrying) for e in samples]
    assert any(raws)
    # the same bytes as encoding them again: passing on changes nothing but the work
    pair = ConnectionPair()
    pair.handshake()
    assert data == pair.conn[sender].send_many(samples)


@given(st.lists(st.sampled_from(CLIENT_EVENTS), max_size=12))
def test_any_mix_of_client_ops_passes_through(events: list[Event]) -> None:
    assert _relayed(Role.CLIENT, events)[0] == events


def test_raw_is_none_for_ops_without_messages_and_after_them() -> None:
    server = open_connection(Role.SERVER)
    server.keep_raw = True
    server.receive_data(frame([Publish.OP, 1, "queue/a", [GOOD_WIRE_MESSAGE]], [Ping.OP, 2]))
    assert isinstance(server.next_event(), Publish) and server.raw is not None
    assert server.next_event() == Ping(2) and server.raw is None
    assert server.next_event() is NEED_DATA and server.raw is None


def test_a_connection_that_stops_keeping_raw_gives_none_for_what_it_parsed_already() -> None:
    """A relay's peer (polymq_core.session) stops keeping raws once logged in: events parsed
    before that, and every one after, give ``raw`` None, and come out as before."""
    server = open_connection(Role.SERVER)
    server.keep_raw = True
    publish = [Publish.OP, 1, "queue/a", [GOOD_WIRE_MESSAGE]]
    server.receive_data(frame(publish, [*publish[:1], 2, *publish[2:]]))
    first = server.next_event()
    assert isinstance(first, Publish) and server.raw is not None
    server.stop_keeping_raw()
    second = server.next_event()
    assert isinstance(second, Publish) and second.rid == 2 and server.raw is None
    server.receive_data(frame([*publish[:1], 3, *publish[2:]]))
    third = server.next_event()
    assert isinstance(third, Publish) and third.rid == 3 and server.raw is None
    assert third.messages == first.messages


def test_a_raw_op_is_still_checked_against_the_state() -> None:
    """Passing an op on is still sending its event: a client may not send a Deliver."""
    _, raws, _ = _relayed(Role.SERVER, [Deliver(1, [1], [PLAIN_MESSAGE])])
    client = open_connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.send_many([Deliver(1, [1], [PLAIN_MESSAGE])], raws)


_MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text()
    | st.binary(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)  # fmt: skip


@given(
    st.lists(
        st.one_of(
            _MSGPACK_VALUES,
            st.sampled_from(CLIENT_EVENTS).map(lambda e: [e.OP, *dataclasses.astuple(e)]),
        ),
        max_size=4,
    ),
    st.binary(max_size=3),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_keeping_raw_reads_any_frame_as_decoding_does(ops: list[Any], tail: bytes) -> None:
    """The same events, and an error where the other has one, for frames good and bad."""
    try:
        payload = msgpack.packb(ops, use_bin_type=True) + tail
    except (TypeError, ValueError, OverflowError):
        return
    outcomes = []
    for keep_raw in (False, True):
        conn = open_connection(Role.SERVER)
        conn.keep_raw = keep_raw
        conn.receive_data(frame(payload=payload))
        events: list[Any] = []
        try:
            while (event := conn.next_event()) is not NEED_DATA:
                events.append(event)
        except RemoteProtocolError:
            events.append("error")
        outcomes.append(events)
    assert outcomes[0] == outcomes[1]


def test_errored_connection_can_still_say_goodbye() -> None:
    server = _server()
    server.receive_data(b"GET / HTTP/1.1\r\n")
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.error_status_hint == 400
    assert server.state is State.ERROR
    with pytest.raises(RemoteProtocolError):
        server.next_event()
    data = server.goodbye("protocol-error", str(info.value))
    assert data == frame([Goodbye.OP, "protocol-error", str(info.value)])
    assert server.state is State.CLOSED


@pytest.mark.parametrize(
    ("make", "event"),
    [
        (_opened_server, Ok(1)),  # a client sending an answer
        (_opened_server, Cancelled(1, "x", "y")),
        (_opened_client, Ping(1)),  # a server sending a request
        (_opened_client, HELLO),
        (_opened_client, WELCOME),  # a second Welcome
        (_opened_server, HELLO),  # a second Hello
    ],
    ids=lambda v: getattr(v, "__name__", type(v).__name__),
)
def test_wrong_side_events_are_remote_errors(make: Callable[[], Connection], event: Event) -> None:
    tr(make, frame([event.OP, *_fields(event)]), [], error="may not send")


def test_server_ok_before_welcome_is_a_remote_error() -> None:
    def make() -> Connection:
        client = Connection(Role.CLIENT)
        client.send(HELLO)
        return client

    tr(make, frame([Ok.OP, 1, None]), [], error="server may not send Ok in state welcome")


def test_request_before_hello_is_a_remote_error() -> None:
    tr(_server, PREAMBLE + frame([Ping.OP, 1]), [], error="client may not send Ping in state hello")


# ---- end of stream ---------------------------------------------------------------------------


def test_clean_eof_is_a_goodbye() -> None:
    tr(
        _opened_server,
        frame([Ping.OP, 1]),
        [Ping(1), Goodbye("closed", "the peer closed the connection")],
        eof=True,
        state=State.CLOSED,
    )
    client = _opened_client()
    assert receive(client, [], eof=True) == (
        [Goodbye("closed", "the peer closed the connection")],
        None,
    )
    assert client.state is State.CLOSED


def test_eof_before_anything_is_a_goodbye() -> None:
    server = _server()
    events, exc = receive(server, [], eof=True)
    assert exc is None
    assert events == [Goodbye("closed", "the peer closed the connection")]
    assert server.state is State.CLOSED
    assert server.next_event() is NEED_DATA  # once, not again


@pytest.mark.parametrize(
    "data",
    [
        frame([Ping.OP, 1])[:-1],
        frame([Ping.OP, 1])[:3],
        frame([Ping.OP, 1]) + b"\x00",
    ],
    ids=["mid-payload", "mid-length", "after-a-frame"],
)
def test_eof_mid_frame_raises(data: bytes) -> None:
    events = [Ping(1)] if data.startswith(frame([Ping.OP, 1])) else []
    tr(_opened_server, data, events, error="in the middle of a frame", eof=True)


def test_eof_mid_preamble_raises() -> None:
    tr(_server, b"PM", [], error="in the middle of a frame", eof=True)


def test_eof_after_goodbye_is_quiet() -> None:
    pair = ConnectionPair()
    pair.handshake()
    data = pair.server.goodbye("unavailable", "shutting down")
    events, exc = receive(pair.client, [data], eof=True)
    assert exc is None
    assert events == [Goodbye("unavailable", "shutting down")]
    assert pair.client.state is State.CLOSED


# ---- goodbye ----------------------------------------------------------------------------------


def test_goodbye_bytes_and_closed_state() -> None:
    pair = ConnectionPair()
    pair.handshake()
    data = pair.server.goodbye("unavailable", "shutting down")
    assert data == frame([Goodbye.OP, "unavailable", "shutting down"])
    assert pair.server.state is State.CLOSED
    assert pair.server.goodbye("again", "") == b""  # once only
    with pytest.raises(LocalProtocolError):
        pair.server.send(Ok(1))
    tr(
        _opened_client,
        data,
        [Goodbye("unavailable", "shutting down")],
        state=State.CLOSED,
    )


@pytest.mark.parametrize("state", [State.HELLO, State.WELCOME, State.OPEN])
def test_client_goodbye_in_any_state_reaches_the_server(state: State) -> None:
    pair = ConnectionPair()
    if state is not State.HELLO:
        pair.send(Role.CLIENT, HELLO)
    if state is State.OPEN:
        pair.send(Role.SERVER, WELCOME)
    data = pair.client.goodbye("bye", "client closed")
    assert pair.client.state is State.CLOSED
    assert data.startswith(PREAMBLE) == (state is State.HELLO)
    events, exc = receive(pair.server, [data])
    assert exc is None
    assert events == [Goodbye("bye", "client closed")]
    assert pair.server.state is State.CLOSED


@pytest.mark.parametrize("state", [State.PREAMBLE, State.HELLO, State.WELCOME, State.OPEN])
def test_server_goodbye_in_any_state_reaches_the_client(state: State) -> None:
    pair = ConnectionPair()
    if state is not State.PREAMBLE:
        pair.client.send(HELLO)  # the client is in WELCOME, whatever the server has read
    client = Connection(Role.CLIENT) if state is State.PREAMBLE else pair.client
    if state is State.HELLO:
        pair.server.receive_data(PREAMBLE)
        get_all_events(pair.server)
    elif state in (State.WELCOME, State.OPEN):
        pair.server.receive_data(PREAMBLE + frame([Hello.OP, *_fields(HELLO)]))
        get_all_events(pair.server)
    if state is State.OPEN:
        pair.send(Role.SERVER, WELCOME)
    assert pair.server.state is state
    data = pair.server.goodbye("unauthorized", "bad password")
    assert pair.server.state is State.CLOSED
    events, exc = receive(client, [data])
    assert exc is None
    assert events == [Goodbye("unauthorized", "bad password")]
    assert client.state is State.CLOSED


def test_hello_and_goodbye_in_one_read() -> None:
    """A client that connects and gives up at once: both frames arrive together."""
    client = Connection(Role.CLIENT)
    data = client.send(HELLO) + client.goodbye("bye", "client closed")
    tr(_server, data, [HELLO, Goodbye("bye", "client closed")], state=State.CLOSED)


# ---- property tests -----------------------------------------------------------------------

ids = st.integers(0, 2**63 - 1)
ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
floats = st.floats(allow_nan=False)
text = st.text(max_size=12)
opt_text = st.none() | text
values = st.recursive(
    st.none() | st.booleans() | ints | floats | text | st.binary(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
dicts = st.dictionaries(text, values, max_size=4)
messages = st.builds(
    Message,
    body=st.binary(max_size=64),
    content_type=text,
    headers=st.dictionaries(text, text, max_size=4),
    priority=st.integers(0, 9),
    persistent=st.booleans(),
    expires=st.none() | floats,
    ack_timeout=st.none() | floats,
    correlation_id=opt_text,
    reply_to=opt_text,
    id=text,
    seq=ints,
    timestamp=floats,
    delivery_count=ints,
    destination=text,
)
message_lists = st.lists(messages, max_size=3)
tags = st.lists(ints, max_size=5)

hellos = st.builds(Hello, st.integers(0, 255), text, opt_text, opt_text, opt_text)
welcomes = st.builds(Welcome, st.integers(0, 255), text, text, dicts)
client_events = st.one_of(
    st.builds(Publish, ids, text, message_lists, opt_text),
    st.builds(Declare, ids, text, dicts),
    st.builds(Delete, ids, text),
    st.builds(Purge, ids, text),
    st.builds(Subscribe, ids, ids, text, dicts),
    st.builds(Unsubscribe, ids, ids),
    st.builds(Ack, ids, ids, tags, st.booleans()),
    st.builds(Nack, ids, ids, tags, st.booleans(), st.booleans()),
    st.builds(Pull, ids, text, ints, floats, floats),
    st.builds(Settle, ids, st.lists(text, max_size=3), text),
    st.builds(Stats, ids, text),
    st.builds(MetaGet, ids, text),
    st.builds(MetaSet, ids, text, st.dictionaries(text, text, max_size=3)),
    st.builds(KvGet, ids, text),
    st.builds(KvPut, ids, text, st.binary(max_size=32)),
    st.builds(KvDelete, ids, text),
    st.builds(Ping, ids),
    st.builds(CursorOpen, ids, text, dicts),
    st.builds(CursorPoll, ids, text, st.none() | ids, ints, floats),
    st.builds(CursorClose, ids, text),
    st.builds(KvList, ids, text, ints),
    st.builds(Bind, ids, text, text),
    st.builds(Unbind, ids, text, text),
    st.builds(Bindings, ids, text),
    st.builds(Peek, ids, text, ints, st.none() | text),
)
server_events = st.one_of(
    st.builds(Ok, ids, values),
    st.builds(Fail, ids, text, text),
    st.builds(Deliver, ids, tags, message_lists),
    st.builds(Pulled, ids, st.lists(text, max_size=3), message_lists),
    st.builds(Polled, ids, ids, st.lists(text, max_size=3), message_lists),
    st.builds(Peeked, ids, message_lists),
    st.builds(Cancelled, ids, text, text),
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hello=hellos,
    welcome=welcomes,
    steps=st.lists(st.sampled_from(list(Role)), max_size=8),
    goodbye=st.none() | st.sampled_from(list(Role)),
    data=st.data(),
)
def test_random_conversations_round_trip_in_random_chunks(
    hello: Hello,
    welcome: Welcome,
    steps: list[Role],
    goodbye: Role | None,
    data: st.DataObject,
) -> None:
    """Whatever valid events each side sends, in whatever frames, the other side receives
    exactly them, however the byte stream is cut."""
    pair = ConnectionPair()
    sent: dict[Role, list[Event]] = {Role.CLIENT: [hello], Role.SERVER: [welcome]}
    stream = {
        Role.CLIENT: pair.send(Role.CLIENT, hello),
        Role.SERVER: pair.send(Role.SERVER, welcome),
    }
    for role in steps:
        strategy = client_events if role is Role.CLIENT else server_events
        events = data.draw(st.lists(strategy, min_size=1, max_size=4), label=f"{role.value} sends")
        sent[role] += events
        stream[role] += pair.conn[role].send_many(events)
    if goodbye is not None:
        sent[goodbye].append(Goodbye("bye", "done"))
        stream[goodbye] += pair.conn[goodbye].goodbye("bye", "done")

    for role in Role:
        receiver = Connection(Role.SERVER if role is Role.CLIENT else Role.CLIENT)
        if role is Role.SERVER:  # the client must have sent its Hello to accept a Welcome
            receiver.send(hello)
        raw = stream[role]
        cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=10), label="cuts")
        events, exc = receive(receiver, chunked(raw, cuts), eof=True)
        assert exc is None
        expected = sent[role]
        if role is not goodbye:  # EOF without a Goodbye reads as one
            expected = [*expected, Goodbye("closed", "the peer closed the connection")]
        assert events == expected
        assert receiver.state is State.CLOSED


@settings(deadline=None)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(0, 204), max_size=5))
def test_garbage_only_ever_raises_remote_protocol_error(data: bytes, cuts: list[int]) -> None:
    server = _server()
    # receive() lets nothing but RemoteProtocolError through
    _, exc = receive(server, chunked(PREAMBLE + data, cuts), eof=True)
    assert server.state is (State.CLOSED if exc is None else State.ERROR)


@settings(deadline=None)
@given(
    ops=st.lists(st.lists(values, max_size=6), max_size=4),
    opcode=st.sampled_from(sorted(EVENT_TYPES)),
)
def test_well_framed_nonsense_only_ever_raises_remote_protocol_error(
    ops: list[list[Any]], opcode: int
) -> None:
    """Valid msgpack, valid framing, nonsense fields: an event or a RemoteProtocolError."""
    payload = msgpack.packb([[opcode, *op] for op in ops], use_bin_type=True)
    server = _opened_server()
    events, exc = receive(server, [frame(payload=payload)])
    assert exc is not None or len(events) == len(ops)


def test_a_message_in_several_deliveries_of_a_frame_is_packed_as_the_codec_always_did() -> None:
    """A topic's message goes to every subscription of a connection: a frame with several
    events carrying messages packs each message once, into the same bytes as before (msgpack
    of every operation together), and reads back the same."""
    shared = [Message(b"news %d" % i, headers={"k": "v"}, seq=i, id=f"m{i}") for i in range(3)]
    other = Message(b"queued", persistent=True, priority=7, seq=9, id="q9")
    events: list[Event] = [
        Deliver(1, [1, 2, 3], shared),
        Ok(4, {"n": [1, 2]}),
        Deliver(2, [1, 2, 3], shared),
        Deliver(3, [5], [other, shared[0]]),
        Cancelled(7, "gone", "bye"),
    ]
    server = Connection(Role.SERVER)
    server.state = State.OPEN
    frame = server.send_many(events)
    payload = msgpack.packb([_wire_op(ev) for ev in events], use_bin_type=True)
    assert frame == struct.pack(">I", len(payload)) + payload
    client = Connection(Role.CLIENT)
    client.state = State.OPEN
    client.receive_data(frame)
    got = [client.next_event() for _ in events]
    assert got == events and client.next_event() is NEED_DATA


def test_a_message_in_deliveries_of_several_frames_is_packed_once_for_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic's backlog to several subscriptions of a connection spans several frames:
    each message is packed once for all of them, and every frame reads back as sent."""
    shared = [Message(b"news %d" % i, seq=i, id=f"m{i}") for i in range(50)]
    events: list[Event] = [Deliver(sid, list(range(1, 51)), shared) for sid in range(1, 5)]
    packs = 0
    to_wire = codec._TO_WIRE

    def counted(m: Message) -> Any:
        nonlocal packs
        packs += 1
        return to_wire(m)

    monkeypatch.setattr(codec, "_TO_WIRE", counted)
    server = Connection(Role.SERVER)
    server.state = State.OPEN
    frames = server.send_frames(events, [1000] * len(events), 1500)  # one event a frame
    assert len(frames) == 4 and packs == 50
    client = Connection(Role.CLIENT)
    client.state = State.OPEN
    client.receive_data(b"".join(frames))
    got = [client.next_event() for _ in events]
    assert got == events and client.next_event() is NEED_DATA


def _wire_op(event: Event) -> list[Any]:
    """An operation as the wire carries it, built apart from the codec."""
    values: list[Any] = [event.OP]
    for f in dataclasses.fields(event):  # type: ignore[arg-type]
        v = getattr(event, f.name)
        values.append([list(m.to_wire()) for m in v] if f.name == "messages" else v)
    return values
