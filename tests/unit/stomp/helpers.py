"""Test helpers for the STOMP codec, after h11's ``tests/helpers.py`` and ``test_io.py::tr``.

* :func:`wire` builds frame bytes by hand, so tests pin the wire format and can send what no
  well-behaved :class:`~polymq_stomp.codec.StompConnection` would.
* :func:`tr` feeds bytes to fresh connections whole, one byte at a time and followed by the
  start of the next frame, and checks each way yields the same events (or error).
* :class:`ConnectionPair` is a client and a server wired back to back: what one sends, the
  other receives.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

from polymq_stomp.codec import CLOSED, NEED_DATA, Closed, Role, State, StompConnection
from polymq_stomp.frames import Command, Frame, Heartbeat, RemoteStompError

__all__ = [
    "OTHER",
    "ConnectionPair",
    "Event",
    "chunked",
    "connecting_client",
    "open_connection",
    "receive",
    "tr",
    "wire",
]

Event: TypeAlias = Frame | Heartbeat | Closed
OTHER = {Role.CLIENT: Role.SERVER, Role.SERVER: Role.CLIENT}


def wire(command: str, *headers: str, body: bytes = b"", eol: bytes = b"\n") -> bytes:
    """A frame by hand: ``command``, header lines as given (already escaped), body, NUL."""
    lines = [command, *headers, ""]
    return eol.join(line.encode() for line in lines) + eol + body + b"\0"


def receive(
    conn: StompConnection, chunks: Iterable[bytes], *, eof: bool = False
) -> tuple[list[Event], RemoteStompError | None]:
    """Feed ``chunks`` (then EOF if ``eof``), draining events after each, up to an error.

    :data:`CLOSED` (which ``next_event`` repeats once the stream ended) is recorded once."""
    events: list[Event] = []

    def drain() -> None:
        while (event := conn.next_event()) is not NEED_DATA:
            assert isinstance(event, Frame | Heartbeat | Closed)
            events.append(event)
            if event is CLOSED:
                return

    try:
        for chunk in chunks:
            if chunk:  # b"" would mean EOF
                conn.receive_data(chunk)
            drain()
        if eof:
            conn.receive_data(b"")
            drain()
    except RemoteStompError as exc:
        return events, exc
    return events, None


def chunked(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` split at the offsets ``cuts`` (any order; empty pieces are dropped)."""
    bounds = [0, *sorted(c for c in cuts if 0 <= c <= len(data)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def open_connection(role: Role, version: str = "1.2", **limits: Any) -> StompConnection:
    """A ``role`` connection in state OPEN speaking ``version``, as after a real handshake."""
    pair = ConnectionPair(**limits)
    pair.handshake(version)
    return pair.conn[role]


def connecting_client(**limits: Any) -> StompConnection:
    """A client that sent CONNECT and waits for CONNECTED."""
    client = StompConnection(Role.CLIENT, **limits)
    client.send(Frame(Command.CONNECT, (("accept-version", "1.0,1.1,1.2"),)))
    return client


# A complete frame the peer may send, by the receiver's role and state: ``tr`` feeds its first
# bytes as trailing data, then the last byte, which must complete it.
_NEXT_FRAME = {
    (Role.SERVER, State.CONNECTING): Frame(Command.CONNECT, (("accept-version", "1.2"),)),
    (Role.SERVER, State.OPEN): Frame(Command.SEND, (("destination", "/q/next"),), b"next"),
    (Role.CLIENT, State.CONNECTING): Frame(Command.CONNECTED, (("version", "1.2"),)),
    (Role.CLIENT, State.OPEN): Frame(Command.RECEIPT, (("receipt-id", "77"),)),
}


def _next_bytes(role: Role, state: State) -> tuple[bytes, Frame | None]:
    frame = _NEXT_FRAME.get((role, state))
    if frame is None:  # CLOSED: whatever comes is dropped unread
        return wire("MESSAGE", "a:b"), None
    return wire(
        frame.command.value, *(f"{k}:{v}" for k, v in frame.headers), body=frame.body
    ), frame


def tr(
    make: Callable[[], StompConnection],
    data: bytes,
    expected: Sequence[Event],
    *,
    error: str | None = None,
    detail: str | None = None,
    eof: bool = False,
    state: State | None = None,
    trailing: bool = True,
) -> None:
    """Feed ``data`` to a fresh ``make()`` connection three ways and check each yields
    ``expected``, then (if ``error``) a RemoteStompError whose ``message`` is ``error`` (and,
    fed whole, whose ``detail`` contains ``detail``), leaving the connection in ERROR:

    1. all at once;
    2. one byte at a time;
    3. followed by all but the last byte of a next frame, which must not disturb ``data``'s
       events; then that last byte, which must complete one more frame.

    ``eof`` closes the stream after ``data``; ``state`` is the state expected at the end;
    ``trailing=False`` skips 3, for ``data`` that does not end where a frame may begin.
    """
    expected = list(expected)

    def check(conn: StompConnection, events: list[Event], exc: RemoteStompError | None) -> None:
        assert events == expected
        if error is None:
            assert exc is None, f"unexpected {exc!r}: {exc.detail}" if exc else ""
            if state is not None:
                assert conn.state is state
            return
        assert exc is not None, f"expected an error {error!r}, got none"
        assert exc.message == error, (exc.message, exc.detail)
        assert conn.state is State.ERROR
        # An errored connection stays errored, whatever arrives next.
        conn.receive_data(wire("SEND", "destination:/q"))
        try:
            conn.next_event()
        except RemoteStompError:
            pass
        else:  # pragma: no cover - the assertion message is the point
            raise AssertionError("an errored connection produced an event")

    conn = make()
    events, exc = receive(conn, [data], eof=eof)
    check(conn, events, exc)
    if detail is not None:
        assert exc is not None
        assert detail in exc.detail, exc.detail

    conn = make()
    check(conn, *receive(conn, [data[i : i + 1] for i in range(len(data))], eof=eof))

    if eof or not trailing:
        return
    conn = make()
    probe = make()
    receive(probe, [data])
    nxt, nxt_frame = _next_bytes(probe.role, probe.state)
    events, exc = receive(conn, [data + nxt[:-1]])
    check(conn, events, exc)
    if error is None:
        assert conn.next_event() is NEED_DATA
        more, exc = receive(conn, [nxt[-1:]])
        assert exc is None
        assert more == ([] if nxt_frame is None else [nxt_frame])


class ConnectionPair:
    """A client and a server :class:`StompConnection`; what one sends the other receives."""

    def __init__(self, **limits: Any) -> None:
        self.conn = {role: StompConnection(role, **limits) for role in Role}

    @property
    def client(self) -> StompConnection:
        return self.conn[Role.CLIENT]

    @property
    def server(self) -> StompConnection:
        return self.conn[Role.SERVER]

    def send(self, role: Role, frame: Frame, *, cuts: Iterable[int] = ()) -> bytes:
        """``role`` sends ``frame``; the peer receives the bytes (split at ``cuts``) and must
        produce exactly ``frame``. Returns the bytes."""
        data = self.conn[role].send(frame)
        got, exc = receive(self.conn[OTHER[role]], chunked(data, cuts))
        if exc is not None:
            raise exc
        assert got == [frame]
        return data

    def handshake(self, version: str = "1.2") -> None:
        """CONNECT, then CONNECTED with ``version``, negotiated on both sides as a session does."""
        self.send(Role.CLIENT, Frame(Command.CONNECT, (("accept-version", version), ("host", "/"))))
        assert self.states() == (State.CONNECTING, State.CONNECTING)
        self.server.negotiate(version)
        self.send(Role.SERVER, Frame(Command.CONNECTED, (("version", version),)))
        self.client.negotiate(version)
        assert self.states() == (State.OPEN, State.OPEN)

    def states(self) -> tuple[State, State]:
        """(client state, server state)."""
        return self.client.state, self.server.state
