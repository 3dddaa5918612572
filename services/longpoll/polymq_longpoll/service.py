"""The long-polling frontend as a running service: an aiohttp app, its listener and its
core link.

``start()`` builds the app, connects to the core (waiting for the first attempt only: a core
that is away makes ``/readyz`` answer 503 until it is back), binds the listener (HTTPS when
``tls_cert``/``tls_key`` are set, plain HTTP otherwise) and returns ``{"longpoll": port}``.
``stop()`` shuts down in aiohttp's documented order: stop accepting, wake long polls and
SSE streams (polls answer with what they have, streams end and their clients reconnect
elsewhere with their cursor), let in-flight requests finish, then close the connection to
the core (the ``cleanup_ctx`` of the app). The runner is every frontend's
(:class:`polymq_server.web.app.WebService`).
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq_server.web.access import reloaded_access
from polymq_server.web.app import WebService, add_core_link, link_state
from polymq_server.web.guards import login_first
from polymq_server.web.requestmetrics import add_metrics_route, metrics_middleware

from . import api, page, sse
from .answers import Shown
from .config import LongpollSettings
from .corelink import LongpollLink
from .cors import Cors
from .leases import Windows
from .metrics import LongpollMetrics
from .problems import problem_middleware
from .subscriptions import ids_key

__all__ = ["LongpollService", "build_app"]

log = logging.getLogger(__name__)


async def _on_shutdown(app: web.Application) -> None:
    app[api.WINDOWS].stop()  # after the core link's ``stopping``: SSE windows end too


def build_app(settings: LongpollSettings, registry: CollectorRegistry) -> web.Application:
    metrics = LongpollMetrics(registry)
    cors = Cors(settings.cors_origins())
    app = web.Application(
        middlewares=[
            metrics_middleware(api.METRICS),
            cors.preflight,
            problem_middleware,
            login_first(api.ACCESS),  # before anything reads a body (CORS: see cors.py)
        ],
        client_max_size=settings.longpoll_max_body,
    )
    app.on_response_prepare.append(cors.on_prepare)
    app[api.SETTINGS] = settings
    app[api.METRICS] = metrics
    app[api.CORE] = LongpollLink(settings, metrics)
    app[api.ACCESS] = reloaded_access(settings.auth, app[api.CORE], "longpoll")
    app[api.IDS_KEY] = ids_key(settings.ids_material)
    app[api.WINDOWS] = Windows()
    app[api.SHOWN] = Shown()
    api.add_routes(app)
    sse.add_routes(app)
    page.add_routes(app)
    add_metrics_route(app, registry)
    add_core_link(app, api.CORE)  # at shutdown, long polls answer at once, SSE streams end
    app.on_shutdown.append(_on_shutdown)
    return app


class LongpollService(WebService[LongpollSettings]):
    name = "longpoll"
    backlog = 4096  # browsers reconnect all at once after a restart

    def __init__(
        self, settings: LongpollSettings, registry: CollectorRegistry | None = None
    ) -> None:
        super().__init__(settings, registry, build_app, port=settings.longpoll_port)

    def started(self) -> None:
        s, core = self.settings, self.app[api.CORE]
        origins = s.cors_origins()
        log.info(
            "longpoll: long polling and SSE on %s (a demo page at /), core %s %s; CORS %s; %s",
            self.url,
            core.address,
            link_state(core),
            "from any origin" if origins is None else ", ".join(sorted(origins)) or "off",
            self.app[api.ACCESS].provider.describe(),
        )
        if s.ids_material is None and not s.anonymous:
            log.warning(
                "longpoll: subscription ids are signed with a key anyone can know (no "
                "POLYMQ_LONGPOLL_SECRET, no cluster secret, no credentials at the core): set "
                "POLYMQ_LONGPOLL_SECRET, the same on every replica"
            )
