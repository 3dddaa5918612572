"""The RabbitMQ bridge as a running service: links between polymq and an existing RabbitMQ.

Each link of the links file (:mod:`.config`) moves messages one way, at least once:
polymq ``queue/x`` or ``stream/x`` -> a RabbitMQ exchange (:mod:`.outbound`), or a
RabbitMQ queue -> a polymq destination (:mod:`.inbound`). The bridge holds one
connection to RabbitMQ (aio-pika, one channel per link) and one to the core, each made again
with jittered exponential backoff when it drops (:mod:`.side`); links restart their
sessions when both are back (:mod:`.link`). Properties cross as
:mod:`.props` says.

``start()`` connects (waiting for the first attempt on each side only: a side that is away
makes ``/readyz`` answer 503 until it is back), starts every link, binds an aiohttp app on
``bridge_port`` with ``/metrics``, ``/healthz``, ``/readyz`` and ``/links`` (each link's state
as JSON), and returns ``{"bridge": port}``. ``stop()``: stop the HTTP listener, stop every
link (no more consuming; in-flight messages get ``bridge_stop_grace`` seconds to be confirmed,
the rest go back to their source), then close both connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq_server.sessions.frontend import add_admin_routes, admin_runner, start_site

from .config import BridgeConfig, BridgeSettings, OutboundLink
from .inbound import InboundRunner
from .link import LinkRunner
from .metrics import BridgeMetrics
from .outbound import OutboundRunner
from .side import Backoff, CoreSide, RabbitSide

__all__ = ["BridgeService", "build_app"]

log = logging.getLogger(__name__)

BRIDGE: web.AppKey[BridgeService] = web.AppKey("bridge")


async def readyz(request: web.Request) -> web.Response:
    bridge = request.app[BRIDGE]
    status = bridge.status()
    code = 200 if status["status"] == "ready" else 503
    return web.json_response(status, status=code)


async def links(request: web.Request) -> web.Response:
    return web.json_response(request.app[BRIDGE].status())


def build_app(bridge: BridgeService, registry: CollectorRegistry) -> web.Application:
    app = web.Application()
    app[BRIDGE] = bridge
    add_admin_routes(app, registry, readyz)
    app.router.add_get("/links", links)
    return app


class BridgeService:
    def __init__(
        self,
        settings: BridgeSettings,
        registry: CollectorRegistry | None = None,
        config: BridgeConfig | None = None,
    ) -> None:
        settings.check()
        self.settings = settings
        self.config = config if config is not None else settings.links()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = BridgeMetrics(self.registry)
        s = settings
        self.rabbit = RabbitSide(
            s.bridge_rabbitmq_url,
            s.rabbitmq_address,
            Backoff(s.bridge_backoff_min, s.bridge_backoff_max),
            self.metrics,
            heartbeat=s.bridge_heartbeat,
        )
        self.core = CoreSide(
            s.core_host,
            s.core_port,
            Backoff(s.bridge_backoff_min, s.bridge_backoff_max),
            self.metrics,
            user=s.core_user,
            password=s.core_password,
            token=s.core_token,
        )
        self.links: list[LinkRunner] = []
        for link in self.config.links:
            cls = OutboundRunner if isinstance(link, OutboundLink) else InboundRunner
            self.links.append(cls(link, self.core, self.rabbit, self.metrics.link(link), s))
        self.app = build_app(self, self.registry)
        self.stopping = False
        self._runner: web.AppRunner | None = None
        self.ports: dict[str, int] = {}

    def status(self) -> dict[str, object]:
        """What ``/readyz`` and ``/links`` answer."""
        problems = []
        if self.stopping:
            problems.append("shutting down")
        for side in (self.rabbit, self.core):
            if not side.connected:
                problems.append(
                    f"not connected to {side.side} at {side.address}: {side.last_error}"
                )
        stalled = [link.name for link in self.links if not link.running]
        if stalled and not problems:
            problems.append(f"link(s) not running: {', '.join(stalled)}")
        return {
            "status": "ready" if not problems else "unavailable",
            "problems": problems,
            "rabbitmq": {"address": self.rabbit.address, "connected": self.rabbit.connected},
            "core": {"address": self.core.address, "connected": self.core.connected},
            "links": [link.status() for link in self.links],
        }

    async def start(self) -> dict[str, int]:
        s = self.settings
        await asyncio.gather(self.rabbit.start(), self.core.start())
        for link in self.links:
            link.start()
        self._runner = admin_runner(self.app)
        _, self.ports["bridge"] = await start_site(self._runner, s.host, s.bridge_port)
        log.info(
            "bridge: %d link(s) between RabbitMQ at %s (%s) and the core at %s (%s); "
            "metrics on http://%s:%d/metrics",
            len(self.links),
            self.rabbit.address,
            "connected" if self.rabbit.connected else "not reachable yet, retrying",
            self.core.address,
            "connected" if self.core.connected else "not reachable yet, retrying",
            s.host,
            self.ports["bridge"],
        )
        return self.ports

    async def stop(self) -> None:
        self.stopping = True
        if self.links:
            await asyncio.gather(*(link.stop() for link in self.links), return_exceptions=True)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            with contextlib.suppress(RuntimeError):
                await runner.cleanup()
        await asyncio.gather(self.rabbit.stop(), self.core.stop(), return_exceptions=True)
