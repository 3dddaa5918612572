"""Every metric of the core, declared against an injected ``CollectorRegistry``.

The broker calls sensor hooks (``on_publish``, ``on_deliver``, ...); only this module knows
about Prometheus. Names are ``polymq_*`` in base units; labels are bounded: ``protocol`` is
one of :data:`PROTOCOLS`, ``kind`` one of the four destination kinds, ``reason`` a fixed word.
Per-destination figures are labels only when asked (``POLYMQ_METRICS_PER_DESTINATION``):
millions of queues would explode cardinality. :class:`DestinationCollector` reads them from
the destinations in memory when scraped, at most ``POLYMQ_METRICS_MAX_DESTINATIONS`` of
them; without it they are in the admin API's stats only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from polymq_server.link.connectiongauge import watch_connections
from polymq_server.web.listener import listener_metrics

PROTOCOLS = ("native", "http", "longpoll", "stomp", "avro", "amqp", "bridge", "peer")
# the label values known ahead (queue.py, session.py, shard.py, cluster.py): their series are
# there from the start at 0, so that a dashboard's rate() sees the first event
REDELIVER_REASONS = ("nack", "disconnect", "ack-timeout")
DISCARD_REASONS = ("max-length", "expired", "max-deliveries", "rejected")
SLOW_CONSUMER_POLICIES = ("drop", "disconnect")
NODE_STATES = ("ready", "joining", "leaving", "unreachable")
LEADERSHIP_CHANGES = ("promoted", "demoted")


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
        # polymq_client_connections{protocol="native"}: the wire's own clients (the others
        # here are frontends' and peers' links; their clients are counted by the frontends)
        watch_connections(registry, "native", "core", self.connections, {"protocol": "native"})
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
        for metric, values in (
            (self.redelivered, REDELIVER_REASONS),
            (self.discarded, DISCARD_REASONS),
            (self.slow_consumers, SLOW_CONSUMER_POLICIES),
            (self.cluster_nodes, NODE_STATES),
            (self.leadership, LEADERSHIP_CHANGES),
        ):
            for value in values:
                metric.labels(value)
        # the resource alarms' measures and limits (alarms.py), read when scraped
        self.memory_used = Gauge(
            "polymq_memory_resident_bytes",
            "Resident memory of the core's process, as the memory alarm measured it last",
            registry=registry,
        )
        self.memory_mark = Gauge(
            "polymq_memory_high_watermark_bytes",
            "The resident size the memory is to stay under (POLYMQ_MEMORY_HIGH_WATERMARK)",
            registry=registry,
        )
        self.memory_edges = Gauge(
            "polymq_memory_alarm_threshold_bytes",
            "The resident size the memory alarm rises at (edge=rise: POLYMQ_MEMORY_HEADROOM "
            "below the watermark) and clears under (edge=clear: POLYMQ_MEMORY_LOW_WATERMARK)",
            ["edge"],
            registry=registry,
        )
        self.memory_pressure = Gauge(
            "polymq_memory_pressure",
            "1 while the memory is past the low watermark (paging queues squeeze their window)",
            registry=registry,
        )
        self.disk_free = Gauge(
            "polymq_disk_free_bytes",
            "Free bytes of the data directory's file system, as the disk alarm measured it last",
            registry=registry,
        )
        self.disk_limit = Gauge(
            "polymq_disk_free_limit_bytes",
            "The disk alarm goes on below this many free bytes (POLYMQ_DISK_FREE_LIMIT)",
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

    def watch_resources(self, detail: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        """Read the alarms' last measures (``{"memory": {"used", "limit", "rises_at",
        "clears_at", "pressure"}, "disk": {"free", "limit"}}``, empty before the first) when
        scraped."""

        def of(resource: str, key: str) -> Callable[[], float]:
            return lambda: detail().get(resource, {}).get(key, 0)

        self.memory_used.set_function(of("memory", "used"))
        self.memory_mark.set_function(of("memory", "limit"))
        self.memory_edges.labels("rise").set_function(of("memory", "rises_at"))
        self.memory_edges.labels("clear").set_function(of("memory", "clears_at"))
        self.memory_pressure.set_function(of("memory", "pressure"))
        self.disk_free.set_function(of("disk", "free"))
        self.disk_limit.set_function(of("disk", "limit"))

    def watch_destinations(
        self,
        stats: Callable[[int], Iterable[Mapping[str, Any]]],
        count: Callable[[], int],
        limit: int,
    ) -> None:
        """Export per-destination figures (opt-in): see :class:`DestinationCollector`."""
        self.registry.register(DestinationCollector(stats, count, limit))

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


# (name, help, the key of a destination's stats, counter or gauge)
_PER_DESTINATION = (
    ("polymq_destination_messages_ready", "Messages waiting for delivery (a stream: its "
     "entries)", "messages", False),
    ("polymq_destination_ready_bytes", "Body bytes of the messages waiting", "bytes", False),
    ("polymq_destination_messages_unacked", "Messages delivered and not yet acked (queues and "
     "channels)", "in_flight", False),
    ("polymq_destination_consumers", "Subscribers", "subscribers", False),
    ("polymq_destination_published_messages", "Messages published to the destination",
     "published", True),
    ("polymq_destination_delivered_messages", "Messages delivered from the destination (queues "
     "and channels)", "delivered", True),
    ("polymq_destination_acked_messages", "Deliveries acked (queues and channels)", "acked",
     True),
)  # fmt: skip


class DestinationCollector(Collector):
    """Per-destination figures, labelled ``destination`` (``queue/orders``, a channel's inbox,
    ``stream/clicks``), made when scraped from the stats of the destinations this node holds
    in memory (``stats(limit)``: the first ``limit`` of them, shard by shard in the order
    they were loaded, which keeps the series stable); nothing on the message path. Those
    past ``limit`` (``count()`` is how many there are) are counted in
    ``polymq_destination_metrics_omitted``.
    The counters are the destinations' own (they restart from 0 with the process, and a
    destination evicted from memory while idle keeps them, but is not exported meanwhile).
    """

    def __init__(
        self,
        stats: Callable[[int], Iterable[Mapping[str, Any]]],
        count: Callable[[], int],
        limit: int,
    ) -> None:
        self._stats = stats
        self._count = count
        self.limit = limit

    def describe(self) -> Iterator[Metric]:
        yield from self._families()
        yield self._omitted(0)

    def _families(self) -> list[Metric]:
        return [
            (CounterMetricFamily if counter else GaugeMetricFamily)(
                name, help_, labels=["destination"]
            )
            for name, help_, _, counter in _PER_DESTINATION
        ]

    @staticmethod
    def _omitted(n: int) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "polymq_destination_metrics_omitted",
            "Destinations in memory left out of the polymq_destination_* metrics "
            "(POLYMQ_METRICS_MAX_DESTINATIONS)",
            value=n,
        )

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        exported = 0
        for stats in self._stats(self.limit):
            exported += 1
            label = [str(stats["destination"])]
            for family, (_, _, key, _) in zip(families, _PER_DESTINATION, strict=True):
                value = stats.get(key)
                if value is not None:
                    family.add_metric(label, value)  # type: ignore[attr-defined]
        yield from families
        yield self._omitted(max(self._count() - exported, 0))
