"""format("polymq") end to end: a real local Spark writes through a real ``polymq run`` and the
messages are read back from polymq itself (Avro frontend reads, HTTP frontend stats, metrics).

One SparkSession (local[2,4]: failed tasks are retried) and one polymq per module."""

from __future__ import annotations

import datetime as dt
import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from ...procs import PolymqProcess
from .conftest import message_count, metric, read_stream, read_stream_json, unique

pytestmark = pytest.mark.timeout(240)

EPOCH_US = 1_700_000_000_000_000
UTC = dt.UTC


def summaries(path: Path) -> list[dict[str, Any]]:
    """What commit/abort wrote to summaryFile, one dict per event."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def events_frame(spark: SparkSession, n: int, partitions: int) -> DataFrame:
    """``n`` rows whose every value follows from ``id`` (see :func:`expected`)."""
    return spark.range(n, numPartitions=partitions).select(
        F.col("id"),
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") * 0.25).alias("value"),
        F.timestamp_micros(F.lit(EPOCH_US) + F.col("id") * 1_000_003).alias("at"),
        F.when(F.col("id") % 7 == 0, F.lit(None)).otherwise(F.col("id") * 3).alias("maybe"),
        F.expr("CAST(id / 4 AS DECIMAL(12, 2))").alias("price"),
        F.expr("date_add(DATE'2000-01-01', CAST(id % 10000 AS INT))").alias("day"),
        F.struct(
            (F.col("id") % 4).cast("int").alias("part"), (F.col("id") % 2 == 0).alias("even")
        ).alias("meta"),
    )


def expected(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"row-{i}",
        "value": i * 0.25,
        "at": dt.datetime(1970, 1, 1, tzinfo=UTC)
        + dt.timedelta(microseconds=EPOCH_US + i * 1_000_003),
        "maybe": None if i % 7 == 0 else i * 3,
        "price": (Decimal(i) / 4).quantize(Decimal("0.01")),
        "day": dt.date(2000, 1, 1) + dt.timedelta(days=i % 10000),
        "meta": {"part": i % 4, "even": i % 2 == 0},
    }


def polymq_writer(df: DataFrame, polymq: PolymqProcess, destination: str, summary: Path) -> Any:
    return (
        df.write.format("polymq")
        .option("url", polymq.url("avro"))
        .option("destination", destination)
        .option("summaryFile", str(summary))
        .mode("append")
    )


def test_100k_rows_become_100k_messages_with_their_values(
    spark: SparkSession, polymq: PolymqProcess, tmp_path: Path
) -> None:
    name = unique("events")
    summary = tmp_path / "summary.jsonl"
    polymq_writer(events_frame(spark, 100_000, 4), polymq, f"stream/{name}", summary).save()

    [commit] = summaries(summary)
    assert commit["event"] == "commit"
    assert (commit["rows"], commit["batches"], commit["duplicates"]) == (100_000, 20, 0)
    assert commit["failed_tasks"] == 0 and commit["retried_tasks"] == 0
    assert message_count(polymq, "stream", name) == 100_000

    records = read_stream(polymq, name)
    assert len(records) == 100_000
    ids = [r["id"] for r in records]
    assert set(ids) == set(range(100_000))  # with the length: each exactly once
    assert sum(r["value"] for r in records) == sum(i * 0.25 for i in range(100_000))
    wrong = [r for r in records if r != expected(r["id"])]
    assert wrong == [], (
        f"{len(wrong)} records differ, e.g. {wrong[0]} vs {expected(wrong[0]['id'])}"
    )

    # each record is one Avro message: single-object encoding of the schema the write used
    [schema_id] = commit["schema_ids"]
    for m in read_stream_json(polymq, name, 5):
        assert m["content_type"] == "avro/binary"
        assert m["headers"]["avro-schema-id"] == m["schema_id"] == schema_id
        assert m["value"]["name"] == f"row-{m['value']['id']}"


def test_a_task_that_fails_midway_is_retried_without_duplicates(
    spark: SparkSession, polymq: PolymqProcess, tmp_path: Path
) -> None:
    """Each task's first attempt POSTs 2 of its 5 batches and dies (failAfterBatches); Spark
    tries it again, which POSTs all 5 under the same batch ids: the first 2 are answered as
    duplicates and publish nothing."""
    name = unique("retry")
    summary = tmp_path / "summary.jsonl"
    suppressed = metric(polymq, "polymq_avro_duplicate_records_suppressed_total")
    df = events_frame(spark, 20_000, 4)
    writer = polymq_writer(df, polymq, f"stream/{name}", summary)
    writer.option("batchSize", "1000").option("failAfterBatches", "2").save()

    [commit] = summaries(summary)
    # the retries really happened: every task succeeded on attempt 1, re-sending 2 batches
    assert commit["retried_tasks"] == 4
    assert [p["attempt"] for p in commit["partitions"]] == [1, 1, 1, 1]
    assert [p["duplicates"] for p in commit["partitions"]] == [2, 2, 2, 2]
    assert (commit["rows"], commit["batches"]) == (20_000, 20)
    # ... and the frontend saw them as duplicates (8 batches of 1,000 records not published)
    assert metric(polymq, "polymq_avro_duplicate_records_suppressed_total") - suppressed == 8000

    assert message_count(polymq, "stream", name) == 20_000
    ids = sorted(r["id"] for r in read_stream(polymq, name))
    assert ids == list(range(20_000))


def test_queue_and_topic_destinations(
    spark: SparkSession, polymq: PolymqProcess, tmp_path: Path
) -> None:
    queue = unique("q")
    # declared first: an undeclared queue lives only while it holds something, so once
    # emptied it may be evicted (and its stats answer 404) before the last check
    declared = requests.put(f"{polymq.url('http')}/v1/queue/{queue}", timeout=10)
    assert declared.status_code == 200, declared.text
    df = events_frame(spark, 250, 2)
    polymq_writer(df, polymq, f"queue/{queue}", tmp_path / "q.jsonl").option(
        "persistent", "false"
    ).save()
    assert message_count(polymq, "queue", queue) == 250
    r = requests.get(
        f"{polymq.url('avro')}/v1/queue/{queue}/records",
        params={"max": "1000"},
        headers={"Accept": "application/json"},
        timeout=10,
    )
    leased = r.json()["records"]
    assert sorted(m["value"]["id"] for m in leased) == list(range(250))
    receipts = [m["receipt"] for m in leased]
    ack = requests.post(f"{polymq.url('avro')}/v1/ack", json={"receipts": receipts}, timeout=10)
    assert ack.json()["settled"] == 250
    assert message_count(polymq, "queue", queue) == 0

    # a topic with no subscriber takes the records (and drops them): the write succeeds;
    # save(path) names the destination too
    topic_summary, topic = tmp_path / "t.jsonl", f"topic/{unique('t')}"
    df.write.format("polymq").option("url", polymq.url("avro")).option(
        "summaryFile", str(topic_summary)
    ).mode("append").save(topic)
    [commit] = summaries(topic_summary)
    assert (commit["destination"], commit["rows"]) == (topic, 250)


def test_a_rerun_with_the_same_write_id_publishes_nothing_twice(
    spark: SparkSession, polymq: PolymqProcess, tmp_path: Path
) -> None:
    """A whole job run again (say after the driver died) with the writeId of the first run
    sends the same batch ids: within the frontend's window, nothing is published twice."""
    name = unique("rerun")
    summary = tmp_path / "summary.jsonl"
    for _ in range(2):
        writer = polymq_writer(events_frame(spark, 3000, 3), polymq, f"stream/{name}", summary)
        writer.option("writeId", f"nightly-{name}").option("batchSize", "400").save()
    first, second = summaries(summary)
    assert first["write_id"] == second["write_id"] == f"nightly-{name}"
    assert (first["batches"], first["duplicates"]) == (9, 0)
    assert (second["batches"], second["duplicates"]) == (9, 9)
    assert message_count(polymq, "stream", name) == 3000


