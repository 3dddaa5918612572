"""polymq_server.link.connectiongauge: one ``polymq_client_connections`` per registry, whose
children read the services' own gauges when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from polymq_server.link.connectiongauge import client_connections, watch_connections


def _value(registry: CollectorRegistry, protocol: str, listener: str) -> float | None:
    labels = {"protocol": protocol, "listener": listener}
    return registry.get_sample_value("polymq_client_connections", labels)


def test_children_read_the_services_gauges_and_share_one_gauge_per_registry() -> None:
    registry = CollectorRegistry()
    stomp = Gauge("polymq_stomp_connections", "", ["transport"], registry=registry)
    amqp = Gauge("polymq_amqp_connections", "", registry=registry)
    # two services in one registry (polymq run) declare their children on the same gauge
    watch_connections(registry, "stomp", "stomp_ws", stomp, {"transport": "ws"})
    watch_connections(registry, "amqp", "amqp", amqp)
    assert client_connections(registry) is client_connections(registry)
    assert _value(registry, "stomp", "stomp_ws") == 0  # no child of the source yet
    stomp.labels("ws").inc(3)
    stomp.labels("tcp").inc(5)  # another child: not this one's
    amqp.inc(2)
    assert _value(registry, "stomp", "stomp_ws") == 3
    assert _value(registry, "amqp", "amqp") == 2
    amqp.dec(2)
    assert _value(registry, "amqp", "amqp") == 0


def test_each_registry_has_its_own() -> None:
    one, two = CollectorRegistry(), CollectorRegistry()
    g = Gauge("polymq_amqp_connections", "", registry=one)
    g.inc()
    watch_connections(one, "amqp", "amqp", g)
    assert client_connections(one) is not client_connections(two)
    assert _value(one, "amqp", "amqp") == 1
    assert _value(two, "amqp", "amqp") is None
