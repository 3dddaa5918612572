"""Fuzzing the wire codec (``polymq.codec``) with deep and oversized msgpack: operations
whose fields nest lists and maps up to 100,000 deep, lengths that claim billions of items
in a few bytes, and random payloads, in frames a server receives (with ``keep_raw`` too, as
a relay reads them). The codec gives events or a RemoteProtocolError, nothing else, and
quickly (msgpack is C: a length it believed would be allocated before the bytes run out)."""

from __future__ import annotations

import struct
import time
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymq.codec import Connection, Role
from polymq.errors import RemoteProtocolError
from polymq.events import Declare, Event, Ping, Publish

from .helpers import frame, open_connection, receive

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def server(keep_raw: bool) -> Connection:
    conn = open_connection(Role.SERVER)
    conn.keep_raw = keep_raw
    return conn


def nested_payload(kind: str, depth: int, op: list[Any]) -> bytes:
    """msgpack of ``[op + [<depth levels of kind>]]``, written by hand (msgpack's packer
    refuses to nest that deep)."""
    head = bytes(msgpack.packb([[*op, None]], use_bin_type=True))
    assert head.endswith(b"\xc0")  # the placeholder, last
    level = b"\x91" if kind == "list" else b"\x81\xa1k"  # [x] or {"k": x}
    return head[:-1] + level * depth + b"\xc0"


def outcome(conn: Connection, data: bytes) -> tuple[list[Event], RemoteProtocolError | None]:
    started = time.monotonic()
    got = receive(conn, [data])
    assert time.monotonic() - started < 5
    return got


@FUZZ
@given(
    st.sampled_from(["list", "map"]),
    st.sampled_from([100, 1023, 1024, 1025, 100_000]) | st.integers(0, 20_000),
    st.sampled_from([[Ping.OP], [Publish.OP, 1, "queue/q"], [Declare.OP, 2, "queue/q"]]),
    st.booleans(),
)
def test_deep_msgpack_gives_events_or_a_protocol_error(
    kind: str, depth: int, op: list[Any], keep_raw: bool
) -> None:
    events, error = outcome(server(keep_raw), frame(payload=nested_payload(kind, depth, op)))
    assert error is not None or events


@FUZZ
@given(
    st.sampled_from([b"\xdd", b"\xdf", b"\xc6", b"\xdb"]),  # array32, map32, bin32, str32
    st.integers(2**16, 2**32 - 1),
    st.binary(max_size=20),
    st.booleans(),
)
def test_lengths_past_the_frame_are_a_protocol_error(
    marker: bytes, length: int, rest: bytes, keep_raw: bool
) -> None:
    """A length that claims more than the frame holds is refused before it is allocated."""
    for payload in (
        marker + struct.pack(">I", length) + rest,
        b"\x91" + marker + struct.pack(">I", length) + rest,
    ):
        _, error = outcome(server(keep_raw), frame(payload=payload))
        assert error is not None


@FUZZ
@given(st.binary(max_size=200), st.booleans())
def test_random_payloads_give_events_or_a_protocol_error(payload: bytes, keep_raw: bool) -> None:
    outcome(server(keep_raw), frame(payload=payload))
