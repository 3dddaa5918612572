"""The Avro frontend as a running service: an aiohttp app, its listener and its core link.

``start()`` builds the app, connects to the core (waiting for the first attempt only: a core
that is away makes ``/readyz`` answer 503 until it is back), binds the listener and returns
``{"avro": port}``. ``stop()`` shuts down in aiohttp's documented order: stop accepting, wake
waiting reads (they answer with what they have), let in-flight requests finish (a publish
being made durable included), then close the connection to the core (the ``cleanup_ctx``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from polymq.auth import load_provider
from polymq_http.access import Access
from polymq_http.problems import Handler, problem_middleware

from . import api, registry_api
from .config import AvroSettings
from .corelink import CoreLink
from .metrics import AvroMetrics
from .openapi import document
from .problems import incompatible_middleware
from .registry import Registry

__all__ = ["AvroService", "build_app"]

log = logging.getLogger(__name__)

PROMETHEUS = web.AppKey("prometheus", CollectorRegistry)
_SHUTDOWN_TIMEOUT = 10.0


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = generate_latest(request.app[PROMETHEUS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """As ``polymq_http.service.metrics_middleware``, into this frontend's metrics."""
    metrics = request.app[api.METRICS]
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    start = time.perf_counter()
    status = 500
    metrics.in_flight.inc()
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 499  # the client went away
        raise
    finally:
        metrics.in_flight.dec()
        metrics.observe(request.method, route, status, time.perf_counter() - start)


async def _core_ctx(app: web.Application) -> AsyncIterator[None]:
    core = app[api.CORE]
    await core.start()
    yield
    await core.stop()


async def _on_shutdown(app: web.Application) -> None:
    app[api.CORE].stopping.set()  # waiting reads answer now instead of at their deadline


def build_app(settings: AvroSettings, registry: CollectorRegistry) -> web.Application:
    metrics = AvroMetrics(registry)
    app = web.Application(
        middlewares=[metrics_middleware, problem_middleware, incompatible_middleware],
        client_max_size=settings.avro_max_body,
    )
    core = CoreLink(settings, metrics)
    cache = core.schemas
    app[api.SETTINGS] = settings
    app[api.METRICS] = metrics
    app[api.CORE] = core
    app[api.CACHE] = cache
    app[api.REGISTRY] = Registry(core.call, cache, settings.compatibility)
    app[api.ACCESS] = Access(load_provider(settings.auth))
    app[api.OPENAPI] = json.dumps(document(settings), indent=1).encode()
    app[PROMETHEUS] = registry
    api.add_routes(app)
    registry_api.add_routes(app)
    app.router.add_get("/metrics", metrics_endpoint)
    app.cleanup_ctx.append(_core_ctx)
    app.on_shutdown.append(_on_shutdown)
    return app


class AvroService:
    def __init__(self, settings: AvroSettings, registry: CollectorRegistry | None = None) -> None:
        settings.check()
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.app = build_app(settings, self.registry)
        self._runner: web.AppRunner | None = None
        self.ports: dict[str, int] = {}

    async def start(self) -> dict[str, int]:
        s = self.settings
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_TIMEOUT,
        )
        await self._runner.setup()  # runs the cleanup_ctx: connects to the core
        site = web.TCPSite(self._runner, s.host, s.avro_port, reuse_address=True)
        await site.start()
        self.ports["avro"] = int(self._runner.addresses[0][1])
        core = self.app[api.CORE]
        log.info(
            "avro: Avro over HTTP and a schema registry on http://%s:%d/ (OpenAPI at "
            "/openapi.json), core %s %s; compatibility %s by default; %s",
            s.host,
            self.ports["avro"],
            core.address,
            "connected" if core.connected else "not reachable yet (retrying)",
            s.compatibility.value,
            self.app[api.ACCESS].provider.describe(),
        )
        return self.ports

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
