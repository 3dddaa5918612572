"""Every metric of the STOMP frontend, declared against an injected ``CollectorRegistry``.

Labels are bounded: ``command`` is a STOMP command (or ``HEARTBEAT``), ``direction`` is
``in`` or ``out``, ``transport`` is ``tcp`` or ``ws``, ``reason`` one of :data:`REASONS`.
Sessions count frames locally and add them here once per read or write, not per frame.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from polymq_server.link.connectiongauge import watch_connections
from polymq_server.sessions.frontend import FrontendMetrics

from .frames import Command

REASONS = frozenset(
    {
        "protocol",  # the codec refused the bytes (syntax, sizes, header count)
        "connect",  # frames before CONNECT, a second CONNECT
        "version",  # no common version, malformed accept-version or heart-beat
        "auth",  # login refused
        "forbidden",  # a permission is missing
        "destination",  # an unknown or malformed destination
        "header",  # a malformed header value (priority, ack, prefetch, ...)
        "subscription",  # duplicate id, unknown id, too many, cancelled by the core
        "ack",  # an ACK/NACK id that names no unacknowledged message
        "transaction",  # unknown, duplicate or too large
        "heartbeat",  # the client went silent
        "handshake",  # no CONNECT within the handshake timeout
        "limit",  # a connection limit (the listener's or the user's)
        "slow-consumer",  # the client does not read its topic messages fast enough
        "core",  # the core refused a request (queue full, too large, ...)
        "unavailable",  # no connection to the core
        "shutdown",  # the frontend is stopping
        "closed",  # an administrator closed it (the admin API)
        "internal",  # a bug
    }
)


class StompMetrics(FrontendMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.frames = Counter(
            "polymq_stomp_frames",
            "STOMP frames received (in) and sent (out), by command",
            ["command", "direction"],
            registry=registry,
        )
        self.connections = Gauge(
            "polymq_stomp_connections",
            "Open STOMP connections, by transport",
            ["transport"],
            registry=registry,
        )
        self.connections_opened = Counter(
            "polymq_stomp_connections_opened",
            "STOMP connections accepted, by transport",
            ["transport"],
            registry=registry,
        )
        self.errors = Counter(
            "polymq_stomp_errors",
            "ERROR frames sent (each closes its connection), by reason",
            ["reason"],
            registry=registry,
        )
        self.subscriptions = Gauge(
            "polymq_stomp_subscriptions", "Active STOMP subscriptions", registry=registry
        )
        self.declare_shared(registry, "stomp", "STOMP")  # bytes, core_connected, core_connects
        # children resolved once: a frame costs a dict lookup, not a labels() call
        self.frames_in = {c.value: self.frames.labels(c.value, "in") for c in Command}
        self.frames_in["HEARTBEAT"] = self.frames.labels("HEARTBEAT", "in")
        self.frames_out = {c.value: self.frames.labels(c.value, "out") for c in Command}
        self.frames_out["HEARTBEAT"] = self.frames.labels("HEARTBEAT", "out")
        for reason in REASONS:
            self.errors.labels(reason)
        for transport, listener in (("tcp", "stomp"), ("ws", "stomp_ws")):
            self.connections.labels(transport)
            self.connections_opened.labels(transport)
            # polymq_client_connections{protocol="stomp"} reads them (one name for all)
            watch_connections(
                registry, "stomp", listener, self.connections, {"transport": transport}
            )

    def error(self, reason: str) -> None:
        self.errors.labels(reason if reason in REASONS else "internal").inc()
