"""The TCP (and TLS) adapter between asyncio and a frontend's session, shared by the STOMP
and AMQP frontends (as amqtt's ``adapters.py``; STOMP adds a WebSocket one beside it).

A session sees a :class:`Transport`: ``write`` hands bytes on at once (never blocks),
``writable`` turns False while the socket does not drain (the session then keeps its output
and writes it when ``resume_writing`` is called), ``pause_reading`` / ``resume_reading``
stop and restart the flow of ``data_received`` calls, ``close`` flushes what was written
then closes (a peer that does not read within :data:`LINGER` seconds is cut off), ``abort``
closes at once. The session is an :class:`Endpoint`: the adapter calls it with what arrives,
an end of stream, the socket draining again, and the connection's end (once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "HIGH_WATER",
    "LINGER",
    "LOW_WATER",
    "Endpoint",
    "TcpTransport",
    "Transport",
    "peer_name",
]

LINGER = 5.0  # seconds a closing connection has to take what we wrote
HIGH_WATER = 256 * 1024  # bytes the socket layer may hold before writable turns False
LOW_WATER = 64 * 1024


class Transport(Protocol):
    peer: str

    @property
    def writable(self) -> bool: ...
    def write(self, data: bytes) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


class Endpoint(Protocol):
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> None: ...
    def resume_writing(self) -> None: ...
    def connection_lost(self) -> None: ...


def peer_name(info: object) -> str:
    """``host:port`` of a socket address (what ``get_extra_info("peername")`` gives)."""
    if isinstance(info, tuple) and len(info) >= 2:
        return f"{info[0]}:{info[1]}"
    return str(info)


class TcpTransport(asyncio.Protocol):
    """A session over TCP (or TLS): the asyncio protocol and the session's transport in one."""

    kind = "tcp"  # the metrics' transport label

    def __init__(self, make_endpoint: Callable[[TcpTransport], Endpoint]) -> None:
        self._make_endpoint = make_endpoint
        self._transport: asyncio.Transport | None = None
        self._endpoint: Endpoint | None = None
        self._writable = True
        self._closing = False
        self._peer_eof = False
        self._linger: asyncio.TimerHandle | None = None
        self.peer = "?"

    # ---- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self._transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)  # type: ignore[union-attr]
        self.peer = peer_name(transport.get_extra_info("peername"))
        self._endpoint = self._make_endpoint(self)

    def data_received(self, data: bytes) -> None:
        if self._endpoint is not None and not self._closing:
            self._endpoint.data_received(data)

    def eof_received(self) -> bool:
        self._peer_eof = True
        if self._closing:
            return False  # the lingering close is over: the peer read our last words
        if self._endpoint is not None:
            self._endpoint.eof_received()
        # keep the socket open to send what is still owed; the session closes it
        return not self._closing

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.connection_lost()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        if self._endpoint is not None:
            self._endpoint.resume_writing()

    # ---- Transport -----------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        return self._writable

    def write(self, data: bytes) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.write(data)

    def pause_reading(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.pause_reading()

    def resume_reading(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.resume_reading()

    def close(self) -> None:
        """A lingering close: send what is buffered and a FIN, then read (and drop) what the
        peer still sends until it closes too, or LINGER passes. Closing at once with unread
        input would make the kernel answer with a reset, and a reset can destroy the last
        words (a STOMP ERROR frame, an AMQP connection.close) the peer has not read yet."""
        t = self._transport
        if t is None or t.is_closing() or self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        if t.can_write_eof() and not self._peer_eof:
            t.write_eof()  # after what is buffered
            t.resume_reading()
        else:  # TLS (close_notify), or the peer is done sending: close after the buffer
            t.close()
        self._linger = loop.call_later(LINGER, t.abort)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
