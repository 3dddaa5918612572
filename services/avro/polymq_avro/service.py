"""The Avro frontend as a running service: an aiohttp app, its listener and its core link.

``start()`` builds the app, connects to the core (waiting for the first attempt only: a core
that is away makes ``/readyz`` answer 503 until it is back), binds the listener (HTTPS when
``tls_cert``/``tls_key`` are set, plain HTTP otherwise) and returns ``{"avro": port}``.
``stop()`` shuts down in aiohttp's documented order: stop accepting, wake waiting reads
(they answer with what they have), let in-flight requests finish (a publish being made
durable included), then close the connection to the core (the ``cleanup_ctx``). The runner
is every frontend's (:class:`polymq_server.web.app.WebService`).
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

from . import api, registry_api
from .config import AvroSettings
from .corelink import AvroLink
from .metrics import AvroMetrics
from .openapi import document
from .problems import incompatible_middleware, problem_middleware
from .registry import Registry

__all__ = ["AvroService", "build_app"]

log = logging.getLogger(__name__)


def build_app(settings: AvroSettings, registry: CollectorRegistry) -> web.Application:
    metrics = AvroMetrics(registry)
    app = web.Application(
        middlewares=[
            metrics_middleware(api.METRICS),
            problem_middleware,
            incompatible_middleware,
            cross_site_guard,  # (no CORS here: a browser's cross-site write is refused)
            login_first(api.ACCESS),  # before anything reads a body
        ],
        client_max_size=settings.avro_max_body,
    )
    core = AvroLink(settings, metrics)
    cache = core.schemas
    app[api.SETTINGS] = settings
    app[api.METRICS] = metrics
    app[api.CORE] = core
    app[api.CACHE] = cache
    app[api.REGISTRY] = Registry(core.call, cache, settings.compatibility)
    app[api.ACCESS] = reloaded_access(settings.auth, app[api.CORE], "avro")
    app[api.OPENAPI] = json.dumps(document(settings), indent=1).encode()
    api.add_routes(app)
    registry_api.add_routes(app)
    add_metrics_route(app, registry)
    add_core_link(app, api.CORE)  # at shutdown, waiting reads answer at once
    return app


class AvroService(WebService[AvroSettings]):
    name = "avro"

    def __init__(self, settings: AvroSettings, registry: CollectorRegistry | None = None) -> None:
        super().__init__(settings, registry, build_app, port=settings.avro_port)

    def started(self) -> None:
        s, core = self.settings, self.app[api.CORE]
        log.info(
            "avro: Avro over HTTP and a schema registry on %s (OpenAPI at /openapi.json), "
            "core %s %s; compatibility %s by default; %s",
            self.url,
            core.address,
            link_state(core),
            s.compatibility.value,
            self.app[api.ACCESS].provider.describe(),
        )
