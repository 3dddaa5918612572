"""The AMQP frontend as a running service: its listeners and its link to the core.

- AMQP 0-9-1 over TCP (``amqp_port``, 5672; not with ``amqp_plain`` false), and over TLS
  (``amqp_tls_port``, 5671) when ``tls_cert`` / ``tls_key`` are set;
- a small aiohttp app (``amqp_admin_port``, 15692) with ``/metrics``, ``/healthz`` (the
  process answers: the liveness probe) and ``/readyz`` (connected to the core and not
  stopping: the readiness probe; 503 otherwise, with the reason); with
  ``amqp_alarm_switch`` (``POLYMQ_AMQP_ALARM_SWITCH=1``, a test switch, off by default)
  also ``/alarm/forced``: PUT sets a forced resource alarm (publishers are blocked, see
  ``hub.py``), DELETE clears it, GET lists the alarms set.

``start()`` connects to the core (waiting for the first attempt only: a core that is away
makes ``/readyz`` answer 503 and connection.open a 320 until it is back), binds the listeners
and returns ``{"amqp": port, "amqp_admin": port}`` (``"amqp_tls"`` with TLS, no ``"amqp"``
without plain AMQP). ``stop()``: stop
accepting, let every connection finish what it read, close each with 320 CONNECTION_FORCED
("shutdown"), release their consumers and exclusive queues, then close the core link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl

from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq import Client
from polymq_server.auth.provider import AuthProvider, load_provider
from polymq_server.reload import Reloader
from polymq_server.resources import ConnectionLimits
from polymq_server.sessions import frontend
from polymq_server.sessions.transport import TcpTransport
from polymq_server.web.app import link_state

from .config import AmqpSettings
from .hub import AmqpHub
from .metrics import AmqpMetrics
from .session import AmqpSession
from .topology import Topology

__all__ = ["AmqpService", "build_app"]

log = logging.getLogger(__name__)

HUB = web.AppKey("hub", AmqpHub)
_SHUTDOWN_GRACE = 5.0  # seconds connections get to answer what they read before the close


async def readyz(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    refusal = frontend.not_ready(hub.stopping, hub.link)
    if refusal is not None:
        return refusal
    return web.json_response(
        {"status": "ready", "core": hub.link.address, "connections": len(hub.sessions)}
    )


async def forced_alarm(request: web.Request) -> web.Response:
    """The test switch: PUT sets the ``forced`` alarm, DELETE clears it; the alarms set."""
    hub = request.app[HUB]
    if request.method != "GET":
        hub.link.force_alarm("forced", request.method == "PUT")
        log.warning("amqp: forced alarm %s", "set" if hub.alarms else "cleared")
    return web.json_response({"alarms": sorted(hub.alarms)})


def build_app(hub: AmqpHub, registry: CollectorRegistry) -> web.Application:
    app = web.Application()
    app[HUB] = hub
    frontend.add_admin_routes(app, registry, readyz)
    if hub.settings.amqp_alarm_switch:
        for method in ("GET", "PUT", "DELETE"):
            app.router.add_route(method, "/alarm/forced", forced_alarm)
    return app


class AmqpService:
    def __init__(
        self,
        settings: AmqpSettings,
        registry: CollectorRegistry | None = None,
        auth: AuthProvider | None = None,
        listening: frontend.Listening = frontend.ALONE,
    ) -> None:
        settings.check()
        self.settings = settings
        self.listening = listening
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = AmqpMetrics(self.registry)
        self.link = frontend.core_link(settings, "amqp", self.metrics, on_lost=self._core_lost)
        provider = auth if auth is not None else load_provider(settings.auth)
        # (reloaded on the core's system.config)
        self.link.follow_config(Reloader(provider, users_required=False, name="amqp"))
        instance = f"{socket.gethostname().replace('/', '_')}-{secrets.token_hex(6)}"
        self.topology = Topology(self.link, instance, cache_ttl=settings.amqp_cache_ttl)
        self.hub = AmqpHub(
            settings,
            self.link,
            provider,
            self.metrics,
            self.topology,
            instance,
        )
        self.topology.local_owner = self.hub.owner_alive
        self.hub.connections = ConnectionLimits(
            "the AMQP frontend", settings.max_connections, settings.max_connections_per_user
        )
        self.link.alarm_hooks.append(self._alarms)  # the core's resource alarms block publishers
        self.app = build_app(self.hub, self.registry)
        self._servers: list[asyncio.Server] = []
        self._runner: web.AppRunner | None = None
        self.ports: dict[str, int] = {}

    def _alarms(self, now: frozenset[str]) -> None:
        for session in list(self.hub.sessions.values()):
            session.alarm_changed()

    def _core_lost(self, client: Client, reason: str) -> None:
        for session in list(self.hub.sessions.values()):
            session.core_lost(reason)

    async def _listen(self, port: int, ctx: ssl.SSLContext | None) -> int:
        hub = self.hub
        loop = asyncio.get_running_loop()

        def tcp() -> TcpTransport:
            return TcpTransport(lambda transport: AmqpSession(hub, transport))

        server = await loop.create_server(
            tcp,
            self.settings.host,
            port,
            ssl=ctx,
            reuse_address=True,
            reuse_port=self.listening.reuse_port or None,
            backlog=1024,
        )
        self._servers.append(server)
        sock: socket.socket = server.sockets[0]
        return int(sock.getsockname()[1])

    async def start(self) -> dict[str, int]:
        s = self.settings
        ctx = frontend.tls_context(s)
        await self.link.start()
        self.topology.start()
        listening = []
        if s.amqp_plain:
            self.ports["amqp"] = await self._listen(s.amqp_port, None)
            listening.append(f"on {self.ports['amqp']}")
        if ctx is not None:
            self.ports["amqp_tls"] = await self._listen(s.amqp_tls_port, ctx)
            listening.append(f"over TLS on {self.ports['amqp_tls']}")
        admin = "no admin port (another process of this node serves it)"
        if self.listening.http:
            self._runner = frontend.admin_runner(self.app)
            _, self.ports["amqp_admin"] = await frontend.start_site(
                self._runner, s.host, s.amqp_admin_port
            )
            admin = f"admin on http://{s.host}:{self.ports['amqp_admin']}"
        log.info(
            "amqp: AMQP 0-9-1 on %s %s, %s, core %s %s; vhosts %s; %s",
            s.host,
            " and ".join(listening),
            admin,
            self.link.address,
            link_state(self.link),
            s.amqp_vhosts,
            self.hub.auth.describe(),
        )
        return self.ports

    async def lame_duck(self) -> None:
        """The first step of a stop: accept no new connections; :meth:`stop` then closes
        each with 320 CONNECTION_FORCED."""
        self.hub.stopping = True
        for server in self._servers:
            server.close()

    async def stop(self) -> None:
        await self.lame_duck()
        await frontend.shutdown_sessions(
            list(self.hub.sessions.values()),
            _SHUTDOWN_GRACE,
            log,
            "amqp: %d connections did not shut down in time",
        )
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        for server in self._servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)
        self._servers.clear()
        await self.topology.stop()
        await self.link.stop()
        self.metrics.core_connected.set(0)
