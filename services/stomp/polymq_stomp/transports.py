"""Small reader/writer adapters that let one session handler serve TCP and WebSocket (as
amqtt's ``adapters.py``).

A session sees a :class:`Transport`: ``write`` hands bytes on at once (never blocks),
``writable`` turns False while the socket does not drain (the session then keeps its output
and writes it when ``resume_writing`` is called), ``pause_reading`` / ``resume_reading``
stop and restart the flow of ``data_received`` calls, ``close`` flushes what was written
then closes (a peer that does not read within :data:`LINGER` seconds is cut off), ``abort``
closes at once. The session is an :class:`Endpoint`: the adapter calls it with what
arrives, an end of stream, the socket draining again, and the connection's end (once).

- :class:`TcpTransport` is an :class:`asyncio.Protocol` (plain or TLS);
- :func:`serve_websocket` runs one aiohttp WebSocket: a reader loop that feeds the session
  every message's payload (text or binary, any number of frames per message) and one writer
  task that drains a queue of outgoing chunks, each sent as a text message when it is UTF-8
  (as browsers' STOMP clients expect) or else as a binary one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from aiohttp import WSMsgType, web

__all__ = [
    "LINGER",
    "SUBPROTOCOLS",
    "Endpoint",
    "TcpTransport",
    "Transport",
    "WsTransport",
    "pick_subprotocol",
    "serve_websocket",
]

log = logging.getLogger(__name__)

LINGER = 5.0  # seconds a closing connection has to take what we wrote
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")  # best first
_HIGH_WATER = 256 * 1024  # bytes the socket layer may hold before writable turns False
_LOW_WATER = 64 * 1024


class Transport(Protocol):
    kind: str  # "tcp" or "ws": the metrics' transport label
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


def _peer(info: object) -> str:
    if isinstance(info, tuple) and len(info) >= 2:
        return f"{info[0]}:{info[1]}"
    return str(info)


class TcpTransport(asyncio.Protocol):
    """STOMP over TCP (or TLS): the asyncio protocol and the session's transport in one."""

    kind = "tcp"

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
        self._transport.set_write_buffer_limits(high=_HIGH_WATER, low=_LOW_WATER)  # type: ignore[union-attr]
        self.peer = _peer(transport.get_extra_info("peername"))
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
        input would make the kernel answer with a reset, and a reset can destroy an ERROR
        frame the peer has not read yet."""
        t = self._transport
        if t is None or t.is_closing() or self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        if t.can_write_eof() and not self._peer_eof:
            t.write_eof()  # after what is buffered
            t.resume_reading()
            self._linger = loop.call_later(LINGER, t.abort)
        else:  # TLS (close_notify), or the peer is done sending: close after the buffer
            t.close()
            self._linger = loop.call_later(LINGER, t.abort)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class WsTransport:
    """The session's transport over one aiohttp WebSocket (see :func:`serve_websocket`)."""

    kind = "ws"

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.ws = ws
        self.request = request
        self.peer = _peer(
            request.transport.get_extra_info("peername") if request.transport else "?"
        )
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self._reading = asyncio.Event()
        self._reading.set()
        self._writable = True
        self._closing = False
        self.endpoint: Endpoint | None = None

    @property
    def writable(self) -> bool:
        return self._writable

    def write(self, data: bytes) -> None:
        if self._closing or self.ws.closed:
            return
        self._queue.append(data)
        self._queued += len(data)
        if self._queued > _HIGH_WATER:
            self._writable = False
        self._wake.set()

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def close(self) -> None:
        self._closing = True
        self._wake.set()

    def abort(self) -> None:
        self._closing = True
        self._queue.clear()
        self._wake.set()
        t = self.request.transport
        if t is not None:
            t.abort()

    async def writer(self) -> None:
        """Send queued chunks in order; after close(), the close handshake."""
        ws = self.ws
        queue = self._queue
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while queue:
                    data = queue.popleft()
                    self._queued -= len(data)
                    text = data.isascii()
                    if not text:
                        try:
                            data.decode("utf-8")
                            text = True
                        except UnicodeDecodeError:
                            pass
                    await ws.send_frame(data, WSMsgType.TEXT if text else WSMsgType.BINARY)
                    if not self._writable and self._queued < _LOW_WATER:
                        self._writable = True
                        if self.endpoint is not None:
                            self.endpoint.resume_writing()
                if self._closing:
                    await asyncio.wait_for(ws.close(), LINGER)
                    return
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            log.debug("stomp: websocket %s: write failed: %s", self.peer, exc)
            self.abort()


def pick_subprotocol(request: web.Request) -> tuple[str, ...]:
    """The best STOMP subprotocol the client offers: always one when it offers any of ours
    (Chrome refuses a socket whose server picked none of those it asked for); none when it
    offers none (stomp.py sends no Sec-WebSocket-Protocol)."""
    offered = {p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p}
    for proto in SUBPROTOCOLS:
        if proto in offered:
            return (proto,)
    return ()


async def serve_websocket(
    request: web.Request,
    make_endpoint: Callable[[WsTransport], Endpoint],
    *,
    max_msg_size: int,
) -> web.WebSocketResponse:
    """Run one STOMP-over-WebSocket connection until it ends."""
    ws = web.WebSocketResponse(
        protocols=pick_subprotocol(request),
        max_msg_size=max_msg_size,
        compress=False,
        decode_text=False,
        timeout=LINGER,
    )
    await ws.prepare(request)
    transport = WsTransport(ws, request)
    endpoint = transport.endpoint = make_endpoint(transport)
    writer = asyncio.create_task(transport.writer(), name=f"stomp-ws-writer {transport.peer}")
    try:
        while not ws.closed:
            if not transport._reading.is_set():
                await transport._reading.wait()
            msg = await ws.receive()
            if msg.type is WSMsgType.TEXT or msg.type is WSMsgType.BINARY:
                data = msg.data
                endpoint.data_received(data if isinstance(data, bytes) else data.encode())
            else:  # CLOSE, CLOSING, CLOSED, ERROR
                break
        if not transport._closing:
            endpoint.eof_received()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(writer), LINGER * 2)
    finally:
        if not writer.done():
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        transport.endpoint = None
        endpoint.connection_lost()
    return ws
