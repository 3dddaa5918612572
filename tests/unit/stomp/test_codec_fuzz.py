"""Fuzzing the STOMP codec (``polymq_stomp.codec``) with what grows without a bound on the
wire: thousands of headers, header lines and escapes megabytes long, content-lengths past
the frame limit, bodies that never end, and random bytes, whole and one byte at a time.
A server's codec gives frames or a RemoteStompError (an ERROR frame before close) within
its limits, nothing else, and holds no more than ``max_frame`` bytes of one frame."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymq_stomp.codec import Role, StompConnection
from polymq_stomp.frames import Frame, Heartbeat, RemoteStompError

from .helpers import open_connection, receive, wire

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
LIMITS = {"max_frame": 64 * 1024, "max_headers": 64, "max_header_length": 4096}


def server() -> StompConnection:
    return open_connection(Role.SERVER, "1.2", **LIMITS)


def fed(data: bytes, one_byte: bool) -> RemoteStompError | None:
    conn = server()
    chunks = [data[i : i + 1] for i in range(len(data))] if one_byte else [data]
    events, error = receive(conn, chunks)
    assert all(isinstance(e, Frame | Heartbeat) for e in events)
    assert len(conn._buf) <= LIMITS["max_frame"] + 1  # what it holds of one frame
    return error


@FUZZ
@given(st.integers(0, 5000), st.integers(1, 64), st.booleans())
def test_many_headers_are_refused_past_the_limit(count: int, size: int, one_byte: bool) -> None:
    headers = [f"h{i}:{'v' * size}" for i in range(count)]
    data = wire("SEND", "destination:/queue/q", *headers, body=b"x")
    error = fed(data if count < 300 or not one_byte else data[:20_000], one_byte)
    if count + 1 > LIMITS["max_headers"]:
        assert error is not None


@FUZZ
@given(st.integers(0, 200_000), st.sampled_from(["v", "\\n", "\\c"]), st.booleans())
def test_long_header_lines_are_refused_past_the_limit(
    size: int, piece: str, one_byte: bool
) -> None:
    data = wire("SEND", "destination:/queue/q", f"h:{piece * size}", body=b"x")
    error = fed(data if not one_byte else data[:10_000], one_byte)
    if len(piece) * size + 2 > LIMITS["max_header_length"] and not one_byte:
        assert error is not None


@FUZZ
@given(st.integers(0, 2**64), st.booleans())
def test_content_lengths_past_the_frame_are_refused(length: int, one_byte: bool) -> None:
    data = wire("SEND", "destination:/queue/q", f"content-length:{length}", body=b"x" * 100)
    error = fed(data, one_byte)
    if length > LIMITS["max_frame"]:
        assert error is not None


def test_a_body_that_never_ends_is_refused_at_the_limit() -> None:
    conn = server()
    conn.receive_data(wire("SEND", "destination:/queue/q")[:-1])
    error = None
    for _ in range(100):
        _, error = receive(conn, [b"x" * 4096])
        if error is not None:
            break
    assert error is not None


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_give_frames_or_an_error(data: bytes, one_byte: bool) -> None:
    fed(data, one_byte)
