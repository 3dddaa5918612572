"""An in-process pipe between a client and a server that live in one process.

``polymq run`` hosts the core and every frontend in one process, and each frontend's link to
the core (:class:`~polymq.client.Client`) would go through the loopback TCP stack: two
writes, two reads and their event-loop wake-ups for every request and its answer. A core
that is :func:`served <serve>` here is reached by :meth:`Client.connect
<polymq.client.Client.connect>` over a :class:`Pipe` instead: the same wire protocol, the
same codecs' state checks, the same flow control, no socket; and the events every message
costs are handed over as they are, not encoded and decoded again (``write_events`` below:
measured, the codec was 39.5% of ``polymq run``'s CPU on the AMQP path and 17% on STOMP's).
The core's TCP listener still serves everyone else.

A pipe is two :class:`PipeEnd` transports, one per side, each an ``asyncio.Transport`` to
its protocol:

- ``write`` keeps the bytes and hands everything written in one turn of the loop to the
  peer's ``data_received`` on the next (at most :data:`CHUNK` bytes per call, in order);
- ``pause_reading`` on one end holds back what its peer writes, which then counts against
  the peer's write buffer: past the high-water mark the peer's protocol is told to
  ``pause_writing``, and ``resume_writing`` once it drained below the low-water mark (as a
  socket that does not drain);
- ``write_events`` hands events over without encoding them, to a peer protocol that
  takes them (``events_received(events, size)``: :func:`passes_events`), in order with the
  bytes written around them: the frontends' links to the core pass their busiest events so
  (:data:`PASSED`: publishes, deliveries, acks and their answers), and
  :func:`write_events` encodes the others as frames, as before. What a pipe hands over is
  as private as decoded bytes would be: a :class:`~polymq.types.Message` is copied
  (:meth:`~polymq.types.Message.copy`) when it is written, so neither side sees what the
  other changes later; the rest of a passed event is the sender's to forget (a new list, a
  new dict: nothing it keeps changing);
- ``close`` hands on what was written, then an end of stream (``eof_received``) and the
  connection's end (``connection_lost(None)``) on both sides; ``abort`` drops what was not
  handed on and ends both at once (the peer sees ``ConnectionResetError``, as a reset); a
  protocol whose ``data_received`` raises is logged and ends both the same way (it gets its
  exception in ``connection_lost``), as a socket transport does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from .errors import LocalProtocolError
from .events import Ack, Deliver, Event, Nack, Ok, Publish, Pulled

if TYPE_CHECKING:
    from .codec import Connection

__all__ = [
    "CHUNK",
    "PASSED",
    "Pipe",
    "PipeEnd",
    "connect",
    "passes_events",
    "serve",
    "served",
    "unserve",
    "write_events",
]

CHUNK = 256 * 1024  # bytes per data_received call, as a socket read hands on
_HIGH, _LOW = 64 * 1024, 16 * 1024  # asyncio's default write buffer limits

log = logging.getLogger(__name__)

# The events a pipe hands over as they are (the rest are encoded): the ones every message
# costs, whose fields the core and the client make fresh for each and never keep changing.
PASSED: Final = frozenset(cls.OP for cls in (Publish, Deliver, Ack, Nack, Ok, Pulled))
_COPIED: Final = frozenset(cls.OP for cls in (Publish, Deliver, Pulled))  # carry messages

_servers: dict[tuple[str, int], Callable[[], asyncio.Protocol]] = {}
_ids = itertools.count(1)


def serve(host: str, port: int, factory: Callable[[], asyncio.Protocol]) -> None:
    """Let :func:`connect` to ``(host, port)`` in this process reach ``factory``'s protocols."""
    _servers[(host, port)] = factory


def unserve(host: str, port: int) -> None:
    _servers.pop((host, port), None)


def served(host: str, port: int) -> bool:
    return (host, port) in _servers


