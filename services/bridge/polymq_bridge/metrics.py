"""Every metric of the RabbitMQ bridge, declared against an injected ``CollectorRegistry``.

Labels are bounded: ``link`` is a link's name from the links file (a fixed set),
``direction`` is ``to_rabbitmq`` or ``to_polymq``, ``side`` is ``rabbitmq`` or ``core``,
``reason`` one of :data:`REASONS`.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from .config import LinkConfig

__all__ = ["REASONS", "SIDES", "BridgeMetrics", "LinkMetrics"]

SIDES = ("rabbitmq", "core")
REASONS = frozenset(
    {
        "rabbitmq_nack",  # RabbitMQ answered a publish with basic.nack: requeued in polymq
        "unroutable",  # RabbitMQ returned a publish it could not route (see on_unroutable)
        "publish_failed",  # a publish failed or timed out (the message goes back to its source)
        "rejected",  # the core refused a message for good (too large, malformed): rejected
        "source_failed",  # consuming the source failed (a missing queue or exchange, ...)
        "connection_lost",  # a side went away while the link was running
        "internal",  # a bug
    }
)


class LinkMetrics:
    """One link's children, resolved once (a message costs an attribute lookup)."""

    def __init__(self, m: BridgeMetrics, link: LinkConfig) -> None:
        name, direction = link.name, link.direction.label
        self.moved = m.messages.labels(name, direction)
        self.bytes = m.bytes.labels(name, direction)
        self.redelivered = m.redelivered.labels(name)
        self.in_flight = m.in_flight.labels(name)
        self.lag = m.lag.labels(name)
        self.up = m.link_up.labels(name)
        self.sessions = m.sessions.labels(name)
        self.offset = m.stream_offset.labels(name)
        self._errors = {r: m.errors.labels(name, r) for r in REASONS}

    def error(self, reason: str, n: int = 1) -> None:
        self._errors.get(reason, self._errors["internal"]).inc(n)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = Counter(
            "polymq_bridge_messages",
            "Messages moved: confirmed by the target, then acknowledged at the source",
            ["link", "direction"],
            registry=registry,
        )
        self.bytes = Counter(
            "polymq_bridge_bytes",
            "Body bytes of the messages moved",
            ["link", "direction"],
            registry=registry,
        )
        self.redelivered = Counter(
            "polymq_bridge_redelivered",
            "Messages the source delivered again (possible duplicates at the target)",
            ["link"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "polymq_bridge_in_flight",
            "Messages taken from the source and not yet confirmed by the target",
            ["link"],
            registry=registry,
        )
        self.lag = Gauge(
            "polymq_bridge_lag_messages",
            "Messages waiting at the source (polymq queue depth, entries behind on a stream, "
            "RabbitMQ queue depth), sampled every POLYMQ_BRIDGE_STATS_INTERVAL",
            ["link"],
            registry=registry,
        )
        self.link_up = Gauge(
            "polymq_bridge_link_up",
            "1 while the link is consuming its source, else 0",
            ["link"],
            registry=registry,
        )
        self.sessions = Counter(
            "polymq_bridge_link_sessions",
            "Times the link started consuming (a restart after a failure counts again)",
            ["link"],
            registry=registry,
        )
        self.stream_offset = Gauge(
            "polymq_bridge_stream_offset",
            "A stream link's last entry confirmed by RabbitMQ with every earlier one",
            ["link"],
            registry=registry,
        )
        self.errors = Counter(
            "polymq_bridge_errors",
            "Failures, by link and reason",
            ["link", "reason"],
            registry=registry,
        )
        self.connected = Gauge(
            "polymq_bridge_connected",
            "1 while the bridge holds a connection to that side, else 0",
            ["side"],
            registry=registry,
        )
        self.connects = Counter(
            "polymq_bridge_connects",
            "Connections made to that side (the first one included)",
            ["side"],
            registry=registry,
        )
        self.reconnects = Counter(
            "polymq_bridge_reconnects",
            "Connections made to that side after one was lost",
            ["side"],
            registry=registry,
        )
        self.connect_failures = Counter(
            "polymq_bridge_connect_failures",
            "Attempts to connect to that side that failed (each followed by a backoff)",
            ["side"],
            registry=registry,
        )
        for side in SIDES:
            self.connected.labels(side)
            self.connects.labels(side)
            self.reconnects.labels(side)
            self.connect_failures.labels(side)

    def link(self, link: LinkConfig) -> LinkMetrics:
        return LinkMetrics(self, link)

    def links(self, links: Iterable[LinkConfig]) -> dict[str, LinkMetrics]:
        return {link.name: self.link(link) for link in links}
