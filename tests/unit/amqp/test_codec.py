"""Tests for polymq_amqp.wire.codec: the sans-IO AMQP 0-9-1 codec (server side).

Every received byte stream goes through ``tr`` (whole, one byte at a time, with trailing
data); what the codec sends is read back with pamqp, the client's side of the pair.
Hypothesis checks that any body survives framing and random splits, and that no input
raises anything but an AmqpError.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame

from polymq_amqp.errors import (
    AmqpError,
    ConnectionException,
    LocalProtocolError,
    ProtocolHeaderMismatch,
)
from polymq_amqp.wire.codec import PROTOCOL_HEADER, AmqpConnection
from polymq_amqp.wire.events import Content, Heartbeat, Method, OversizedContent, ProtocolHeader
from polymq_amqp.wire.states import TRANSITIONS, State, Trigger, method_name

from .helpers import beat, content, events, method, open_conn, tr, with_channel


def raises(conn: AmqpConnection, data: bytes, code: int) -> ConnectionException:
    conn.receive_data(data)
    with pytest.raises(ConnectionException) as info:
        events(conn)
    assert info.value.reply_code == code, info.value
    return info.value


# ---- the handshake ---------------------------------------------------------------------------
def test_handshake_states() -> None:
    conn = AmqpConnection()
    assert conn.state is State.AWAIT_HEADER
    assert tr(AmqpConnection, PROTOCOL_HEADER) == [("ProtocolHeader",)]
    conn.receive_data(PROTOCOL_HEADER)
    assert isinstance(events(conn)[0], ProtocolHeader)
    assert conn.state is State.GREETING
    conn.send_method(0, commands.Connection.Start())
    assert conn.state is State.AWAIT_START_OK
    conn.receive_data(method(0, commands.Connection.StartOk({}, "PLAIN", "\0u\0p", "en_US")))
    [ev] = events(conn)
    assert isinstance(ev, Method) and isinstance(ev.method, commands.Connection.StartOk)
    assert conn.state is State.AUTHENTICATING
    conn.send_method(0, commands.Connection.Tune(2047, 131072, 60))
    conn.receive_data(method(0, commands.Connection.TuneOk(100, 65536, 10)))
    events(conn)
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (100, 65536, 10)
    conn.receive_data(method(0, commands.Connection.Open("/")))
    events(conn)
    assert conn.state is State.OPENING
    conn.send_method(0, commands.Connection.OpenOk())
    assert conn.state is State.OPEN


def test_tune_ok_zero_means_our_values() -> None:
    conn = AmqpConnection(frame_max=8192, channel_max=10)
    conn.receive_data(PROTOCOL_HEADER)
    events(conn)
    conn.send_method(0, commands.Connection.Start())
    conn.receive_data(method(0, commands.Connection.StartOk({}, "PLAIN", "\0u\0p", "en_US")))
    events(conn)
    conn.send_method(0, commands.Connection.Tune(10, 8192, 0))
    conn.receive_data(method(0, commands.Connection.TuneOk(0, 0, 0)))
    events(conn)
    assert (conn.channel_max, conn.frame_max) == (10, 8192)


@pytest.mark.parametrize(("channel_max", "frame_max"), [(10, 1000), (10, 1 << 20), (5000, 4096)])
def test_tune_ok_outside_the_offer_is_530(channel_max: int, frame_max: int) -> None:
    conn = AmqpConnection()
    conn.receive_data(PROTOCOL_HEADER)
    events(conn)
    conn.send_method(0, commands.Connection.Start())
    conn.receive_data(method(0, commands.Connection.StartOk({}, "PLAIN", "\0u\0p", "en_US")))
    events(conn)
    conn.send_method(0, commands.Connection.Tune(2047, 131072, 0))
    raises(conn, method(0, commands.Connection.TuneOk(channel_max, frame_max, 0)), 530)


@pytest.mark.parametrize(
    "data", [b"AMQP\x01\x01\x00\x0a", b"AMQP\x00\x00\x08\x00", b"GET / HTTP/1.1\r\n", b"XY"]
)
def test_wrong_protocol_header(data: bytes) -> None:
    conn = AmqpConnection()
    conn.receive_data(data)
    with pytest.raises(ProtocolHeaderMismatch):
        events(conn)


def test_a_short_right_prefix_waits() -> None:
    conn = AmqpConnection()
    conn.receive_data(b"AMQ")
    assert events(conn) == []
    conn.receive_data(b"")
    assert [type(e).__name__ for e in events(conn)] == ["ConnectionClosed"]


def test_methods_out_of_order_in_the_handshake() -> None:
    conn = AmqpConnection()
    conn.receive_data(PROTOCOL_HEADER)
    events(conn)
    conn.send_method(0, commands.Connection.Start())
    err = raises(conn, method(0, commands.Connection.Open("/")), 503)
    assert "expected connection.start-ok" in err.detail
    assert (err.class_id, err.method_id) == (10, 40)


def test_channel_methods_before_open_are_503() -> None:
    conn = AmqpConnection()
    conn.receive_data(PROTOCOL_HEADER)
    events(conn)
    conn.send_method(0, commands.Connection.Start())
    raises(conn, method(1, commands.Channel.Open()), 503)


# ---- framing -------------------------------------------------------------------------------
def test_frame_over_frame_max_is_501_from_its_header_alone() -> None:
    conn = open_conn(frame_max=4096)
    err = raises(conn, struct.pack(">BHI", 3, 1, 5000), 501)  # no payload sent yet
    assert "frame_max" in err.detail


def test_bad_frame_end_is_501() -> None:
    data = bytearray(method(1, commands.Channel.Open()))
    data[-1] = 0
    raises(open_conn(), bytes(data), 501)


def test_unknown_frame_type_is_501() -> None:
    raises(open_conn(), struct.pack(">BHI", 9, 0, 0) + b"\xce", 501)


def test_unknown_class_and_method_are_540() -> None:
    err = raises(with_channel(open_conn()), _raw_method(1, 999, 1), 540)
    assert (err.class_id, err.method_id) == (999, 1)
    raises(with_channel(open_conn()), _raw_method(1, 60, 999), 540)


def test_server_methods_from_a_client_are_503() -> None:
    deliver = commands.Basic.Deliver("t", 1, False, "", "k")
    err = raises(with_channel(open_conn()), method(1, deliver), 503)
    assert "basic.deliver" in err.detail


def test_update_secret_once_open() -> None:
    update = method(0, commands.Connection.UpdateSecret("new", "rotation"))
    got = tr(open_conn, update)
    assert [e[:3] for e in got] == [("Method", 0, "Connection.UpdateSecret")]
    conn = open_conn()
    conn.receive_data(update)
    events(conn)
    assert conn.state is State.OPEN
    conn.send_method(0, commands.Connection.UpdateSecretOk())  # the answer
    assert conn.state is State.OPEN
    before_open = AmqpConnection()
    before_open.receive_data(PROTOCOL_HEADER)
    events(before_open)
    before_open.send_method(0, commands.Connection.Start())
    raises(before_open, update, 503)  # only on an open connection


def test_undecodable_arguments_are_502() -> None:
    raises(with_channel(open_conn()), _raw_method(1, 50, 10, b"\x00"), 502)


def test_heartbeats() -> None:
    assert tr(open_conn, beat() + beat()) == [("Heartbeat",), ("Heartbeat",)]
    raises(open_conn(), b"\x08\x00\x01\x00\x00\x00\x00\xce", 501)


def _raw_method(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + args
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


# ---- channels ------------------------------------------------------------------------------
def test_channel_life() -> None:
    conn = open_conn()
    assert conn.channel_state(1) is State.CHANNEL_CLOSED
    with_channel(conn, 1)
    assert conn.channel_state(1) is State.CHANNEL_OPEN
    conn.receive_data(method(1, commands.Channel.Close(200, "", 0, 0)))
    [ev] = events(conn)
    assert isinstance(ev, Method) and conn.channel_state(1) is State.CHANNEL_CLOSE_RECEIVED
    conn.send_method(1, commands.Channel.CloseOk())
    assert conn.channel_state(1) is State.CHANNEL_CLOSED


def test_method_on_a_channel_not_open_is_504() -> None:
    err = raises(open_conn(), method(3, commands.Basic.Qos(prefetch_count=1)), 504)
    assert "channel.open" in err.detail
    raises(with_channel(open_conn()), method(1, commands.Channel.Open()), 504)


def test_channel_above_channel_max_is_504() -> None:
    raises(open_conn(channel_max=5), method(6, commands.Channel.Open()), 504)


def test_after_our_channel_close_only_close_and_close_ok_count() -> None:
    conn = with_channel(open_conn())
    conn.send_method(1, commands.Channel.Close(404, "NOT_FOUND - x", 50, 10))
    assert conn.channel_state(1) is State.CHANNEL_CLOSING
    conn.receive_data(
        method(1, commands.Basic.Qos(prefetch_count=1))
        + content(1, b"dropped")
        + method(1, commands.Channel.CloseOk())
    )
    [ev] = events(conn)
    assert isinstance(ev.method, commands.Channel.CloseOk)  # type: ignore[union-attr]
    assert conn.channel_state(1) is State.CHANNEL_CLOSED


def test_after_our_connection_close_only_close_ok_counts() -> None:
    conn = with_channel(open_conn())
    conn.send_method(0, commands.Connection.Close(320, "bye", 0, 0))
    assert conn.state is State.CLOSING
    conn.receive_data(
        method(1, commands.Basic.Qos(prefetch_count=1))
        + content(1, b"x")
        + method(0, commands.Connection.CloseOk())
    )
    [ev] = events(conn)
    assert isinstance(ev.method, commands.Connection.CloseOk)  # type: ignore[union-attr]
    assert conn.state is State.CLOSED


def test_client_close() -> None:
    conn = open_conn()
    conn.receive_data(method(0, commands.Connection.Close(200, "bye", 0, 0)))
    events(conn)
    assert conn.state is State.CLOSE_RECEIVED
    conn.send_method(0, commands.Connection.CloseOk())
    assert conn.state is State.CLOSED


def test_sending_on_a_closed_channel_is_a_local_error() -> None:
    conn = open_conn()
    with pytest.raises(LocalProtocolError):
        conn.send_method(1, commands.Basic.QosOk())
    with pytest.raises(LocalProtocolError):
        conn.send_content(1, commands.Basic.Deliver("t", 1), b"\x00\x00", b"x")
    with pytest.raises(LocalProtocolError):
        AmqpConnection().send_method(0, commands.Connection.OpenOk())


# ---- content -------------------------------------------------------------------------------
def test_publish_with_its_content() -> None:
    props = commands.Basic.Properties(content_type="text/plain", headers={"a": 1}, priority=3)
    data = content(1, b"hello world", props, frame_max=4096 + 8)
    [ev] = tr(lambda: with_channel(open_conn()), data)
    name, channel, mname, args, got_props, body, _ = ev
    assert (name, channel, mname, body) == ("Content", 1, "Basic.Publish", b"hello world")
    assert dict(args)["routing_key"] == "k"
    assert dict(got_props)["content_type"] == "text/plain"
    assert dict(got_props)["headers"] == {"a": 1}


def test_body_in_many_frames_and_empty_body() -> None:
    big = bytes(range(256)) * 100
    conn = with_channel(open_conn(frame_max=4096))
    conn.receive_data(content(1, big, frame_max=4096) + content(1, b"", frame_max=4096))
    evs = events(conn)
    assert [e.body for e in evs if isinstance(e, Content)] == [big, b""]  # type: ignore[misc]


def test_interleaved_channels() -> None:
    conn = with_channel(with_channel(open_conn(), 1), 2)
    a, b = content(1, b"A" * 10, frame_max=4096), content(2, b"B" * 10, frame_max=4096)
    # method of 1, method of 2, header of 1, header of 2, body of 1, body of 2
    fa, fb = _frames(a), _frames(b)
    conn.receive_data(b"".join(x for pair in zip(fa, fb, strict=True) for x in pair))
    got = [(e.channel, e.body) for e in events(conn) if isinstance(e, Content)]
    assert got == [(1, b"A" * 10), (2, b"B" * 10)]


def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        size = struct.unpack(">I", data[3:7])[0]
        out.append(data[: size + 8])
        data = data[size + 8 :]
    return out


def test_oversized_content_is_read_and_dropped() -> None:
    conn = with_channel(open_conn(max_body=100))
    conn.receive_data(content(1, b"x" * 1000) + content(1, b"ok"))
    evs = events(conn)
    assert isinstance(evs[0], OversizedContent) and evs[0].size == 1000
    assert isinstance(evs[1], Content) and evs[1].body == b"ok"


def test_content_errors() -> None:
    conn = with_channel(open_conn())
    publish, head, _body = _frames(content(1, b"abc"))
    raises(conn, head, 505)  # a header without a publish
    conn = with_channel(open_conn())
    raises(conn, publish + method(1, commands.Basic.Qos(prefetch_count=1)), 505)
    conn = with_channel(open_conn())
    raises(conn, publish + struct.pack(">BHI", 3, 1, 1) + b"x\xce", 505)  # body before header
    conn = with_channel(open_conn())
    too_long = struct.pack(">BHI", 3, 1, 4) + b"abcd\xce"
    raises(conn, publish + head + too_long, 501)
    conn = with_channel(open_conn())
    bad_class = bytearray(head)
    bad_class[7:9] = b"\x00\x14"  # class 20
    raises(conn, publish + bytes(bad_class), 505)


# ---- what we send --------------------------------------------------------------------------
def test_send_content_splits_the_body_at_frame_max() -> None:
    conn = with_channel(open_conn(frame_max=4096))
    props = b"\x80\x00" + bytes([10]) + b"text/plain"
    data = conn.send_content(1, commands.Basic.Deliver("tag", 7, False, "ex", "k"), props,
                             b"z" * 10_000)  # fmt: skip
    frames = _frames(data)
    assert len(frames) == 2 + 3  # method, header, 4088 + 4088 + 1824
    assert all(len(f) <= 4096 for f in frames)
    _n, ch, deliver = frame.unmarshal(frames[0])
    assert (ch, deliver.consumer_tag, deliver.delivery_tag) == (1, "tag", 7)
    _, _, head = frame.unmarshal(frames[1])
    assert (head.body_size, head.properties.content_type) == (10_000, "text/plain")
    body = b"".join(frame.unmarshal(f)[2].value for f in frames[2:])
    assert body == b"z" * 10_000


def test_heartbeat_frame() -> None:
    assert AmqpConnection.send_heartbeat() == beat()


def test_method_names() -> None:
    assert method_name(commands.Basic.GetOk) == "basic.get-ok"
    assert method_name(commands.Connection.StartOk()) == "connection.start-ok"


def test_every_trigger_is_in_the_table() -> None:
    used = {t for _, t in TRANSITIONS}
    assert used == set(Trigger)
    states = {s for s, _ in TRANSITIONS} | set(TRANSITIONS.values())
    assert states == set(State)


# ---- properties ----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    body=st.binary(max_size=20_000),
    cuts=st.lists(st.integers(min_value=0, max_value=30_000), max_size=8),
)
def test_any_body_survives_framing_and_any_split(body: bytes, cuts: list[int]) -> None:
    conn = with_channel(open_conn(frame_max=4096))
    data = content(1, body, frame_max=4096)
    points = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    got = []
    for a, b in itertools.pairwise(points):
        conn.receive_data(data[a:b])
        got += events(conn)
    [ev] = got
    assert isinstance(ev, Content) and ev.body == body


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_only_raises_amqp_errors(data: bytes) -> None:
    conn = with_channel(open_conn(frame_max=4096))
    conn.receive_data(data)
    try:
        for _ in range(100):
            ev = conn.next_event()
            if type(ev).__name__ == "NeedData":
                break
    except AmqpError:
        pass


def test_heartbeat_event_type() -> None:
    conn = open_conn()
    conn.receive_data(beat())
    assert isinstance(conn.next_event(), Heartbeat)