def connect(
    host: str, port: int, factory: Callable[[], asyncio.Protocol]
) -> tuple[PipeEnd, asyncio.Protocol] | None:
    """A pipe from a new ``factory()`` protocol to the server at ``(host, port)`` in this
    process (both protocols have had ``connection_made``), or None if there is none here."""
    server = _servers.get((host, port))
    if server is None:
        return None
    pipe = Pipe(factory(), server(), f"in-process:{next(_ids)}", f"{host}:{port}")
    return pipe.client, pipe.client.protocol


def passes_events(transport: asyncio.BaseTransport | None) -> bool:
    """Whether ``transport`` is a pipe end whose peer takes events (:func:`write_events`)."""
    return isinstance(transport, PipeEnd) and transport.passes_events


def write_events(
    transport: PipeEnd,
    conn: Connection,
    events: Sequence[Event],
    weights: Sequence[int],
    frame_bytes: int,
    unsendable: Callable[[Event, LocalProtocolError], None] | None = None,
) -> None:
    """Write ``events`` (``weights``: what each would add to a frame) to a pipe end whose
    peer takes events: runs of :data:`PASSED` events handed over as they are (their state
    checked by ``conn``, :meth:`~polymq.codec.Connection.send_events`), the others encoded
    by ``conn`` as frames of about ``frame_bytes``, all in order. Raises what the codec
    raises for an event it cannot send; with ``unsendable``, a run that cannot be encoded
    is written one frame per event instead, and each event that cannot be is given to it
    (the rest go on)."""
    for passing, group in itertools.groupby(zip(events, weights, strict=True), key=_passed):
        pairs = list(group)
        run = [event for event, _ in pairs]
        sizes = [size for _, size in pairs]
        if passing:
            conn.send_events(run)
            transport.write_events(list(map(_private, run)), sum(sizes))
            continue
        try:
            transport.writelines(conn.send_frames(run, sizes, frame_bytes))
        except LocalProtocolError:
            if unsendable is None:
                raise
            for event in run:
                try:
                    transport.write(conn.send(event))
                except LocalProtocolError as exc:
                    unsendable(event, exc)


def _passed(pair: tuple[Event, int]) -> bool:
    return pair[0].OP in PASSED


def _private(event: Event) -> Event:
    """``event`` with copies of its messages (what a peer may keep and the sender change)."""
    if event.OP not in _COPIED:
        return event
    messages = event.messages  # type: ignore[attr-defined]
    return dataclasses.replace(event, messages=[m.copy() for m in messages])  # type: ignore[type-var]


@dataclasses.dataclass(slots=True)
class _Events:
    """Events written to a pipe end, handed on together (``size``: their weight)."""

    events: list[Event]
    size: int


class Pipe:
    """Two connected ends: ``client`` (for the connecting side) and ``server``."""

    def __init__(
        self, client: asyncio.Protocol, server: asyncio.Protocol, client_name: str, server_name: str
    ) -> None:
        loop = asyncio.get_running_loop()
        self.client = PipeEnd(loop, client, client_name, server_name)
        self.server = PipeEnd(loop, server, server_name, client_name)
        self.client.peer, self.server.peer = self.server, self.client
        server.connection_made(self.server)
        client.connection_made(self.client)


