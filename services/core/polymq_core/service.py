"""The core as a running service: the broker, its wire listener and its admin HTTP.

With ``core_tls_cert``/``core_tls_key`` both the wire and the admin port speak TLS only.
``start()`` binds the listeners, then opens the stores (recovering what they hold) and
returns the ports (with ``in_process``, clients in this process reach the core over a
:mod:`polymq.inproc` pipe instead of its TCP port); ``stop()`` shuts down in order: stop
accepting, say goodbye to every session, let in-flight writes finish, flush and close the
stores.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq import inproc
from polymq_server.auth.provider import AuthProvider, WithServiceToken, load_provider
from polymq_server.config import server_ssl_context
from polymq_server.resources import ConnectionLimits
from polymq_server.web.app import deadline_runner
from polymq_server.web.listener import HttpListener

from .admin.app import admin_app
from .broker import Broker
from .config import CoreSettings
from .metrics import Sensors
from .reload import Reloader, limits_setter, publisher
from .session import Session

if TYPE_CHECKING:
    from .cluster.node import ClusterNode

log = logging.getLogger(__name__)


class CoreService:
    def __init__(
        self,
        settings: CoreSettings,
        registry: CollectorRegistry | None = None,
        auth: AuthProvider | None = None,
        *,
        in_process: bool = False,
    ) -> None:
        self.settings = settings
        self.in_process = in_process  # clients in this process connect without a socket
        self.registry = registry if registry is not None else CollectorRegistry()
        self.auth = auth if auth is not None else load_provider(settings.auth)
        self.sensors = Sensors(self.registry)
        self.reloader = Reloader(self.auth)  # log level, users, limits: without a restart
        # TLS on the wire and admin ports (None: plain), loaded now: a bad file stops the start
        self.tls: ssl.SSLContext | None = None
        if settings.core_tls:
            self.tls = server_ssl_context(
                settings.core_tls_cert,
                settings.core_tls_key,
                cert_var="POLYMQ_CORE_TLS_CERT",
                key_var="POLYMQ_CORE_TLS_KEY",
            )
        self.cluster: ClusterNode | None = None
        self.peer_auth: AuthProvider | None = None
        if settings.clustered:  # nats-py is needed only here (the `cluster` extra)
            from .cluster.node import ClusterNode

            self.cluster = ClusterNode(
                settings,
                purge_every=settings.log_purge_every,
                keep_entries=settings.log_keep_entries,
                keep_bytes=settings.log_keep_bytes,
                max_entries=settings.log_max_entries or None,
            )
            self.cluster.reloader = self.reloader
            # peer links log in with the cluster secret: with cluster TLS on the peers'
            # listener alone (a certificate the CA signed and the secret), else on the wire
            self.peer_auth = WithServiceToken(self.auth, self.cluster.secret)
            if self.cluster.serve_ssl is None:
                self.auth = self.peer_auth
        self.broker = Broker(
            settings,
            self.sensors,
            self.auth,
            stores=self.cluster.store if self.cluster is not None else None,
            cluster=self.cluster,
        )
        self.reloader.limits = limits_setter(self.broker)
        self.reloader.applied = publisher(self.broker)  # to the frontends on system.config
        self.reloader.users_hooks.append(self.broker.clients.recheck)  # open sessions too
        self.sensors.watch_depth(self.broker.depth, self.broker.in_flight)
        self.sensors.watch_bindings(lambda: len(self.broker.context.bindings))
        self.sensors.watch_resources(lambda: self.broker.monitor.detail)
        if settings.metrics_per_destination:
            self.sensors.watch_destinations(
                self.broker.destinations,
                lambda: sum(len(shard.holders) for shard in self.broker.shards),
                settings.metrics_max_destinations,
            )
        self._server: asyncio.Server | None = None
        self._peer_server: asyncio.Server | None = None  # cluster TLS: the wire for peers
        self._admin: web.AppRunner | None = None
        self._admin_listeners: list[HttpListener] = []
        self.ports: dict[str, int] = {}

    async def start(self) -> dict[str, int]:
        """Bind the wire and admin listeners, then recover the stores: a client that comes
        meanwhile finds the port open (its login waits a moment, then is answered
        ``unavailable``: the core is starting), and ``/readyz`` says ``starting`` (503)
        until recovery ends. Returns the ports once the core is ready."""
        s = self.settings
        if self.cluster is not None:
            await self.cluster.connect()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Session(self.broker),
            s.host,
            s.core_port,
            reuse_address=True,
            backlog=1024,
            ssl=self.tls,
            ssl_handshake_timeout=s.handshake_timeout if self.tls is not None else None,
        )
        self.ports["core"] = _port(self._server.sockets[0])
        if self.in_process:
            inproc.serve(s.host, self.ports["core"], lambda: Session(self.broker))
        # the admin HTTP has the frontends' deadlines and connection limit (not the wire's
        # per-user one: nobody has logged in when a connection is accepted)
        self._admin = deadline_runner(
            admin_app(self.broker, self.registry, self.cluster, self.reloader),
            s.handshake_timeout,
        )
        await self._admin.setup()
        self.ports["admin"] = await self._admin_listener("admin", s.admin_port, self.tls)
        started = loop.time()
        await self.broker.start()
        log.info(
            "core %s: wire protocol%s on %s:%d, admin on %s://%s:%d/ (%d shards in %s, "
            "recovered in %.1fs; %s)",
            s.node_name,
            " over TLS" if self.tls is not None else "",
            s.host,
            self.ports["core"],
            "https" if self.tls is not None else "http",
            s.host,
            self.ports["admin"],
            s.shards,
            s.data_dir,
            loop.time() - started,
            self.auth.describe(),
        )
        if self.cluster is not None and self.cluster.serve_ssl is not None:
            await self._serve_peers(self.cluster.serve_ssl)
        if self.cluster is not None:
            await self.cluster.start(self.broker, self.ports)
        return self.ports

    async def _serve_peers(self, ctx: ssl.SSLContext) -> None:
        """Cluster TLS: the wire protocol and the admin HTTP once more, over TLS with a
        certificate both ways, on the ports peers reach (announced on system.peers as
        ``peer_wire`` and ``peer_admin``); the others stay for frontends and probes."""
        s = self.settings
        loop = asyncio.get_running_loop()
        self._peer_server = await loop.create_server(
            lambda: Session(self.broker, self.peer_auth),
            s.host,
            s.peer_wire_port,
            ssl=ctx,
            reuse_address=True,
        )
        self.ports["peer_wire"] = _port(self._peer_server.sockets[0])
        self.ports["peer_admin"] = await self._admin_listener("peer_admin", s.peer_admin_port, ctx)
        log.info(
            "core %s: peers over TLS: wire protocol on %s:%d, admin on https://%s:%d/",
            s.node_name,
            s.host,
            self.ports["peer_wire"],
            s.host,
            self.ports["peer_admin"],
        )

    async def _admin_listener(self, name: str, port: int, ctx: ssl.SSLContext | None = None) -> int:
        """Serve the admin app on ``port`` (TLS with ``ctx``) as listener ``name``, with
        ``max_connections`` of its own; the port bound."""
        s = self.settings
        assert self._admin is not None
        listener = HttpListener(
            self._admin,
            s.host,
            port,
            ConnectionLimits(f"the core's {name} port", s.max_connections),
            name=name,
            metrics=self.sensors.admin_listeners,
            ssl_context=ctx,
            handshake_timeout=s.handshake_timeout,
        )
        self._admin_listeners.append(listener)
        return await listener.start()

    @property
    def pids(self) -> list[int]:
        """The processes of this node: polymq, and its nats-server in a cluster."""
        return self.cluster.pids if self.cluster is not None else [os.getpid()]

    async def lame_duck(self) -> None:
        """The first step of a stop: accept no new wire connections (the admin port stays
        open for probes); :meth:`stop` then answers and closes those open."""
        for server in self._listeners():
            server.close()

    def _listeners(self) -> list[asyncio.Server]:
        return [srv for srv in (self._server, self._peer_server) if srv is not None]

    async def stop(self) -> None:
        if self.cluster is not None:
            await self.cluster.leave()
        if self.in_process and "core" in self.ports:
            inproc.unserve(self.settings.host, self.ports["core"])
        for server in self._listeners():
            server.close()
        await self.broker.stop(
            hand_over=self.cluster.hand_over if self.cluster is not None else None
        )
        for server in self._listeners():
            try:
                await asyncio.wait_for(server.wait_closed(), 2)
            except TimeoutError:
                pass
        for listener in self._admin_listeners:
            listener.close()
        if self._admin is not None:
            await self._admin.cleanup()
        for listener in self._admin_listeners:
            await listener.wait_closed()
        self._admin_listeners.clear()
        if self.cluster is not None:
            await self.cluster.close()


def _port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])