def test_bad_options_and_types_fail_before_any_task(
    spark: SparkSession, polymq: PolymqProcess, tmp_path: Path
) -> None:
    df = events_frame(spark, 10, 1)
    url = polymq.url("avro")
    with pytest.raises(PySparkException, match="polymq option 'destination'"):
        df.write.format("polymq").option("url", url).mode("append").save()
    with pytest.raises(PySparkException, match="polymq option 'batchSize'"):
        (
            df.write.format("polymq")
            .option("url", url)
            .option("destination", "stream/x")
            .option("batchSize", "0")
            .mode("append")
            .save()
        )
    spans = df.select(F.expr("make_dt_interval(1, 2, 3, 4)").alias("span"))
    with pytest.raises(PySparkException, match=r"column 'span'.*no Avro mapping"):
        polymq_writer(spans, polymq, f"stream/{unique()}", tmp_path / "s.jsonl").save()
    with pytest.raises(PySparkException, match="overwrite is not supported"):
        polymq_writer(df, polymq, "stream/x", tmp_path / "o.jsonl").mode("overwrite").save()


def test_a_refused_batch_fails_the_write_with_the_servers_reason(
    spark: SparkSession, polymq: PolymqProcess, tmp_path: Path
) -> None:
    """A destination the core refuses (a name with a character it does not allow) is a 4xx:
    not retried, the job fails and abort reports it."""
    summary = tmp_path / "summary.jsonl"
    df = events_frame(spark, 10, 1)
    with pytest.raises(PySparkException, match=r"refused: HTTP 4\d\d"):
        polymq_writer(df, polymq, "stream/bad name*#", summary).option("retries", "0").save()
    [abort] = summaries(summary)
    assert abort["event"] == "abort" and abort["rows"] == 0


