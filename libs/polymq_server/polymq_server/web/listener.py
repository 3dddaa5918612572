"""One TCP listener of an aiohttp runner that takes at most so many connections at once.

aiohttp has no public hook at accept time: ``web.TCPSite`` hands the runner's protocol
factory straight to ``loop.create_server``. So :class:`HttpListener` calls
``loop.create_server`` itself, with a factory that wraps the runner's. What it relies on in
aiohttp is public: ``BaseRunner.server`` (after ``setup()``) is the app's ``web.Server``,
the low-level server whose call makes one connection's asyncio protocol (a
``web.RequestHandler``); the rest is asyncio's ``Protocol`` interface.

Each new connection asks the listener's :class:`~polymq_server.resources.ConnectionLimits` for a
place (the same ``POLYMQ_MAX_CONNECTIONS`` as the STOMP, AMQP and wire listeners; per user
there is none, as nobody has logged in at accept). A connection that gets one is served by
aiohttp, through :class:`_Gate`, which gives the place back when the connection is lost;
one that does not is answered at once: a ``503`` problem (:mod:`polymq_server.web.problemdoc`) with
``Connection: close``, then closed.

:class:`ListenerMetrics`: ``<prefix>_connections`` (open, by listener) and
``<prefix>_connections_refused`` (by listener), declared by :func:`listener_metrics`.

With a :class:`~polymq.connections.ConnectionTable` (``connections``), each connection it
serves is an entry there (protocol ``protocol``), closed by the admin API by closing its
socket; :func:`connection_middleware` gives the entry its user and counts its requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from polymq.errors import Unauthorized

from ..auth.provider import parse_authorization
from ..link.connections import ConnectionTable, Tracked
from ..resources import Admission, ConnectionLimits
from .problemdoc import PROBLEM_JSON, problem_document, status_phrase

__all__ = [
    "REFUSED_LINGER",
    "HttpListener",
    "ListenerMetrics",
    "connection_middleware",
    "listener_metrics",
    "refusal",
]

log = logging.getLogger(__name__)

REFUSED_LINGER = 1.0  # seconds a refused connection's request is read (and dropped) after
# the answer, so that closing it does not reset the connection before the client reads it


@dataclass(frozen=True)
class ListenerMetrics:
    connections: Gauge  # open connections, by ``listener``
    refused: Counter  # connections refused at accept (the listener was full), by ``listener``


def listener_metrics(registry: CollectorRegistry, prefix: str, what: str) -> ListenerMetrics:
    """``<prefix>_connections`` and ``<prefix>_connections_refused`` of the ``what``
    listeners (``HTTP``), by ``listener``, declared in ``registry``."""
    return ListenerMetrics(
        Gauge(
            f"{prefix}_connections",
            f"Open {what} connections, by listener",
            ["listener"],
            registry=registry,
        ),
        Counter(
            f"{prefix}_connections_refused",
            f"{what} connections refused at accept: the listener had as many as it takes",
            ["listener"],
            registry=registry,
        ),
    )


def refusal(detail: str) -> bytes:
    """The whole HTTP answer to a connection the listener has no room for."""
    body = problem_document(503, detail, title="connection limit reached")
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 503 {status_phrase(503)}\r\n"
        f"Content-Type: {PROBLEM_JSON}\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + payload


class _Gate(asyncio.Protocol):
    """One connection of a :class:`HttpListener`. When it is made (after the TLS handshake
    on a TLS listener: asyncio tells the protocol of a connection lost in its handshake
    nothing, so a place taken earlier could never be given back) it asks for a place. With
    one, it is aiohttp's protocol with every call passed on, and gives the place back when
    the connection is lost. Without, it answers the 503 at once, shuts its write side
    (where the transport can: not over TLS), reads and drops what the client sends for
    :data:`REFUSED_LINGER` seconds at most, and closes."""

    def __init__(self, listener: HttpListener) -> None:
        self._listener = listener
        self._inner: asyncio.Protocol | None = None
        self._admission: Admission | None = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.tracked: Tracked | None = None  # its entry in the listener's connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        listener = self._listener
        server = listener.runner.server
        admission = listener.limits.admit()
        if server is not None and admission.refused is None:
            self._admission = admission
            if listener.open is not None:
                listener.open.inc()
            self._inner = server()  # aiohttp's web.RequestHandler
            self._inner.connection_made(transport)
            if listener.connections is not None:
                peer = transport.get_extra_info("peername")
                self.tracked = listener.connections.open(
                    listener.protocol,
                    f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
                    lambda reason: transport.close(),
                )
            return
        admission.release()
        detail = admission.refused or "the listener is shutting down"
        if listener.refused_total is not None:
            listener.refused_total.inc()
        # (uvloop's transports are not asyncio.Transport subclasses, hence no isinstance)
        self._transport = transport = cast(asyncio.Transport, transport)
        listener.refused.add(self)
        transport.write(refusal(detail))
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER, self.close)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        # (refused: the request is dropped, it was answered already)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return False  # refused, and the client is done too: close

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def close(self) -> None:
        """Close a refused connection now."""
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        listener = self._listener
        if self._admission is not None:
            self._admission.release()
            self._admission = None
            if listener.open is not None:
                listener.open.dec()
        listener.refused.discard(self)
        if self.tracked is not None and listener.connections is not None:
            listener.connections.close(self.tracked)
        if self._timer is not None:
            self._timer.cancel()
        if self._inner is not None:
            self._inner.connection_lost(exc)


class HttpListener:
    """``runner``'s app on ``host:port`` (0: any; TLS with ``ssl_context``, whose handshake
    must end within ``handshake_timeout`` seconds, asyncio's 60 if None), named ``name``
    (its ``listener`` label), that takes the connections ``limits`` admits and answers the
    others 503 at once. ``runner`` must be set up before :meth:`start`;
    :meth:`close` it before the runner's ``cleanup()`` (which closes the connections)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: ConnectionLimits,
        *,
        name: str,
        metrics: ListenerMetrics | None = None,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
        handshake_timeout: float | None = None,
        connections: ConnectionTable | None = None,
        protocol: str = "http",
    ) -> None:
        self.runner = runner
        self.connections = connections
        self.protocol = protocol
        self.handshake_timeout = handshake_timeout
        self.host = host
        self.port = port  # the bound one once started
        self.limits = limits
        self.name = name
        self.ssl_context = ssl_context
        self.backlog = backlog
        self.open: Gauge | None = None  # (its children: the metrics of this listener)
        self.refused_total: Counter | None = None
        if metrics is not None:
            self.open = metrics.connections.labels(name)
            self.refused_total = metrics.refused.labels(name)
        self.refused: set[_Gate] = set()  # refused connections, lingering
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Gate(self),
            self.host,
            self.port,
            ssl=self.ssl_context,
            backlog=self.backlog,
            reuse_address=True,
            # (a TLS handshake is part of the handshake, and uncounted till it ends)
            ssl_handshake_timeout=self.handshake_timeout if self.ssl_context else None,
        )
        sock: socket.socket = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        return self.port

    def close(self) -> None:
        """Accept no more connections (those open stay, for the runner to close); the
        refused ones lingering close now."""
        if self._server is not None:
            self._server.close()
        for refused in list(self.refused):
            refused.close()

    async def wait_closed(self, timeout: float = 2.0) -> None:
        """Wait (``timeout`` seconds at most) for the listening socket, and on Python 3.12+
        the connections, to be gone."""
        if self._server is not None:
            server, self._server = self._server, None
            try:
                await asyncio.wait_for(server.wait_closed(), timeout)
            except TimeoutError:
                log.debug("%s: connections still open after %.1fs", self.name, timeout)


def _user(authorization: str | None) -> str:
    """Who the requests of a connection say they are: a Basic login's user, a bearer token
    (``(token)``: its user is the provider's to know), else ``anonymous``."""
    try:
        parsed = parse_authorization(authorization)
    except Unauthorized:
        return "anonymous"
    if parsed is None:
        return "anonymous"
    return parsed[1] if parsed[0] == "basic" else "(token)"


@web.middleware
async def connection_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Counts a request in (and its answer out) on the connection's entry of its listener's
    table, and, unless it was refused 401, names the entry's user after it."""
    transport = request.transport
    gate = transport.get_protocol() if transport is not None else None
    tracked = gate.tracked if isinstance(gate, _Gate) else None
    if tracked is None:
        return await handler(request)
    tracked.messages_in += 1
    response = await handler(request)
    tracked.messages_out += 1
    if response.status != 401:
        tracked.user = _user(request.headers.get("Authorization"))
    return response
