"""Every metric of the HTTP frontend, declared against an injected ``CollectorRegistry``.

Labels are bounded: ``route`` is the route's template (``/v1/{kind}/{name}/messages``) or
``unmatched``, ``method`` one of the methods the API uses or ``other``, ``status`` the code.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})


def method_label(method: str) -> str:
    return method if method in _METHODS else "other"


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "polymq_http_requests",
            "HTTP requests answered, by route template and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "polymq_http_request_duration_seconds",
            "Time to answer one HTTP request (long polls included)",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.in_flight = Gauge(
            "polymq_http_requests_in_flight", "HTTP requests being answered", registry=registry
        )
        self.core_connected = Gauge(
            "polymq_http_core_connected",
            "1 while the frontend holds a connection to the core, else 0",
            registry=registry,
        )
        self.core_connects = Counter(
            "polymq_http_core_connects",
            "Connections made to the core (a reconnect counts again)",
            registry=registry,
        )
        self.messages = Counter(
            "polymq_http_messages",
            "Messages published, pulled and settled over HTTP",
            ["operation"],
            registry=registry,
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        m = method_label(method)
        self.requests.labels(m, route, str(status)).inc()
        self.duration.labels(m, route).observe(seconds)
