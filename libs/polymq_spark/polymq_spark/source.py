"""The data source: ``spark.dataSource.register(PolymqDataSource)``, then
``df.write.format("polymq").option("url", ...).option("destination", "stream/x").save()``
or ``df.writeStream.format("polymq")...start()``.

Where things run (PySpark 4's Python data sources): :meth:`PolymqDataSource.writer` runs once
per write in a Python worker on the driver, which pickles the writer to every task; ``write``
runs in the tasks; ``commit``/``abort`` run on the driver again. So the write id drawn in
:class:`PolymqWriter`'s constructor is the same in every task and in every attempt of a task.

A streaming writer is made once per query run, so it cannot hold a per-micro-batch id: its
tasks read the micro-batch id and the query id from the local properties Spark gives every
task of a micro-batch (``streaming.sql.batchId``, ``sql.streaming.queryId``; the query id is
the one stored in the checkpoint, kept across restarts). A micro-batch that is run again after
a restart (written, then the query died before committing it) sends the same batch ids.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from .errors import OptionError, PolymqSparkError
from .options import WriteOptions, parse_options
from .schema import AvroSchema, avro_schema
from .task import summarize, write_partition

__all__ = ["PolymqDataSource", "PolymqStreamWriter", "PolymqWriter"]

log = logging.getLogger(__name__)

# The task-local properties Spark sets for every job of a micro-batch
# (MicroBatchExecution.BATCH_ID_KEY and StreamExecution.QUERY_ID_KEY).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


class PolymqDataSource(DataSource):
    """Format ``"polymq"``: writes rows as Avro records to polymq's Avro frontend (see
    :mod:`polymq_spark.options` for the options)."""

    @classmethod
    def name(cls) -> str:
        return "polymq"

    def writer(self, schema: StructType, overwrite: bool) -> PolymqWriter:
        if overwrite:
            raise OptionError(
                "mode", "overwrite is not supported: polymq only appends; use mode('append')"
            )
        return PolymqWriter(parse_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PolymqStreamWriter:
        return PolymqStreamWriter(parse_options(self.options), schema)


class _Writer:
    """What both writers share: the options, the Avro schema (derived on the driver, so an
    unsupported column fails the write before any task starts) and the summary."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.avro: AvroSchema = avro_schema(schema, options.record_name, options.namespace)

    def _task(self) -> TaskContext:
        ctx = TaskContext.get()
        if ctx is None:
            raise PolymqSparkError("write() must run inside a Spark task")
        return ctx

    def _finish(
        self,
        event: str,
        messages: list[WriterCommitMessage | None],
        seconds: float | None,
        **ids: Any,
    ) -> dict[str, Any]:
        summary = {
            "event": event,
            "destination": self.options.destination,
            **ids,
            **summarize(messages),
        }
        if seconds is None:  # a micro-batch: its slowest task is what we know of its length
            seconds = float(summary["task_seconds_max"])
        summary["seconds"] = round(seconds, 3)
        level = logging.INFO if event == "commit" else logging.WARNING
        log.log(
            level,
            "polymq %s to %s (%s): %d rows in %d batches from %d tasks, %d duplicate batches "
            "(retried tasks: %d), %d HTTP retries, %d failed tasks, %.1fs",
            event,
            self.options.destination,
            " ".join(f"{k}={v}" for k, v in ids.items()),
            summary["rows"],
            summary["batches"],
            summary["tasks"],
            summary["duplicates"],
            summary["retried_tasks"],
            summary["retries"],
            summary["failed_tasks"],
            seconds,
        )
        if self.options.summary_file:
            line = json.dumps(summary, default=str) + "\n"
            with Path(self.options.summary_file).open("a", encoding="utf-8") as f:
                f.write(line)
        return summary


class PolymqWriter(_Writer, DataSourceArrowWriter):
    """A batch write: batch ids ``<write id>-<partition>-<i>``."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self.write_id = options.write_id or uuid.uuid4().hex
        self.started = time.time()  # pickled along: commit measures the whole write

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = self._task()
        return write_partition(
            self.options,
            self.avro,
            iterator,
            prefix=self.write_id,
            partition=ctx.partitionId(),
            attempt=ctx.attemptNumber(),
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._finish("commit", messages, time.time() - self.started, write_id=self.write_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What the successful tasks delivered stays delivered: a message gateway has no
        # transaction to roll back. Re-running with the same writeId within the frontend's
        # batch window re-sends the same batch ids, so it publishes only what is missing.
        self._finish("abort", messages, time.time() - self.started, write_id=self.write_id)


class PolymqStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """A streaming write: batch ids ``<query id>-<micro-batch id>-<partition>-<i>``."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = self._task()
        micro_batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        query = self.options.query_id or ctx.getLocalProperty(QUERY_ID_PROPERTY)
        if micro_batch is None or query is None:
            raise PolymqSparkError(
                f"no {BATCH_ID_PROPERTY}/{QUERY_ID_PROPERTY} in the task's local properties: "
                "a polymq stream writer runs only in a micro-batch query"
            )
        return write_partition(
            self.options,
            self.avro,
            iterator,
            prefix=f"{query}-{micro_batch}",
            partition=ctx.partitionId(),
            attempt=ctx.attemptNumber(),
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._finish("commit", messages, None, micro_batch=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._finish("abort", messages, None, micro_batch=batchId)
