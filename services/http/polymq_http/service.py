"""The HTTP frontend as a running service: an aiohttp app, its listener and its core link.

``start()`` builds the app, connects to the core (waiting for the first attempt only: a core
that is away makes ``/readyz`` answer 503 until it is back), binds the listener (HTTPS when
``tls_cert``/``tls_key`` are set, plain HTTP otherwise) and returns
``{"http": port}``. ``stop()`` shuts down in aiohttp's documented order: stop accepting, wake
long polls (they answer with what they have), let in-flight requests finish, then close the
connection to the core (the ``cleanup_ctx`` of the app). The runner is every frontend's
(:class:`polymq_server.web.app.WebService`).
"""

from __future__ import annotations

import json
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq_server.web.access import reloaded_access
from polymq_server.web.app import WebService, add_core_link, link_state
from polymq_server.web.guards import cross_site_guard, login_first
from polymq_server.web.requestmetrics import add_metrics_route, metrics_middleware

from . import api
from .config import HttpSettings
from .corelink import HttpLink
from .metrics import HttpMetrics
from .openapi import document
from .problems import problem_middleware

__all__ = ["HttpService", "build_app"]

log = logging.getLogger(__name__)


def build_app(settings: HttpSettings, registry: CollectorRegistry) -> web.Application:
    metrics = HttpMetrics(registry)
    app = web.Application(
        middlewares=[
            metrics_middleware(api.METRICS),
            problem_middleware,
            cross_site_guard,  # (no CORS here: a browser's cross-site write is refused)
            login_first(api.ACCESS),  # before anything reads a body
        ],
        client_max_size=settings.max_body,
    )
    app[api.SETTINGS] = settings
    app[api.METRICS] = metrics
    app[api.CORE] = HttpLink(settings, metrics)
    app[api.ACCESS] = reloaded_access(settings.auth, app[api.CORE], "http")
    app[api.OPENAPI] = json.dumps(document(settings), indent=1).encode()
    api.add_routes(app)
    add_metrics_route(app, registry)
    add_core_link(app, api.CORE)  # at shutdown, long polls answer at once
    return app


class HttpService(WebService[HttpSettings]):
    name = "http"

    def __init__(self, settings: HttpSettings, registry: CollectorRegistry | None = None) -> None:
        super().__init__(settings, registry, build_app, port=settings.http_port)

    def started(self) -> None:
        core = self.app[api.CORE]
        log.info(
            "http: JSON over HTTP on %s (OpenAPI at /openapi.json), core %s %s; %s",
            self.url,
            core.address,
            link_state(core),
            self.app[api.ACCESS].provider.describe(),
        )