class PipeEnd(asyncio.Transport):
    """One side's transport: what its protocol writes goes to the other end's protocol."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol, name: str, peer: str
    ) -> None:
        super().__init__()
        self._loop = loop
        self.protocol = protocol
        self.peer: PipeEnd | None = None
        self.name = name
        self._extra = {"peername": peer, "sockname": name}
        self._out: deque[bytes | _Events] = deque()  # written, not yet handed to the peer
        self._size = 0
        self._scheduled = False
        self._reading = True  # False: hold back what the peer writes to us
        self._closing = False  # close() was called: hand on what is left, then end
        self._lost = False  # connection_lost was called on our protocol
        self._writing_paused = False
        self._high, self._low = _HIGH, _LOW

    # ---- asyncio.BaseTransport ---------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def close(self) -> None:
        if self.is_closing():
            return
        self._closing = True
        self._schedule()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    # ---- reading ------------------------------------------------------------------------
    def is_reading(self) -> bool:
        return self._reading and not self._lost

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            if self.peer is not None and (self.peer._out or self.peer._closing):
                self.peer._schedule()

    # ---- writing ------------------------------------------------------------------------
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = _HIGH if low is None else 4 * low
        if low is None:
            low = high // 4
        if not 0 <= low <= high:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._size

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.is_closing():
            return  # as a socket transport: writes after close() are dropped
        if not data:
            return
        self._buffer(bytes(data), len(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    @property
    def passes_events(self) -> bool:
        """Whether the peer's protocol takes events (``events_received``)."""
        peer = self.peer
        return peer is not None and hasattr(peer.protocol, "events_received")

    def write_events(self, events: list[Event], size: int) -> None:
        """Hand ``events`` to the peer's ``events_received(events, size)`` on the next turn,
        in order with the bytes written around them (``size``: about what they would weigh
        encoded, for flow control). Use :func:`write_events`, which checks the state and
        copies what the peer must not share."""
        if self.is_closing() or not events:
            return
        self._buffer(_Events(events, size), size)

    def _buffer(self, item: bytes | _Events, size: int) -> None:
        """Keep ``item`` (``size`` bytes, or what its events weigh) for the next hand-on;
        past the high-water mark our protocol is told to pause writing."""
        self._out.append(item)
        self._size += size
        self._schedule()
        if not self._writing_paused and self._size > self._high:
            self._writing_paused = True
            self.protocol.pause_writing()

    def write_eof(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        return False

    def abort(self) -> None:
        if not self._lost:
            self._drop(None, "the in-process peer aborted the connection")

    # ---- handing on ---------------------------------------------------------------------
    def _schedule(self) -> None:
        if not self._scheduled and not self._lost:
            self._scheduled = True
            self._loop.call_soon(self._hand_on)

    def _hand_on(self) -> None:
        """Give the peer's protocol what we wrote (if it reads), then end if closing."""
        self._scheduled = False
        peer = self.peer
        if self._lost or peer is None:
            return
        if peer._lost:
            gone = "the in-process peer is gone"
            self._drop(ConnectionResetError(gone), gone)
            return
        out = self._out
        handed = 0
        while out and peer._reading and handed < CHUNK and not self._lost:
            item = out.popleft()
            try:
                if type(item) is _Events:
                    self._size -= item.size
                    handed += item.size
                    peer.protocol.events_received(item.events, item.size)  # type: ignore[attr-defined]
                    continue
                assert isinstance(item, bytes)
                parts = [item]  # the bytes written in a row go together
                while out and type(out[0]) is bytes:
                    parts.append(out.popleft())  # type: ignore[arg-type]
                data = b"".join(parts) if len(parts) > 1 else item
                if len(data) > CHUNK - handed:
                    rest = data[CHUNK - handed :]
                    data = data[: CHUNK - handed]
                    out.appendleft(rest)
                self._size -= len(data)
                handed += len(data)
                peer.protocol.data_received(data)
            except Exception as exc:  # a bug in the protocol: end the connection, as uvloop
                log.exception("in-process connection %s: data_received failed", peer.name)
                peer._drop(exc, "the in-process peer failed")
                return
        if out and peer._reading and not self._lost:
            self._schedule()  # more than a chunk (a paused peer asks again on resume)
        if handed and self._writing_paused and self._size <= self._low and not self._lost:
            self._writing_paused = False
            self.protocol.resume_writing()
        if self._closing and not self._out and not self._lost:
            if not peer._lost:
                peer.protocol.eof_received()
            peer._end(None)
            self._end(None)

    def _drop(self, exc: Exception | None, reset: str) -> None:
        """End both sides at once, dropping what neither handed on: our protocol's
        ``connection_lost`` gets ``exc``, the peer's a ``ConnectionResetError(reset)`` (a
        side already gone is left as it is)."""
        for end in (self, self.peer):
            if end is not None:
                end._out.clear()
                end._size = 0
        self._end(exc)
        if self.peer is not None:
            self.peer._end(ConnectionResetError(reset))

    def _end(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self._loop.call_soon(self.protocol.connection_lost, exc)
