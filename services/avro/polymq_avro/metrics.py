"""Every metric of the Avro frontend, declared against an injected ``CollectorRegistry``.

Labels are bounded: ``route`` is the route's template (``/v1/{kind}/{name}/records``) or
``unmatched``, ``method`` one of the methods the API uses or ``other``, ``status`` the code,
``direction`` ``in`` (published) or ``out`` (read), ``outcome`` a fixed word, ``op`` a
registry operation.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from polymq_http.metrics import method_label

BATCH_OUTCOMES = ("published", "duplicate", "rejected", "failed")


class AvroMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "polymq_avro_requests",
            "HTTP requests answered, by route template and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "polymq_avro_request_duration_seconds",
            "Time to answer one HTTP request (waiting reads included)",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.in_flight = Gauge(
            "polymq_avro_requests_in_flight", "HTTP requests being answered", registry=registry
        )
        self.records = Counter(
            "polymq_avro_records",
            "Avro records published (in) and read (out)",
            ["direction"],
            registry=registry,
        )
        self.bytes = Counter(
            "polymq_avro_bytes",
            "Bytes of Avro request bodies taken (in) and of record answers sent (out)",
            ["direction"],
            registry=registry,
        )
        self.batches = Counter(
            "polymq_avro_batches",
            "POSTed batches of records, by outcome: published, duplicate (a retry answered "
            "from the first), rejected (invalid, nothing published), failed (the core refused)",
            ["outcome"],
            registry=registry,
        )
        self.duplicates = Counter(
            "polymq_avro_duplicate_records_suppressed",
            "Records of retried batches that were not published again",
            registry=registry,
        )
        self.schema_ops = Counter(
            "polymq_avro_schema_operations",
            "Schema registry operations, by operation and outcome",
            ["op", "outcome"],
            registry=registry,
        )
        self.core_connected = Gauge(
            "polymq_avro_core_connected",
            "1 while the frontend holds a connection to the core, else 0",
            registry=registry,
        )
        self.core_connects = Counter(
            "polymq_avro_core_connects",
            "Connections made to the core (a reconnect counts again)",
            registry=registry,
        )
        for outcome in BATCH_OUTCOMES:
            self.batches.labels(outcome)
        for direction in ("in", "out"):
            self.records.labels(direction)
            self.bytes.labels(direction)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        m = method_label(method)
        self.requests.labels(m, route, str(status)).inc()
        self.duration.labels(m, route).observe(seconds)
