"""polymq_core.metrics without sockets: the per-destination collector's series, its cap and
what it left out, and the series the core declares ahead for its fixed label values."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from polymq_core.metrics import DestinationCollector, Sensors

QUEUE = {
    "destination": "queue/orders",
    "messages": 6,
    "bytes": 12,
    "in_flight": 4,
    "subscribers": 1,
    "published": 10,
    "delivered": 4,
    "acked": 0,
}
STREAM = {"destination": "stream/clicks", "messages": 3, "bytes": 9, "subscribers": 0,
          "published": 3}  # fmt: skip


def _stats(rows: list[Mapping[str, Any]]) -> Any:
    def stats(limit: int) -> Iterator[Mapping[str, Any]]:
        yield from rows[:limit]

    return stats


def test_each_destination_is_a_series_of_each_figure_it_has() -> None:
    registry = CollectorRegistry()
    registry.register(DestinationCollector(_stats([QUEUE, STREAM]), lambda: 2, 10))

    def value(name: str, dest: str) -> float | None:
        return registry.get_sample_value(name, {"destination": dest})

    assert value("polymq_destination_messages_ready", "queue/orders") == 6
    assert value("polymq_destination_ready_bytes", "queue/orders") == 12
    assert value("polymq_destination_messages_unacked", "queue/orders") == 4
    assert value("polymq_destination_consumers", "queue/orders") == 1
    assert value("polymq_destination_published_messages_total", "queue/orders") == 10
    assert value("polymq_destination_delivered_messages_total", "queue/orders") == 4
    assert value("polymq_destination_acked_messages_total", "queue/orders") == 0
    assert value("polymq_destination_messages_ready", "stream/clicks") == 3
    assert value("polymq_destination_published_messages_total", "stream/clicks") == 3
    # a stream has no unacked messages, deliveries or acks counted: no series rather than 0
    assert value("polymq_destination_messages_unacked", "stream/clicks") is None
    assert value("polymq_destination_delivered_messages_total", "stream/clicks") is None
    assert registry.get_sample_value("polymq_destination_metrics_omitted") == 0


def test_past_the_cap_destinations_are_counted_not_exported() -> None:
    rows = [{**QUEUE, "destination": f"queue/q{i}"} for i in range(5)]
    asked: list[int] = []

    def stats(limit: int) -> Iterator[Mapping[str, Any]]:
        asked.append(limit)
        yield from rows[:limit]

    registry = CollectorRegistry()
    registry.register(DestinationCollector(stats, lambda: 5, 2))
    assert asked == []  # registering describes the families; it reads no destination
    assert registry.get_sample_value("polymq_destination_metrics_omitted") == 3
    assert asked == [2]  # only as many as it exports are read
    exported = {
        s.labels["destination"]
        for metric in registry.collect()
        if metric.name == "polymq_destination_consumers"
        for s in metric.samples
    }
    assert exported == {"queue/q0", "queue/q1"}


def test_fixed_label_values_have_series_from_the_start() -> None:
    registry = CollectorRegistry()
    Sensors(registry)
    get = registry.get_sample_value
    assert get("polymq_redelivered_messages_total", {"reason": "ack-timeout"}) == 0
    assert get("polymq_discarded_messages_total", {"reason": "max-length"}) == 0
    assert get("polymq_slow_consumers_total", {"policy": "disconnect"}) == 0
    assert get("polymq_cluster_nodes", {"state": "ready"}) == 0
    assert get("polymq_cluster_leadership_changes_total", {"change": "promoted"}) == 0
    assert get("polymq_client_connections", {"protocol": "native", "listener": "core"}) == 0
