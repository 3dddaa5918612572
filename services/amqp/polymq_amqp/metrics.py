"""Every metric of the AMQP frontend, declared against an injected ``CollectorRegistry``.

Labels are bounded: ``method`` is an AMQP 0-9-1 method (``basic.publish``; content counts
with its method), ``direction`` is ``in`` or ``out``, ``code`` a reply code of the spec,
``scope`` ``channel`` or ``connection``, ``result`` ``ack`` or ``nack``, ``kind`` ``consume``
or ``get``.
"""

from __future__ import annotations

from pamqp import base, commands
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase

from polymq_server.link.connectiongauge import watch_connections
from polymq_server.sessions.frontend import FrontendMetrics

from .errors import REPLY_NAMES
from .wire.states import method_name

__all__ = ["AmqpMetrics"]


def _all_methods() -> list[str]:
    names = []
    for cls in (
        commands.Connection,
        commands.Channel,
        commands.Exchange,
        commands.Queue,
        commands.Basic,
        commands.Tx,
        commands.Confirm,
    ):
        for attr in vars(cls).values():
            if isinstance(attr, type) and issubclass(attr, base.Frame):
                names.append(method_name(attr))
    return names


class AmqpMetrics(FrontendMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.methods = Counter(
            "polymq_amqp_methods",
            "AMQP methods received (in) and sent (out), by class.method",
            ["method", "direction"],
            registry=registry,
        )
        self.connections = Gauge(
            "polymq_amqp_connections", "Open AMQP connections", registry=registry
        )
        # polymq_client_connections{protocol="amqp"} reads it (amqp and amqps together)
        watch_connections(registry, "amqp", "amqp", self.connections)
        self.connections_opened = Counter(
            "polymq_amqp_connections_opened", "AMQP connections accepted", registry=registry
        )
        self.channels = Gauge("polymq_amqp_channels", "Open AMQP channels", registry=registry)
        self.consumers = Gauge("polymq_amqp_consumers", "Active AMQP consumers", registry=registry)
        self.confirms = Counter(
            "polymq_amqp_confirms",
            "Publisher confirms sent, by result (ack or nack)",
            ["result"],
            registry=registry,
        )
        self.deliveries = Counter(
            "polymq_amqp_deliveries",
            "Messages delivered to AMQP clients, by kind (consume or get)",
            ["kind"],
            registry=registry,
        )
        self.returns = Counter(
            "polymq_amqp_returns", "Mandatory messages returned unroutable", registry=registry
        )
        self.errors = Counter(
            "polymq_amqp_errors",
            "Channel and connection exceptions sent, by reply code",
            ["code", "scope"],
            registry=registry,
        )
        self.declare_shared(registry, "amqp", "AMQP")  # bytes, core_connected, core_connects
        # children resolved once: a method costs a dict lookup, not a labels() call
        names = _all_methods()
        self.methods_in: dict[str, MetricWrapperBase] = {
            n: self.methods.labels(n, "in") for n in names
        }
        self.methods_out: dict[str, MetricWrapperBase] = {
            n: self.methods.labels(n, "out") for n in names
        }
        for n in ("heartbeat",):
            self.methods_in[n] = self.methods.labels(n, "in")
            self.methods_out[n] = self.methods.labels(n, "out")
        self.confirm_ack = self.confirms.labels("ack")
        self.confirm_nack = self.confirms.labels("nack")
        self.delivered_consume = self.deliveries.labels("consume")
        self.delivered_get = self.deliveries.labels("get")

    def error(self, code: int, scope: str) -> None:
        label = str(code) if code in REPLY_NAMES else "other"
        self.errors.labels(label, scope).inc()

    def method_in(self, name: str, n: int = 1) -> None:
        child = self.methods_in.get(name)
        if child is not None:
            child.inc(n)  # type: ignore[attr-defined]

    def method_out(self, name: str, n: int = 1) -> None:
        child = self.methods_out.get(name)
        if child is not None:
            child.inc(n)  # type: ignore[attr-defined]
