"""What one Spark task does: cut its partition into batches of ``batchSize`` rows, encode each
as an Avro container and POST it under a deterministic batch id ``<prefix>-<partition>-<i>``.

The prefix is the write id (batch writes) or ``<query id>-<micro-batch id>`` (streaming), so
every attempt of a task, and a re-run of a micro-batch, sends the same rows under the same ids:
the frontend answers a batch id it has already seen as a duplicate without publishing again.
This relies on the partition's rows coming in the same order on every attempt, which holds
for Spark's deterministic plans (files, ``range``, sorted or hash-partitioned data); a
partition computed from a non-deterministic source (``rand()``, ``limit`` without order)
may differ between attempts, and then only at-least-once holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from .delivery import HttpTransport, Poster, Transport
from .encoding import Record, arrow_to_records, encode_container, parse_schema
from .errors import InjectedFailure
from .options import WriteOptions
from .schema import AvroSchema

__all__ = ["PartitionReport", "summarize", "write_partition"]


@dataclass
class PartitionReport(WriterCommitMessage):
    """One successful task's account, sent to the driver's commit."""

    partition: int
    attempt: int  # Spark's attempt number of the task that succeeded (0: first try)
    prefix: str = ""  # batch ids are <prefix>-<partition>-<i>
    rows: int = 0
    batches: int = 0
    duplicates: int = 0  # batches the frontend had already (a retried task re-sending them)
    retries: int = 0  # POSTs repeated after a 5xx or a connection error
    bytes: int = 0  # container bytes sent
    seconds: float = 0.0  # the whole task: the rest of it is Spark computing the rows
    encode_seconds: float = 0.0  # Arrow to records, records to Avro containers
    post_seconds: float = 0.0  # waiting for the frontend's answers (retries included)
    first_batch_id: str | None = None
    schema_id: Any = None


def write_partition(
    options: WriteOptions,
    schema: AvroSchema,
    batches: Iterator[pa.RecordBatch],
    prefix: str,
    partition: int,
    attempt: int,
    transport: Transport | None = None,
) -> PartitionReport:
    """Deliver every row of ``batches``; raises :class:`~polymq_spark.errors.PolymqSparkError`
    subclasses (a refused or undeliverable batch, a row that does not fit, the test hook)."""
    t0 = time.monotonic()
    report = PartitionReport(partition=partition, attempt=attempt, prefix=prefix)
    parsed = parse_schema(schema)
    poster = Poster(options, transport or HttpTransport(options.url, options.timeout))
    size = options.batch_size

    def flush(records: list[Record]) -> None:
        batch_id = f"{prefix}-{partition}-{report.batches}"
        t = time.monotonic()
        body = encode_container(parsed, records, options.codec)
        t1 = time.monotonic()
        receipt = poster.post(batch_id, body, len(records))
        report.encode_seconds += t1 - t
        report.post_seconds += time.monotonic() - t1
        if report.first_batch_id is None:
            report.first_batch_id = batch_id
        report.batches += 1
        report.rows += len(records)
        report.bytes += len(body)
        report.duplicates += receipt.duplicate
        report.schema_id = receipt.schema_id
        _maybe_fail(options, report)

    try:
        _maybe_fail(options, report)
        pending: list[Record] = []
        for rb in batches:
            offset = 0
            while offset < rb.num_rows:
                take = min(size - len(pending), rb.num_rows - offset)
                t = time.monotonic()
                pending.extend(arrow_to_records(rb.slice(offset, take)))
                report.encode_seconds += time.monotonic() - t
                offset += take
                if len(pending) == size:
                    flush(pending)
                    pending = []
        if pending:
            flush(pending)
    finally:
        report.retries = poster.retried
        poster.close()
    report.seconds = round(time.monotonic() - t0, 3)
    report.encode_seconds = round(report.encode_seconds, 3)
    report.post_seconds = round(report.post_seconds, 3)
    return report


def _maybe_fail(options: WriteOptions, report: PartitionReport) -> None:
    """The ``failAfterBatches`` test hook: only on attempt 0, so Spark's retry succeeds."""
    n = options.fail_after_batches
    if n is not None and report.attempt == 0 and report.batches == n:
        raise InjectedFailure(
            f"failAfterBatches={n}: partition {report.partition} fails on attempt 0 after "
            f"{report.batches} batch(es) (a test hook)"
        )


def summarize(messages: list[WriterCommitMessage | None]) -> dict[str, Any]:
    """What commit/abort log and write to ``summaryFile``: totals and one entry per task."""
    reports = [m for m in messages if isinstance(m, PartitionReport)]
    schema_ids = {str(r.schema_id) for r in reports if r.schema_id is not None}
    return {
        "rows": sum(r.rows for r in reports),
        "batches": sum(r.batches for r in reports),
        "duplicates": sum(r.duplicates for r in reports),
        "retries": sum(r.retries for r in reports),
        "bytes": sum(r.bytes for r in reports),
        "tasks": len(messages),
        "failed_tasks": sum(1 for m in messages if m is None),
        "retried_tasks": sum(1 for r in reports if r.attempt > 0),
        "schema_ids": sorted(schema_ids),
        "prefixes": sorted({r.prefix for r in reports}),
        "task_seconds_max": max((r.seconds for r in reports), default=0.0),
        "task_seconds": round(sum(r.seconds for r in reports), 3),
        "encode_seconds": round(sum(r.encode_seconds for r in reports), 3),
        "post_seconds": round(sum(r.post_seconds for r in reports), 3),
        "partitions": [asdict(r) for r in sorted(reports, key=lambda r: r.partition)],
    }
