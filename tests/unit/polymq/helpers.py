"""Test helpers for the polymq wire codec, after h11's ``tests/helpers.py`` and
``tests/test_io.py::tr``.

* :func:`frame` builds a frame by hand from raw operations, so tests can pin the wire format
  and send what no well-behaved :class:`~polymq.codec.Connection` would.
* :func:`tr` feeds bytes to fresh connections whole, one byte at a time and followed by the
  start of the next frame, and checks that each way yields the same events (or error).
* :class:`ConnectionPair` is a client and a server :class:`~polymq.codec.Connection` wired
  back to back: what one sends, the other receives.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from polymq.codec import NEED_DATA, Connection, Role, State
from polymq.errors import RemoteProtocolError
from polymq.events import Event, Hello, Ok, Ping, Welcome

__all__ = [
    "ConnectionPair",
    "chunked",
    "frame",
    "get_all_events",
    "open_connection",
    "receive",
    "tr",
]

OTHER = {Role.CLIENT: Role.SERVER, Role.SERVER: Role.CLIENT}

HELLO = Hello(1, "test-client/1.0")
WELCOME = Welcome(1, "test-server/1.0", "session-1", {"max_frame": 1024, "max_body": 512})


def frame(*ops: Any, payload: bytes | None = None) -> bytes:
    """A frame by hand: 4-byte big-endian length, then ``msgpack([op, ...])`` (or ``payload``)."""
    if payload is None:
        payload = bytes(msgpack.packb(list(ops), use_bin_type=True))
    return struct.pack(">I", len(payload)) + payload


def get_all_events(conn: Connection) -> list[Event]:
    """Every event ``conn`` has ready, up to NEED_DATA."""
    events: list[Event] = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        assert isinstance(event, Event)
        events.append(event)


def receive(
    conn: Connection, chunks: Iterable[bytes], *, eof: bool = False
) -> tuple[list[Event], RemoteProtocolError | None]:
    """Feed ``chunks`` (then EOF if ``eof``), draining events after each; stop at an error."""
    events: list[Event] = []

    def drain() -> None:
        while (event := conn.next_event()) is not NEED_DATA:
            assert isinstance(event, Event)
            events.append(event)

    try:
        for chunk in chunks:
            if chunk:  # b"" would mean EOF
                conn.receive_data(chunk)
            drain()
        if eof:
            conn.receive_data(b"")
            drain()
    except RemoteProtocolError as exc:
        return events, exc
    return events, None


def chunked(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` split at the offsets ``cuts`` (in any order; duplicates give empty pieces,
    which are dropped because ``b""`` means EOF)."""
    bounds = [0, *sorted(c for c in cuts if 0 <= c <= len(data)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def open_connection(role: Role, *, max_frame: int | None = None) -> Connection:
    """A ``role`` connection in state OPEN, as after a real handshake."""
    pair = ConnectionPair(max_frame=max_frame)
    pair.handshake()
    return pair.conn[role]


# A complete frame the peer of each role may send in state WELCOME or OPEN; ``tr`` feeds its
# first bytes as trailing data, then the rest.
_NEXT_FRAME = {
    Role.SERVER: (frame([Ping.OP, 7]), Ping(7)),  # received by a server
    Role.CLIENT: (frame([Ok.OP, 7, None]), Ok(7, None)),  # received by a client
}


def tr(
    make: Callable[[], Connection],
    data: bytes,
    expected: Sequence[Event],
    *,
    error: str | None = None,
    status: int | None = None,
    eof: bool = False,
    state: State | None = None,
    trailing: bool = True,
) -> None:
    """Feed ``data`` to a fresh ``make()`` connection three ways and check each yields
    ``expected`` events, then (if ``error``, a substring of its message) a RemoteProtocolError
    with ``status`` as its ``error_status_hint`` and the connection in state ERROR:

    1. all at once;
    2. one byte at a time;
    3. followed by the first bytes of a next frame, which must not disturb ``data``'s events;
       then the rest of that frame, which (where it is legal) must come out as one more event.

    ``eof`` closes the stream after ``data``; ``state`` is the state expected at the end;
    ``trailing=False`` skips 3, for ``data`` that does not end where a frame may begin.
    """
    expected = list(expected)

    def check(conn: Connection, events: list[Event], exc: RemoteProtocolError | None) -> None:
        assert events == expected
        if error is None:
            assert exc is None, f"unexpected {exc!r}"
            if state is not None:
                assert conn.state is state
            return
        assert exc is not None, f"expected an error matching {error!r}, got none"
        assert error in str(exc)
        if status is not None:
            assert exc.error_status_hint == status
        assert conn.state is State.ERROR
        # An errored connection stays errored, whatever arrives next.
        conn.receive_data(_NEXT_FRAME[conn.role][0])
        try:
            conn.next_event()
        except RemoteProtocolError:
            pass
        else:  # pragma: no cover - the assertion message is the point
            raise AssertionError("an errored connection produced an event")

    # 1. whole
    conn = make()
    check(conn, *receive(conn, [data], eof=eof))

    # 2. one byte at a time
    conn = make()
    check(conn, *receive(conn, [data[i : i + 1] for i in range(len(data))], eof=eof))

    # 3. with trailing data: the start of the next frame (EOF would make it an error)
    if eof or not trailing:
        return
    conn = make()
    nxt, nxt_event = _NEXT_FRAME[conn.role]
    events, exc = receive(conn, [data + nxt[:-1]])
    check(conn, events, exc)
    # Ping is legal for a server from WELCOME on (pipelining), Ok for a client once OPEN.
    legal = conn.state is State.OPEN or (conn.role is Role.SERVER and conn.state is State.WELCOME)
    if error is None and legal:
        assert conn.next_event() is NEED_DATA
        more, exc = receive(conn, [nxt[-1:]])
        assert exc is None
        assert more == [nxt_event]


class ConnectionPair:
    """A client and a server :class:`Connection`; ``send`` on one feeds the other."""

    def __init__(self, *, max_frame: int | None = None) -> None:
        kw = {} if max_frame is None else {"max_frame": max_frame}
        self.conn = {role: Connection(role, **kw) for role in Role}

    @property
    def client(self) -> Connection:
        return self.conn[Role.CLIENT]

    @property
    def server(self) -> Connection:
        return self.conn[Role.SERVER]

    def send(
        self,
        role: Role,
        events: Event | Sequence[Event],
        expect: Sequence[Event] | str = "match",
        *,
        cuts: Iterable[int] = (),
    ) -> bytes:
        """``role`` sends ``events`` (one frame); its peer receives the bytes (split at ``cuts``)
        and must produce ``expect`` ("match": the same events). Returns the bytes."""
        if isinstance(events, Event):
            events = [events]
            data = self.conn[role].send(events[0])
        else:
            data = self.conn[role].send_many(events)
        got, exc = receive(self.conn[OTHER[role]], chunked(data, cuts))
        if exc is not None:
            raise exc
        assert got == (list(events) if expect == "match" else list(expect))
        return data

    def handshake(self, hello: Hello = HELLO, welcome: Welcome = WELCOME) -> None:
        self.send(Role.CLIENT, hello)
        self.send(Role.SERVER, welcome)
        assert self.client.state is State.OPEN
        assert self.server.state is State.OPEN
