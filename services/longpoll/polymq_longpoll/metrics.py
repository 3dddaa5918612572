"""Every metric of the long-polling frontend, declared against an injected registry.

Labels are bounded: ``route`` is the route's template or ``unmatched``, ``method`` one of
the HTTP methods or ``other``, ``status`` the code, ``transport`` ``poll`` or ``sse``,
``outcome`` ``messages``, ``empty`` or ``error``, ``kind`` a destination kind.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from polymq_server.requestmetrics import RequestMetrics

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


class LongpollMetrics(RequestMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(
            registry,
            "longpoll",
            requests="HTTP requests answered, by route template and status (SSE streams when "
            "they end)",
            duration=None,
        )
        self.polls_open = Gauge(
            "polymq_longpoll_polls_open",
            "Long polls waiting for messages or their deadline",
            registry=registry,
        )
        self.sse_streams = Gauge(
            "polymq_longpoll_sse_streams",
            "Server-Sent Events streams open",
            registry=registry,
        )
        self.poll_duration = Histogram(
            "polymq_longpoll_poll_duration_seconds",
            "Time from a long poll's arrival to its answer, by outcome",
            ["outcome"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.reconnects = Counter(
            "polymq_longpoll_reconnects",
            "Clients resuming from a cursor after losing a connection: SSE streams opened with "
            "Last-Event-ID or ?cursor=, long polls sent with Last-Event-ID",
            ["transport"],
            registry=registry,
        )
        self.subscriptions = Counter(
            "polymq_longpoll_subscriptions_opened",
            "Subscriptions opened at the core through this frontend",
            ["kind"],
            registry=registry,
        )
        self.messages = Counter(
            "polymq_longpoll_messages",
            "Messages delivered (by transport), published and settled",
            ["operation"],
            registry=registry,
        )
        self.core_link_metrics(registry)
