"""The long-polling frontend as a running service: an aiohttp app, its listener and its
core link.

``start()`` builds the app, connects to the core (waiting for the first attempt only: a core
that is away makes ``/readyz`` answer 503 until it is back), binds the listener and returns
``{"longpoll": port}``. ``stop()`` shuts down in aiohttp's documented order: stop accepting,
wake long polls and SSE streams (polls answer with what they have, streams end and their
clients reconnect elsewhere with their cursor), let in-flight requests finish, then close
the connection to the core (the ``cleanup_ctx`` of the app).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from polymq.auth import load_provider
from polymq_http.access import Access

from . import api, page, sse
from .config import LongpollSettings
from .corelink import CoreLink
from .cors import Cors
from .leases import Windows
from .metrics import LongpollMetrics
from .problems import Handler, problem_middleware

__all__ = ["LongpollService", "build_app"]

log = logging.getLogger(__name__)

REGISTRY = web.AppKey("registry", CollectorRegistry)
_SHUTDOWN_TIMEOUT = 10.0


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    status = 500
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
        request.app[api.METRICS].observe(request.method, route, status)


async def _core_ctx(app: web.Application) -> AsyncIterator[None]:
    core = app[api.CORE]
    await core.start()
    yield
    await core.stop()


async def _on_shutdown(app: web.Application) -> None:
    app[api.CORE].stopping.set()  # long polls answer now, SSE streams end
    app[api.WINDOWS].stop()


def build_app(settings: LongpollSettings, registry: CollectorRegistry) -> web.Application:
    metrics = LongpollMetrics(registry)
    cors = Cors(settings.cors_origins())
    app = web.Application(
        middlewares=[metrics_middleware, cors.preflight, problem_middleware],
        client_max_size=settings.longpoll_max_body,
    )
    app.on_response_prepare.append(cors.on_prepare)
    app[api.SETTINGS] = settings
    app[api.METRICS] = metrics
    app[api.CORE] = CoreLink(settings, metrics)
    app[api.ACCESS] = Access(load_provider(settings.auth))
    app[api.WINDOWS] = Windows()
    app[REGISTRY] = registry
    api.add_routes(app)
    sse.add_routes(app)
    page.add_routes(app)
    app.router.add_get("/metrics", metrics_endpoint)
    app.cleanup_ctx.append(_core_ctx)
    app.on_shutdown.append(_on_shutdown)
    return app


class LongpollService:
    def __init__(
        self, settings: LongpollSettings, registry: CollectorRegistry | None = None
    ) -> None:
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
        site = web.TCPSite(self._runner, s.host, s.longpoll_port, reuse_address=True, backlog=4096)
        await site.start()
        self.ports["longpoll"] = int(self._runner.addresses[0][1])
        core = self.app[api.CORE]
        origins = s.cors_origins()
        log.info(
            "longpoll: long polling and SSE on http://%s:%d/ (a demo page at /), core %s %s; "
            "CORS %s; %s",
            s.host,
            self.ports["longpoll"],
            core.address,
            "connected" if core.connected else "not reachable yet (retrying)",
            "from any origin" if origins is None else ", ".join(sorted(origins)) or "off",
            self.app[api.ACCESS].provider.describe(),
        )
        return self.ports

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
