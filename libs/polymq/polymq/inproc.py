"""An in-process byte pipe between a client and a server that live in one process.

``polymq run`` hosts the core and every frontend in one process, and each frontend's link to
the core (:class:`~polymq.client.Client`) would go through the loopback TCP stack: two
writes, two reads and their event-loop wake-ups for every request and its answer. A core
that is :func:`served <serve>` here is reached by :meth:`Client.connect
<polymq.client.Client.connect>` over a :class:`Pipe` instead: the same wire protocol (bytes
through the same codecs, so nothing is shared between the two sides but bytes), the same
flow control, no socket. The core's TCP listener still serves everyone else.

A pipe is two :class:`PipeEnd` transports, one per side, each an ``asyncio.Transport`` to
its protocol:

- ``write`` keeps the bytes and hands everything written in one turn of the loop to the
  peer's ``data_received`` on the next (at most :data:`CHUNK` bytes per call, in order);
- ``pause_reading`` on one end holds back what its peer writes, which then counts against
  the peer's write buffer: past the high-water mark the peer's protocol is told to
  ``pause_writing``, and ``resume_writing`` once it drained below the low-water mark (as a
  socket that does not drain);
- ``close`` hands on what was written, then an end of stream (``eof_received``) and the
  connection's end (``connection_lost(None)``) on both sides; ``abort`` drops what was not
  handed on and ends both at once (the peer sees ``ConnectionResetError``, as a reset); a
  protocol whose ``data_received`` raises is logged and ends both the same way (it gets its
  exception in ``connection_lost``), as a socket transport does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["CHUNK", "Pipe", "PipeEnd", "connect", "serve", "served", "unserve"]

CHUNK = 256 * 1024  # bytes per data_received call, as a socket read hands on
_HIGH, _LOW = 64 * 1024, 16 * 1024  # asyncio's default write buffer limits

log = logging.getLogger(__name__)

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
        self._out: list[bytes] = []  # written, not yet handed to the peer
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
        self._out.append(bytes(data))
        self._size += len(data)
        self._schedule()
        if not self._writing_paused and self._size > self._high:
            self._writing_paused = True
            self.protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

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
        if self._out and peer._reading:
            data = b"".join(self._out)
            rest = data[CHUNK:]
            data = data[:CHUNK]
            self._out = [rest] if rest else []
            self._size = len(rest)
            if rest:
                self._schedule()
            try:
                peer.protocol.data_received(data)
            except Exception as exc:  # a bug in the protocol: end the connection, as uvloop
                log.exception("in-process connection %s: data_received failed", peer.name)
                peer._drop(exc, "the in-process peer failed")
                return
            if self._writing_paused and self._size <= self._low and not self._lost:
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
