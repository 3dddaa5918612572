"""Every metric of the Avro frontend, declared against an injected ``CollectorRegistry``.

Labels are bounded: ``route`` is the route's template (``/v1/{kind}/{name}/records``) or
``unmatched``, ``method`` one of the methods the API uses or ``other``, ``status`` the code,
``direction`` ``in`` (published) or ``out`` (read), ``outcome`` a fixed word, ``op`` a
registry operation.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from polymq_server.web.requestmetrics import RequestMetrics

BATCH_OUTCOMES = ("published", "duplicate", "rejected", "failed")


class AvroMetrics(RequestMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(
            registry,
            "avro",
            requests="HTTP requests answered, by route template and status",
            duration="Time to answer one HTTP request (waiting reads included)",
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
        self.core_link_metrics(registry)
        for outcome in BATCH_OUTCOMES:
            self.batches.labels(outcome)
        for direction in ("in", "out"):
            self.records.labels(direction)
            self.bytes.labels(direction)
