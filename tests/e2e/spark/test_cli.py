"""``python -m polymq_spark.cli`` (what ``polymq spark-push`` runs): a Parquet file to a stream
through its own local Spark, as a user runs it; and a failed push's exit status."""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ...procs import PolymqProcess
from .conftest import message_count, read_stream, unique

pytestmark = pytest.mark.timeout(240)
UTC = dt.UTC
T0 = dt.datetime(2024, 5, 1, tzinfo=UTC)


def spark_push(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymq_spark.cli", "--master", "local[2]", *args],
        capture_output=True,
        text=True,
        timeout=200,
    )


def test_spark_push_of_a_parquet_file(polymq: PolymqProcess, tmp_path: Path) -> None:
    rows = 1000
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "city": [f"city-{i % 17}" for i in range(rows)],
            "temp": [i / 8 for i in range(rows)],
            "at": pa.array(
                [T0 + dt.timedelta(seconds=i) for i in range(rows)], pa.timestamp("us", "UTC")
            ),
        }
    )
    data = tmp_path / "readings.parquet"
    pq.write_table(table, data)
    name = unique("push")

    r = spark_push("--input", str(data), "--destination", f"stream/{name}",
                   "--url", polymq.url("avro"), "--batch-size", "300")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["rows"] == rows and summary["duplicates"] == 0
    assert summary["format"] == "parquet" and summary["destination"] == f"stream/{name}"
    assert summary["batches"] >= 4 and summary["rows_per_second"] > 0  # 300 rows per POST

    assert message_count(polymq, "stream", name) == rows
    got = sorted(read_stream(polymq, name), key=lambda rec: rec["id"])
    assert got == [
        {"id": i, "city": f"city-{i % 17}", "temp": i / 8, "at": T0 + dt.timedelta(seconds=i)}
        for i in range(rows)
    ]


def test_spark_push_to_nobody_fails_with_status_1(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "d.parquet"  # Parquet carries its schema: no inference job to wait for
    pq.write_table(pa.table({"a": [1, 2]}), data)
    r = spark_push("--input", str(data), "--destination", "queue/q",
                   "--url", f"http://127.0.0.1:{port}",
                   "--option", "retries=1", "--option", "retryBackoff=0")  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert "DeliveryError" in last and "failed 2 time(s)" in last and "Connection refused" in last
