"""Small reader/writer adapters that let one session handler serve TCP and WebSocket (as
amqtt's ``adapters.py``).

A session sees a :class:`Transport`: ``write`` hands bytes on at once (never blocks),
``writable`` turns False while the socket does not drain (the session then keeps its output
and writes it when ``resume_writing`` is called), ``pause_reading`` / ``resume_reading``
stop and restart the flow of ``data_received`` calls, ``close`` flushes what was written
then closes (a peer that does not read within :data:`LINGER` seconds is cut off), ``abort``
closes at once. The session is an :class:`Endpoint`: the adapter calls it with what
arrives, an end of stream, the socket draining again, and the connection's end (once).

- :class:`TcpTransport` is an :class:`asyncio.Protocol` (plain or TLS), the one of
  :mod:`polymq_server.sessions.transport`, shared with the AMQP frontend;
- :func:`serve_websocket` runs one aiohttp WebSocket: a reader loop that feeds the session
  every message's payload (text or binary, any number of frames per message; an empty one
  is skipped, as it carries nothing) and one writer task that drains a queue of outgoing
  chunks, each sent as a text message when it is UTF-8 (as browsers' STOMP clients expect)
  or else as a binary one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from aiohttp import WSMsgType, web

from polymq_server.sessions.transport import (
    HIGH_WATER,
    LINGER,
    LOW_WATER,
    Endpoint,
    TcpTransport,
    peer_name,
)
from polymq_server.sessions.transport import Transport as BaseTransport

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

SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")  # best first


class Transport(BaseTransport, Protocol):
    """:class:`polymq_server.sessions.transport.Transport`, and the kind of connection it is."""

    kind: str  # "tcp" or "ws": the metrics' transport label


class WsTransport:
    """The session's transport over one aiohttp WebSocket (see :func:`serve_websocket`)."""

    kind = "ws"

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.ws = ws
        self.request = request
        self.peer = peer_name(
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
        if self._queued > HIGH_WATER:
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
                    if not self._writable and self._queued < LOW_WATER:
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
                if data:  # (an empty message carries no bytes; b"" is the codec's end of stream)
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
