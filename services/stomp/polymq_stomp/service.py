"""The STOMP frontend as a running service: its two listeners and its link to the core.

- STOMP over TCP (``stomp_port``, 61613): an asyncio server of :class:`TcpTransport`;
- an aiohttp app (``stomp_ws_port``, 15674): STOMP over WebSocket at ``/ws`` (subprotocols
  ``v12.stomp``, ``v11.stomp``, ``v10.stomp``), the page at ``/`` and its
  ``/static/stomp.umd.min.js``, ``/metrics``, ``/healthz`` and ``/readyz``;
- both over TLS when ``tls_cert`` / ``tls_key`` are set.

``start()`` connects to the core (waiting for the first attempt only: a core that is away
makes ``/readyz`` answer 503 and CONNECT an ERROR until it is back), binds the listeners and
returns ``{"stomp": port, "stomp_ws": port}``. ``stop()``: stop accepting, let every session
finish what it read (SENDs answered, receipts sent), send each an ERROR "shutting down" and
close it, release their core subscriptions and temp queues, then close the core link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq_server.auth.provider import AuthProvider, load_provider
from polymq_server.reload import Reloader
from polymq_server.resources import ConnectionLimits
from polymq_server.sessions import frontend
from polymq_server.web.app import link_state

from . import codec, page
from .config import StompSettings
from .hub import StompHub
from .metrics import StompMetrics
from .session import StompSession
from .transports import TcpTransport, WsTransport, serve_websocket

__all__ = ["StompService", "build_app"]

log = logging.getLogger(__name__)

HUB = web.AppKey("hub", StompHub)
_WS_MESSAGE_FLOOR = 16 * 1024 * 1024  # bytes of one WebSocket message, at least
_SHUTDOWN_GRACE = 5.0  # seconds sessions get to answer what they read before the ERROR


async def readyz(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    refusal = frontend.not_ready(hub.stopping, hub.link)
    if refusal is not None:
        return refusal
    return web.json_response({"status": "ready", "core": hub.link.address})


async def websocket(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    if hub.stopping:
        return web.Response(status=503, text="shutting down\n")
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return web.Response(
            status=400, text="STOMP over WebSocket: open a WebSocket here (ws://host:port/ws)\n"
        )

    def endpoint(transport: WsTransport) -> StompSession:
        return StompSession(hub, transport)

    # A frame too large in a message up to this size gets a STOMP ERROR like any other;
    # past it aiohttp refuses the message itself (close code 1009) before buffering it.
    max_msg = max(2 * hub.settings.stomp_max_frame, _WS_MESSAGE_FLOOR)
    return await serve_websocket(request, endpoint, max_msg_size=max_msg)


def build_app(hub: StompHub, registry: CollectorRegistry) -> web.Application:
    app = web.Application()
    app[HUB] = hub
    page.add_routes(app, hub.settings.stomp_stompjs)
    app.router.add_get("/ws", websocket)
    frontend.add_admin_routes(app, registry, readyz)
    return app


class StompService:
    def __init__(
        self,
        settings: StompSettings,
        registry: CollectorRegistry | None = None,
        auth: AuthProvider | None = None,
        listening: frontend.Listening = frontend.ALONE,
    ) -> None:
        settings.check()
        self.settings = settings
        self.listening = listening
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = StompMetrics(self.registry)
        self.link = frontend.core_link(settings, "stomp", self.metrics)
        provider = auth if auth is not None else load_provider(settings.auth)
        # (reloaded on the core's system.config)
        self.link.follow_config(Reloader(provider, users_required=False, name="stomp"))
        self.hub = StompHub(
            settings,
            self.link,
            provider,
            self.metrics,
        )
        self.hub.connections = ConnectionLimits(
            "the STOMP frontend", settings.max_connections, settings.max_connections_per_user
        )
        self.link.alarm_hooks.append(self._alarms)  # the core's resource alarms hold SENDs
        self.app = build_app(self.hub, self.registry)
        self._server: asyncio.Server | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.ports: dict[str, int] = {}

    def _alarms(self, now: frozenset[str]) -> None:
        for session in list(self.hub.sessions):
            session.update_reading()

    async def start(self) -> dict[str, int]:
        s = self.settings
        ctx = frontend.tls_context(s)
        await self.link.start()
        loop = asyncio.get_running_loop()
        hub = self.hub

        def tcp() -> TcpTransport:
            return TcpTransport(lambda transport: StompSession(hub, transport))

        self._server = await loop.create_server(
            tcp,
            s.host,
            s.stomp_port,
            ssl=ctx,
            reuse_address=True,
            reuse_port=self.listening.reuse_port or None,
            backlog=1024,
        )
        sock: socket.socket = self._server.sockets[0]
        self.ports["stomp"] = int(sock.getsockname()[1])
        websocket = "no WebSocket (another process of this node serves it)"
        if self.listening.http:
            self._runner = frontend.admin_runner(self.app, s.handshake_timeout)
            self._site, self.ports["stomp_ws"] = await frontend.start_site(
                self._runner, s.host, s.stomp_ws_port, ctx
            )
            scheme = "wss" if ctx else "ws"
            websocket = f"{scheme}://{s.host}:{self.ports['stomp_ws']}/ws (page at /)"
        log.info(
            "stomp: STOMP 1.0-1.2 on %s:%d%s and %s, core %s %s; %s; %s codec",
            s.host,
            self.ports["stomp"],
            " (TLS)" if ctx else "",
            websocket,
            self.link.address,
            link_state(self.link),
            self.hub.auth.describe(),
            "compiled (mypyc)" if codec.COMPILED else "pure-Python",
        )
        return self.ports

    async def lame_duck(self) -> None:
        """The first step of a stop: accept no new connections (CONNECT and WebSocket
        upgrades on open ones are refused); :meth:`stop` then tells each session to go."""
        self.hub.stopping = True
        if self._server is not None:
            self._server.close()
        if self._site is not None:
            with contextlib.suppress(RuntimeError):  # (stopped already)
                await self._site.stop()

    async def stop(self) -> None:
        await self.lame_duck()
        await frontend.shutdown_sessions(
            list(self.hub.sessions),
            _SHUTDOWN_GRACE,
            log,
            "stomp: %d sessions did not shut down in time",
        )
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        await self.link.stop()
        self.metrics.core_connected.set(0)
