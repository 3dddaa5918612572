"""Every metric of the HTTP frontend, declared against an injected ``CollectorRegistry``.

Labels are bounded: ``route`` is the route's template (``/v1/{kind}/{name}/messages``) or
``unmatched``, ``method`` one of the methods the API uses or ``other``, ``status`` the code.
The request and core-link metrics are every frontend's
(:class:`polymq_server.web.requestmetrics.RequestMetrics`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from polymq_server.web.requestmetrics import RequestMetrics, method_label

__all__ = ["HttpMetrics", "method_label"]


class HttpMetrics(RequestMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(
            registry,
            "http",
            requests="HTTP requests answered, by route template and status",
            duration="Time to answer one HTTP request (long polls included)",
        )
        self.core_link_metrics(registry)
        self.messages = Counter(
            "polymq_http_messages",
            "Messages published, pulled and settled over HTTP",
            ["operation"],
            registry=registry,
        )
