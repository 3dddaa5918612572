"""``polymq_client_connections{protocol, listener}``: the open connections of clients, under
one name for every process, so that a dashboard sums them by protocol with one query.

Each service already counts its connections in a gauge of its own, which tests and users
read: the core's ``polymq_connections{protocol}`` (``native`` for clients of the wire
protocol), ``polymq_stomp_connections{transport}``, ``polymq_amqp_connections``, and the
HTTP listeners' ``polymq_<service>_connections{listener}``. This gauge counts nothing
itself: each of its children reads one of those when scraped (:func:`watch_connections`),
so no connection is counted twice on the way in or out.

Labels are bounded: ``protocol`` is ``native``, ``stomp``, ``amqp``, ``http``,
``longpoll`` or ``avro``; ``listener`` the name of the port the connection came to, as in
the ports file (``core``, ``stomp``, ``stomp_ws``, ``amqp``, ``http``, ``longpoll``,
``avro``). Which pod or process it is, is Prometheus's ``instance`` label.

``polymq run`` serves every service from one registry: the gauge is made once per registry.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

__all__ = ["client_connections", "gauge_value", "watch_connections"]

_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()


def client_connections(registry: CollectorRegistry) -> Gauge:
    """The registry's ``polymq_client_connections`` gauge (declared on first use)."""
    gauge = _GAUGES.get(registry)
    if gauge is None:
        gauge = _GAUGES[registry] = Gauge(
            "polymq_client_connections",
            "Open connections of clients, by protocol and by the listener they came to",
            ["protocol", "listener"],
            registry=registry,
        )
    return gauge


def gauge_value(gauge: Gauge, labels: Mapping[str, str]) -> float:
    """The value of ``gauge``'s child with exactly ``labels`` (0 while it has none)."""
    for metric in gauge.collect():
        for sample in metric.samples:
            if sample.labels == labels:
                return float(sample.value)
    return 0.0


def watch_connections(
    registry: CollectorRegistry,
    protocol: str,
    listener: str,
    source: Gauge,
    labels: Mapping[str, str] | None = None,
) -> None:
    """Let ``polymq_client_connections{protocol, listener}`` read the child of ``source``
    with ``labels`` (none: ``source`` has no labels) when scraped."""
    wanted = dict(labels or {})
    client_connections(registry).labels(protocol, listener).set_function(
        lambda: gauge_value(source, wanted)
    )
