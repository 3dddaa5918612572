"""The metrics every aiohttp frontend declares against an injected ``CollectorRegistry``,
and ``GET /metrics``.

- :class:`RequestMetrics`: ``polymq_<service>_requests`` (by method, route template and
  status), ``..._request_duration_seconds`` and ``..._requests_in_flight``, and the core
  link's ``..._core_connected`` and ``..._core_connects`` (:func:`core_link_metrics`); a
  frontend's ``metrics.py`` subclasses it.
- :func:`metrics_middleware`: counts and times every request into them.
- :func:`metrics_endpoint` and :func:`add_metrics_route`: ``GET /metrics`` of the registry
  stored under :data:`PROMETHEUS` (the core's admin HTTP serves its own with them too).
"""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = [
    "PROMETHEUS",
    "RequestMetrics",
    "add_metrics_route",
    "core_link_metrics",
    "method_label",
    "metrics_endpoint",
    "metrics_middleware",
]

M = TypeVar("M", bound="RequestMetrics")

PROMETHEUS = web.AppKey("prometheus", CollectorRegistry)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def method_label(method: str) -> str:
    """A bounded ``method`` label: one of the methods the APIs use, else ``other``."""
    return method if method in _METHODS else "other"


def core_link_metrics(registry: CollectorRegistry, service: str) -> tuple[Gauge, Counter]:
    """``polymq_<service>_core_connected`` (1 while the frontend holds a connection to the
    core) and ``polymq_<service>_core_connects`` (connections made), declared in
    ``registry``."""
    connected = Gauge(
        f"polymq_{service}_core_connected",
        "1 while the frontend holds a connection to the core, else 0",
        registry=registry,
    )
    connects = Counter(
        f"polymq_{service}_core_connects",
        "Connections made to the core (a reconnect counts again)",
        registry=registry,
    )
    return connected, connects


class RequestMetrics:
    """The request metrics of frontend ``service``: ``polymq_<service>_requests`` (by method,
    route template and status; ``requests`` is its help), and with ``duration`` (the help of
    the histogram) also ``polymq_<service>_request_duration_seconds`` and
    ``polymq_<service>_requests_in_flight``. A subclass declares its own metrics after these,
    and the core link's with :meth:`core_link_metrics` where they belong in its list."""

    core_connected: Gauge
    core_connects: Counter

    def __init__(
        self, registry: CollectorRegistry, service: str, *, requests: str, duration: str | None
    ) -> None:
        self.service = service
        self.requests = Counter(
            f"polymq_{service}_requests",
            requests,
            ["method", "route", "status"],
            registry=registry,
        )
        self._counted: dict[tuple[str, str, int], Counter] = {}
        self.duration: Histogram | None = None
        self.in_flight: Gauge | None = None
        if duration is not None:
            self.duration = Histogram(
                f"polymq_{service}_request_duration_seconds",
                duration,
                ["method", "route"],
                buckets=_DURATION_BUCKETS,
                registry=registry,
            )
            self.in_flight = Gauge(
                f"polymq_{service}_requests_in_flight",
                "HTTP requests being answered",
                registry=registry,
            )

    def core_link_metrics(self, registry: CollectorRegistry) -> None:
        """Declare ``polymq_<service>_core_connected`` and ``..._core_connects``."""
        self.core_connected, self.core_connects = core_link_metrics(registry, self.service)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        m = method_label(method)
        key = (m, route, status)  # bounded: a method label, a route template, a status
        counter = self._counted.get(key)
        if counter is None:  # (labels() costs more than inc(): once per key, not per answer)
            counter = self._counted[key] = self.requests.labels(m, route, str(status))
        counter.inc()
        if self.duration is not None:
            self.duration.labels(m, route).observe(seconds)


def metrics_middleware(key: web.AppKey[M]) -> Middleware:
    """A middleware that counts (and times) every request into the metrics under ``key``:
    by route template (``unmatched`` for none) and status (499 when the client went away,
    500 when the handler failed without an HTTP answer)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        metrics = request.app[key]
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        start = time.perf_counter()
        status = 500
        in_flight = metrics.in_flight
        if in_flight is not None:
            in_flight.inc()
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
            if in_flight is not None:
                in_flight.dec()
            metrics.observe(request.method, route, status, time.perf_counter() - start)

    return middleware


async def metrics_endpoint(request: web.Request) -> web.Response:
    """``GET /metrics``: the registry stored under :data:`PROMETHEUS`."""
    body = generate_latest(request.app[PROMETHEUS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_metrics_route(app: web.Application, registry: CollectorRegistry) -> None:
    """``GET /metrics`` of ``registry`` (stored under :data:`PROMETHEUS`)."""
    app[PROMETHEUS] = registry
    app.router.add_get("/metrics", metrics_endpoint)
