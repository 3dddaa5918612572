"""Every metric of the long-polling frontend, declared against an injected registry.

Labels are bounded: ``route`` is the route's template or ``unmatched``, ``method`` one of
the HTTP methods or ``other``, ``status`` the code, ``transport`` ``poll`` or ``sse``,
``outcome`` ``messages``, ``empty`` or ``error``, ``kind`` a destination kind.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from polymq_server.web.requestmetrics import RequestMetrics

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
        # long polls waiting now: a plain count the gauge reads when scraped (no lock taken
        # twice per poll: 10,000 of them may end together)
        self.polls = 0
        self.polls_open = Gauge(
            "polymq_longpoll_polls_open",
            "Long polls waiting for messages or their deadline",
            registry=registry,
        )
        self.polls_open.set_function(lambda: self.polls)
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
        # children by label value, made on first use (``labels()`` costs more than the
        # update, once per answer of 10,000 long polls woken together)
        self._poll_durations: dict[str, Histogram] = {}
        self._delivered: dict[str, Counter] = {}

    def poll_answered(self, outcome: str, seconds: float) -> None:
        """A long poll ends, ``outcome`` ``messages``, ``empty`` or ``error``."""
        _child(self._poll_durations, self.poll_duration, outcome).observe(seconds)

    def delivered(self, transport: str, count: int) -> None:
        """``count`` messages go out by ``transport`` (``poll`` or ``sse``)."""
        _child(self._delivered, self.messages, transport).inc(count)


W = TypeVar("W", bound=MetricWrapperBase)


def _child(children: dict[str, W], metric: W, value: str) -> W:
    child = children.get(value)
    if child is None:
        child = children[value] = metric.labels(value)
    return child
