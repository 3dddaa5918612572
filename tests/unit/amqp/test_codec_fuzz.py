"""Fuzzing the AMQP codec (``polymq_amqp.wire.codec``) and what the frontend makes of what it
decodes (``properties``): field tables nested up to 20,000 deep (a table in a table...,
arrays in arrays) in a content header's ``headers`` and in queue.declare's arguments,
table lengths past the frame, and random method payloads. The codec gives events or an
AmqpError (a connection close with a reply code); a message it took becomes a polymq
message and back into delivery properties without an error (a stored message stays
deliverable), nothing else."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body, commands, frame

from polymq_amqp.errors import AmqpError
from polymq_amqp.properties import delivery_properties, from_publish
from polymq_amqp.wire.codec import AmqpConnection
from polymq_amqp.wire.events import Content, Event
from polymq_server.names import VhostNames

from .helpers import events, open_conn, with_channel

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
NAMES = VhostNames("/")
DEPTHS = st.sampled_from([1, 100, 300, 1000, 20_000]) | st.integers(0, 3000)


def nested_table(depth: int, kind: str) -> bytes:
    """A field table (its 4-byte length first) nesting ``depth`` tables (``F``) or arrays
    (``A``) in one another."""
    inner = b"\x01aS\x00\x00\x00\x01x"  # {"a": "x"}
    value = b"F" + struct.pack(">I", len(inner)) + inner
    for _ in range(depth):
        if kind == "F":
            entry = b"\x01a" + value
            value = b"F" + struct.pack(">I", len(entry)) + entry
        else:
            value = b"A" + struct.pack(">I", len(value)) + value
    entry = b"\x01h" + value
    return struct.pack(">I", len(entry)) + entry


def header_frame(channel: int, size: int, table: bytes) -> bytes:
    payload = struct.pack(">HHQH", 60, 0, size, 0x2000) + table  # basic, flags: headers
    return struct.pack(">BHI", 2, channel, len(payload)) + payload + b"\xce"


def fed(data: bytes) -> list[Event] | AmqpError:
    conn = with_channel(open_conn())
    conn.receive_data(data)
    try:
        return events(conn)
    except AmqpError as exc:
        return exc


@FUZZ
@given(DEPTHS, st.sampled_from(["F", "A"]))
def test_deep_headers_are_refused_or_carried_through(depth: int, kind: str) -> None:
    data = (
        frame.marshal(commands.Basic.Publish(exchange="", routing_key="k"), 1)
        + header_frame(1, 1, nested_table(depth, kind))
        + frame.marshal(body.ContentBody(b"x"), 1)
    )
    got = fed(data)
    if isinstance(got, AmqpError):
        return
    [content] = got
    assert isinstance(content, Content)
    message = from_publish(content.properties, content.body, "", "k", NAMES)
    assert isinstance(delivery_properties(message, NAMES), bytes)


@FUZZ
@given(DEPTHS, st.sampled_from(["F", "A"]))
def test_deep_arguments_are_refused_or_taken(depth: int, kind: str) -> None:
    args = nested_table(depth, kind)
    # queue.declare: reserved short, queue shortstr, flags octet, arguments table
    payload = struct.pack(">HHH", 50, 10, 0) + b"\x01q" + b"\x00" + args
    data = struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"
    fed(data)


@FUZZ
@given(st.integers(2**16, 2**32 - 1), st.binary(max_size=40))
def test_table_lengths_past_the_frame_are_refused(length: int, rest: bytes) -> None:
    payload = struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + struct.pack(">I", length) + rest
    got = fed(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    assert isinstance(got, AmqpError)


@FUZZ
@given(st.integers(10, 90), st.integers(10, 120), st.binary(max_size=200))
def test_random_method_arguments_give_events_or_an_error(
    class_id: int, method_id: int, args: bytes
) -> None:
    payload = struct.pack(">HH", class_id, method_id) + args
    fed(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")


def test_a_connection_codec_is_what_is_fuzzed() -> None:
    assert isinstance(with_channel(open_conn()), AmqpConnection)
