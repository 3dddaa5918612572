"""Every metric of the core, declared against an injected ``CollectorRegistry``.

The broker calls sensor hooks (``on_publish``, ``on_deliver``, ...); only this module knows
about Prometheus. Names are ``polymq_*`` in base units; labels are bounded: ``protocol`` is
one of :data:`PROTOCOLS`, ``kind`` one of the four destination kinds, ``reason`` a fixed word.
Per-destination figures are not labels (millions of queues would explode cardinality): they
are in the admin API's stats instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from polymq_server.listener import listener_metrics

PROTOCOLS = ("native", "http", "longpoll", "stomp", "avro", "amqp", "bridge", "peer")


def protocol_label(client: str) -> str:
    """Map a client's self-description (``Hello.client``) to a bounded label."""
    word = client.split("/", 1)[0].lower()
    return word if word in PROTOCOLS else "native"


def _total(counter: Counter) -> float:
    """A counter's value summed over its labels."""
    return sum(
        s.value for family in counter.collect() for s in family.samples if s.name.endswith("_total")
    )


class Sensors:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.published = Counter(
            "polymq_published_messages",
            "Messages accepted from producers",
            ["protocol", "kind"],
            registry=registry,
        )
        self._published: dict[tuple[str, str], Any] = {}
        self.duplicate_batches = Counter(
            "polymq_duplicate_batches",
            "Publishes of a batch id already published within its window (nothing published)",
            ["protocol"],
            registry=registry,
        )
        self.delivered = Counter(
            "polymq_delivered_messages", "Messages handed to subscribers", registry=registry
        )
        self.acked = Counter(
            "polymq_acked_messages", "Deliveries acknowledged by consumers", registry=registry
        )
        self.redelivered = Counter(
            "polymq_redelivered_messages",
            "Messages put back for another delivery",
            ["reason"],
            registry=registry,
        )
        self.discarded = Counter(
            "polymq_discarded_messages",
            "Messages that left a queue unacked (dead-lettered when configured)",
            ["reason"],
            registry=registry,
        )
        self.connections = Gauge(
            "polymq_connections", "Open client connections", ["protocol"], registry=registry
        )
        # polymq_admin_connections and ..._connections_refused, by listener (admin and,
        # with cluster TLS, peer_admin)
        self.admin_listeners = listener_metrics(registry, "polymq_admin", "admin HTTP")
        self.subscriptions = Gauge(
            "polymq_subscriptions", "Active subscriptions", ["kind"], registry=registry
        )
        self.destinations = Gauge(
            "polymq_destinations_in_memory",
            "Queues and streams held in memory",
            registry=registry,
        )
        self.slow_consumers = Counter(
            "polymq_slow_consumers",
            "Subscribers cut off or dropped for not reading",
            ["policy"],
            registry=registry,
        )
        self.protocol_errors = Counter(
            "polymq_protocol_errors",
            "Connections closed for protocol violations",
            registry=registry,
        )
        self.request_errors = Counter(
            "polymq_request_errors", "Requests refused", ["code"], registry=registry
        )
        self.commit_seconds = Histogram(
            "polymq_store_commit_seconds",
            "Time of one store commit including fsync",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5),
            registry=registry,
        )
        self.commit_ops = Histogram(
            "polymq_store_commit_operations",
            "Operations grouped into one store commit",
            buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384),
            registry=registry,
        )
        self.ready = Gauge(
            "polymq_ready_messages",
            "Messages waiting for delivery, over every destination in memory",
            ["kind"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "polymq_in_flight_messages",
            "Messages delivered and not yet acked",
            registry=registry,
        )
        self.bindings = Gauge(
            "polymq_bindings",
            "Bindings from topic patterns to queues",
            registry=registry,
        )
        # cluster mode (docs/cluster.md); absent values stay 0 on a single node
        self.shards_led = Gauge(
            "polymq_cluster_shards_led",
            "Shards this node leads (a single node leads all of its shards)",
            registry=registry,
        )
        self.cluster_nodes = Gauge(
            "polymq_cluster_nodes",
            "Nodes of the cluster by the state this node sees them in",
            ["state"],
            registry=registry,
        )
        self.leadership = Counter(
            "polymq_cluster_leadership_changes",
            "Shards this node took the lead of (promoted) or gave up (demoted)",
            ["change"],
            registry=registry,
        )
        self.forwarded = Counter(
            "polymq_cluster_forwarded_requests",
            "Requests forwarded to the node that leads their shard",
            registry=registry,
        )

    def watch_depth(self, depth: Callable[[str], int], in_flight: Callable[[], int]) -> None:
        """Read queue depths when scraped (never on the message path)."""

        def of(kind: str) -> Callable[[], float]:
            return lambda: depth(kind)

        for kind in ("queue", "stream", "channel"):
            self.ready.labels(kind).set_function(of(kind))
        self.in_flight.set_function(in_flight)

    def watch_bindings(self, count: Callable[[], int]) -> None:
        self.bindings.set_function(count)

    def watch_cluster(
        self, shards_led: Callable[[], int], nodes: Callable[[], dict[str, int]]
    ) -> None:
        """Read the cluster's state when scraped."""
        self.shards_led.set_function(shards_led)

        def of(state: str) -> Callable[[], float]:
            return lambda: nodes().get(state, 0)

        for state in ("ready", "joining", "leaving", "unreachable"):
            self.cluster_nodes.labels(state).set_function(of(state))

    def totals(self) -> dict[str, float]:
        """The totals of the publish, deliver and ack counters (the console's rates)."""
        return {
            "publish": _total(self.published),
            "deliver": _total(self.delivered),
            "ack": _total(self.acked),
        }

    def on_leadership(self, change: str) -> None:
        self.leadership.labels(change).inc()

    def on_forward(self) -> None:
        self.forwarded.inc()

    def on_publish(self, protocol: str, kind: str, n: int) -> None:
        child = self._published.get((protocol, kind))
        if child is None:  # (protocols and kinds are few: the children are kept)
            child = self._published[protocol, kind] = self.published.labels(protocol, kind)
        child.inc(n)

    def on_duplicate_batch(self, protocol: str) -> None:
        self.duplicate_batches.labels(protocol).inc()

    def on_deliver(self, n: int) -> None:
        self.delivered.inc(n)

    def on_ack(self, n: int) -> None:
        self.acked.inc(n)

    def on_redeliver(self, reason: str, n: int) -> None:
        self.redelivered.labels(reason).inc(n)

    def on_discard(self, reason: str, n: int) -> None:
        self.discarded.labels(reason).inc(n)

    def on_connection(self, protocol: str, delta: int) -> None:
        self.connections.labels(protocol).inc(delta)

    def on_subscription(self, kind: str, delta: int) -> None:
        self.subscriptions.labels(kind).inc(delta)

    def on_destinations(self, delta: int) -> None:
        self.destinations.inc(delta)

    def on_slow_consumer(self, policy: str) -> None:
        self.slow_consumers.labels(policy).inc()

    def on_protocol_error(self) -> None:
        self.protocol_errors.inc()

    def on_request_error(self, code: str) -> None:
        self.request_errors.labels(code).inc()

    def on_commit(self, seconds: float, ops: int) -> None:
        self.commit_seconds.observe(seconds)
        self.commit_ops.observe(ops)