# ---- Structured Streaming --------------------------------------------------------------------
def write_json_files(folder: Path, files: int, rows: int) -> None:
    folder.mkdir(parents=True)
    for f in range(files):
        lines = (json.dumps({"id": f * rows + i, "word": f"w{f}-{i}"}) for i in range(rows))
        (folder / f"part-{f}.json").write_text("\n".join(lines) + "\n")
        time.sleep(0.01)  # distinct modification times: files are taken oldest first


def start_stream(
    spark: SparkSession,
    polymq: PolymqProcess,
    source: Path,
    checkpoint: Path,
    destination: str,
    summary: Path,
    **options: str,
) -> StreamingQuery:
    writer = (
        spark.readStream.schema("id LONG, word STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("polymq")
        .option("url", polymq.url("avro"))
        .option("destination", destination)
        .option("batchSize", "1000")
        .option("summaryFile", str(summary))
        .option("checkpointLocation", str(checkpoint))
        .options(**options)
        .trigger(availableNow=True)
    )
    return writer.start()


def finish(q: StreamingQuery) -> None:
    assert q.awaitTermination(timeout=150), "the streaming query did not finish"
    assert q.exception() is None, q.exception()


def test_streaming_rows_arrive_once_through_task_retries_and_a_rerun_micro_batch(
    spark: SparkSession, polymq: PolymqProcess, tmp_path: Path
) -> None:
    name = unique("stream")
    source, checkpoint, summary = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "s.jsonl"
    write_json_files(source, files=3, rows=2500)

    # 3 micro-batches of one file; each task fails on attempt 0 after its first batch
    q = start_stream(spark, polymq, source, checkpoint, f"stream/{name}", summary,
                     failAfterBatches="1")  # fmt: skip
    finish(q)
    commits = summaries(summary)
    assert [c["micro_batch"] for c in commits] == [0, 1, 2]
    for c in commits:
        assert (c["rows"], c["batches"], c["duplicates"], c["retried_tasks"]) == (2500, 3, 1, 1)
        # batch ids are <query id>-<micro-batch id>-<partition>-<i>
        assert c["prefixes"] == [f"{q.id}-{c['micro_batch']}"]
    assert message_count(polymq, "stream", name) == 7500
    assert sorted(r["id"] for r in read_stream(polymq, name)) == list(range(7500))

    # The driver dies after micro-batch 2 was written but before it was committed: remove its
    # commit-log entry, and Spark runs micro-batch 2 again from the same checkpoint.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    again = start_stream(spark, polymq, source, checkpoint, f"stream/{name}", summary)
    finish(again)
    assert again.id == q.id  # the checkpoint's query id: the same batch ids
    rerun = summaries(summary)[3:]
    assert [c["micro_batch"] for c in rerun] == [2]
    assert (rerun[0]["rows"], rerun[0]["batches"], rerun[0]["duplicates"]) == (2500, 3, 3)
    assert message_count(polymq, "stream", name) == 7500
    assert sorted(r["id"] for r in read_stream(polymq, name)) == list(range(7500))
