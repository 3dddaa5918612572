"""One task's work (polymq_spark.task.write_partition) against a recording transport:
batching by batchSize whatever Arrow's chunks, deterministic batch ids, the failAfterBatches
hook, and the summary commit builds."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from polymq_spark.delivery import Answer
from polymq_spark.errors import InjectedFailure
from polymq_spark.options import parse_options
from polymq_spark.schema import avro_schema
from polymq_spark.task import PartitionReport, summarize, write_partition

SCHEMA = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])
AVRO = avro_schema(SCHEMA)


@dataclass
class Recorder:
    """Accepts every batch; answers duplicate for a key it has seen (as the frontend does)."""

    seen: set[str] = field(default_factory=set)
    posts: list[tuple[str, list[int]]] = field(default_factory=list)

    def post(self, target: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        key = headers["Idempotency-Key"]
        records: list[Any] = list(fastavro.reader(io.BytesIO(body)))
        ids = [int(r["id"]) for r in records]
        self.posts.append((key, ids))
        dup = key in self.seen
        self.seen.add(key)
        doc = {"count": len(ids), "schema_id": 1, "duplicate": dup}
        return Answer(200, {}, json.dumps(doc).encode())

    def close(self) -> None:
        pass


def chunks(n: int, sizes: list[int]) -> list[pa.RecordBatch]:
    """Rows 0..n-1 cut into Arrow batches of the given sizes (the last takes the rest)."""
    out, start = [], 0
    for size in [*sizes, n]:
        stop = min(n, start + size)
        if stop > start:
            ids = list(range(start, stop))
            out.append(pa.RecordBatch.from_pydict({"id": ids, "s": [str(i) for i in ids]}))
        start = stop
    return out


def run(
    batches: list[pa.RecordBatch], t: Recorder, attempt: int = 0, **opts: str
) -> PartitionReport:
    o = parse_options({"url": "http://127.0.0.1:1", "destination": "stream/s", **opts})
    return write_partition(o, AVRO, iter(batches), "wid", partition=3, attempt=attempt, transport=t)


@pytest.mark.parametrize("sizes", [[], [1], [4, 4, 4], [3, 7], [11, 1]])
def test_rows_are_cut_into_batch_size_whatever_arrows_chunks(sizes: list[int]) -> None:
    t = Recorder()
    report = run(chunks(12, sizes), t, batchSize="5")
    assert t.posts == [
        ("wid-3-0", [0, 1, 2, 3, 4]),
        ("wid-3-1", [5, 6, 7, 8, 9]),
        ("wid-3-2", [10, 11]),
    ]
    assert (report.rows, report.batches, report.duplicates, report.partition) == (12, 3, 0, 3)
    assert report.first_batch_id == "wid-3-0" and report.prefix == "wid" and report.bytes > 0


def test_an_empty_partition_posts_nothing() -> None:
    t = Recorder()
    report = run([], t)
    assert t.posts == [] and report.rows == 0 and report.batches == 0


def test_fail_after_batches_fails_attempt_0_only_and_the_retry_is_all_duplicates_first() -> None:
    t = Recorder()
    with pytest.raises(InjectedFailure, match="after 2 batch"):
        run(chunks(12, []), t, attempt=0, batchSize="5", failAfterBatches="2")
    assert [k for k, _ in t.posts] == ["wid-3-0", "wid-3-1"]
    report = run(chunks(12, [5]), t, attempt=1, batchSize="5", failAfterBatches="2")
    assert [k for k, _ in t.posts[2:]] == ["wid-3-0", "wid-3-1", "wid-3-2"]
    assert (report.attempt, report.batches, report.duplicates, report.rows) == (1, 3, 2, 12)


def test_fail_after_zero_batches_fails_before_posting() -> None:
    t = Recorder()
    with pytest.raises(InjectedFailure):
        run(chunks(3, []), t, failAfterBatches="0")
    assert t.posts == []


def test_summary() -> None:
    a = PartitionReport(
        partition=1, attempt=0, prefix="w", rows=10, batches=2, bytes=100, schema_id=5
    )
    b = PartitionReport(
        partition=0, attempt=1, prefix="w", rows=5, batches=1, duplicates=1, retries=2
    )
    s = summarize([a, None, b])
    assert (s["rows"], s["batches"], s["duplicates"], s["retries"], s["bytes"]) == (
        15,
        3,
        1,
        2,
        100,
    )
    assert (s["tasks"], s["failed_tasks"], s["retried_tasks"]) == (3, 1, 1)
    assert s["schema_ids"] == ["5"] and s["prefixes"] == ["w"]
    assert [p["partition"] for p in s["partitions"]] == [0, 1]
