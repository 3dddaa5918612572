"""Bad input over raw sockets: each is answered as the spec says (the protocol header we
speak, connection.close or channel.close with the right reply code), and the process goes
on serving everyone else."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from pamqp import commands, frame, header

from .helpers import Broker, RawAmqp, pika_connection, unique

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def raw(broker: Broker) -> Iterator[RawAmqp]:
    r = RawAmqp(broker.amqp_port)
    yield r
    r.close()
    # and the process still serves a new connection
    conn = pika_connection(broker)
    conn.channel().queue_declare(unique("q"))
    conn.close()


def closed_with(raw: RawAmqp, code: int) -> commands.Connection.Close:
    close: commands.Connection.Close = raw.expect(commands.Connection.Close)
    assert close.reply_code == code, close.reply_text
    raw.method(0, commands.Connection.CloseOk())
    assert raw.closed_by_server()
    return close


def test_wrong_protocol_version_gets_our_header(raw: RawAmqp) -> None:
    raw.send(b"AMQP\x01\x01\x00\x0a")  # AMQP 1.0
    _, data = raw.read()
    assert data == b"AMQP\x00\x00\x09\x01"
    assert raw.closed_by_server()


def test_not_amqp_at_all_gets_our_header(raw: RawAmqp) -> None:
    raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    _, data = raw.read()
    assert data == b"AMQP\x00\x00\x09\x01"
    assert raw.closed_by_server()


def test_garbage_after_the_protocol_header(raw: RawAmqp) -> None:
    raw.send(b"AMQP\x00\x00\x09\x01")
    raw.expect(commands.Connection.Start)
    raw.send(b"\x01\x00\x00\x00\x00\x00\x05hello\x00" + b"garbage" * 10)
    close = raw.expect(commands.Connection.Close)
    assert close.reply_code in (501, 502)
    assert raw.closed_by_server()


def test_bad_frame_end(raw: RawAmqp) -> None:
    raw.handshake()
    data = bytearray(frame.marshal(commands.Channel.Open(), 1))
    data[-1] = 0x00
    raw.send(bytes(data))
    close = closed_with(raw, 501)
    assert "frame end" in close.reply_text


def test_frame_over_frame_max(raw: RawAmqp) -> None:
    raw.handshake(frame_max=4096)
    raw.open_channel(1)
    raw.method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    raw.send(frame.marshal(header.ContentHeader(0, 10_000, commands.Basic.Properties()), 1))
    raw.send(struct.pack(">BHI", 3, 1, 10_000) + b"x" * 10_000 + b"\xce")
    close = closed_with(raw, 501)
    assert "frame_max" in close.reply_text


def test_method_on_a_channel_never_opened(raw: RawAmqp) -> None:
    raw.handshake()
    raw.method(5, commands.Basic.Qos(prefetch_count=1))
    close = closed_with(raw, 504)
    assert "channel.open" in close.reply_text


def test_method_on_a_closed_channel(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    raw.method(1, commands.Channel.Close(200, "bye", 0, 0))
    raw.expect(commands.Channel.CloseOk)
    raw.method(1, commands.Queue.Declare(queue=unique("q")))
    closed_with(raw, 504)


def test_channel_opened_twice(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    raw.method(1, commands.Channel.Open())
    closed_with(raw, 504)


def test_frames_after_a_channel_error_are_dropped_until_close_ok(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    raw.method(1, commands.Queue.Declare(queue=unique("absent"), passive=True))
    raw.method(1, commands.Basic.Qos(prefetch_count=1))  # sent before it saw the close
    close = raw.expect(commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
    raw.method(1, commands.Channel.CloseOk())
    raw.open_channel(1)  # the number is free again
    raw.method(1, commands.Basic.Qos(prefetch_count=1))
    raw.expect(commands.Basic.QosOk)


def test_unknown_class(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    payload = struct.pack(">HH", 999, 10)
    raw.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    close = closed_with(raw, 540)
    assert "unknown class 999" in close.reply_text


def test_unknown_method_of_a_known_class(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    payload = struct.pack(">HH", 60, 999)
    raw.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    closed_with(raw, 540)


def test_a_server_method_from_the_client(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    raw.method(1, commands.Basic.Deliver("tag", 1, False, "", "k"))
    closed_with(raw, 503)


def test_content_header_without_publish(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    raw.send(frame.marshal(header.ContentHeader(0, 1, commands.Basic.Properties()), 1))
    closed_with(raw, 505)


def test_method_instead_of_content(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    raw.method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    raw.method(1, commands.Basic.Qos(prefetch_count=1))
    closed_with(raw, 505)


def test_malformed_arguments(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    payload = struct.pack(">HH", 50, 10) + b"\x00"  # queue.declare cut short
    raw.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    closed_with(raw, 502)


def test_reused_consumer_tag(raw: RawAmqp) -> None:
    raw.handshake()
    raw.open_channel(1)
    q = unique("q")
    raw.method(1, commands.Queue.Declare(queue=q))
    raw.expect(commands.Queue.DeclareOk)
    for _ in range(2):
        raw.method(1, commands.Basic.Consume(queue=q, consumer_tag="same"))
    raw.expect(commands.Basic.ConsumeOk)
    closed_with(raw, 530)


def test_methods_before_open(raw: RawAmqp) -> None:
    raw.send(b"AMQP\x00\x00\x09\x01")
    raw.expect(commands.Connection.Start)
    raw.method(0, commands.Connection.Open("/"))
    close = closed_with(raw, 503)
    assert "start-ok" in close.reply_text


def test_heartbeat_on_a_channel(raw: RawAmqp) -> None:
    raw.handshake()
    raw.send(b"\x08\x00\x01\x00\x00\x00\x00\xce")
    closed_with(raw, 501)


def test_oversized_message_closes_the_channel(raw: RawAmqp, broker: Broker) -> None:
    raw.handshake()
    raw.open_channel(1)
    raw.method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    size = 17 * 1024 * 1024  # over the core's 16 MiB
    raw.send(frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1))
    chunk = 131072 - 8
    sent = 0
    while sent < size:
        n = min(chunk, size - sent)
        raw.send(struct.pack(">BHI", 3, 1, n) + b"\0" * n + b"\xce")
        sent += n
    close = raw.expect(commands.Channel.Close)
    assert close.reply_code == 406 and "larger than the maximum" in close.reply_text
    raw.method(1, commands.Channel.CloseOk())
    raw.open_channel(1)
