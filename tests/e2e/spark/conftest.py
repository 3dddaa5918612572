"""Fixtures for the Spark tests: one local SparkSession per module (start-up costs ~7 s) with
``format("polymq")`` registered, one ``polymq run`` per module (``polymq`` from the e2e
conftest), and readers that look at what reached polymq without going through Spark."""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
import requests
from pyspark.sql import SparkSession

from polymq_spark.session import local_session

from ...procs import PolymqProcess

# local[2, 4]: two cores, and a failed task is tried up to 4 times (plain local[2] never
# retries a task, and the failure-injection tests are about Spark's retries).
MASTER = "local[2,4]"


def unique(prefix: str = "spark") -> str:
    """A destination name no other test uses."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session(
        MASTER,
        app_name="polymq-e2e",
        conf={"spark.sql.session.timeZone": "UTC", "spark.sql.shuffle.partitions": "4"},
    )
    try:
        yield session
    finally:
        session.stop()


def read_stream(polymq: PolymqProcess, name: str, limit: int = 1_000_000) -> list[dict[str, Any]]:
    """Every record of ``stream/<name>`` from the first, read back as Avro containers from the
    Avro frontend and decoded by fastavro (as any Avro consumer would)."""
    out: list[dict[str, Any]] = []
    offset = "first"
    with requests.Session() as http:
        while len(out) < limit:
            r = http.get(
                f"{polymq.url('avro')}/v1/stream/{name}/records",
                params={"offset": offset, "max": "1000"},
                headers={"Accept": "avro/binary"},
                timeout=30,
            )
            if r.status_code == 204:
                break
            assert r.status_code == 200, r.text
            records = list(fastavro.reader(io.BytesIO(r.content)))
            if not records:
                break
            out.extend(records)  # type: ignore[arg-type]
            offset = r.headers["X-Polymq-Next-Offset"]
    return out


def read_stream_json(polymq: PolymqProcess, name: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` messages of ``stream/<name>`` as the frontend describes them in JSON
    (content type, headers, schema id, the record as JSON)."""
    r = requests.get(
        f"{polymq.url('avro')}/v1/stream/{name}/records",
        params={"offset": "first", "max": str(n)},
        headers={"Accept": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()["records"]
    return records


def message_count(polymq: PolymqProcess, kind: str, name: str) -> int:
    """The message count of a destination, from the HTTP frontend's stats (not the Avro
    frontend's own account)."""
    r = requests.get(f"{polymq.url('http')}/v1/{kind}/{name}", timeout=10)
    assert r.status_code == 200, r.text
    return int(r.json()["messages"])


def metric(polymq: PolymqProcess, name: str) -> float:
    """One unlabelled sample of the Avro frontend's /metrics (0 when absent)."""
    text = requests.get(f"{polymq.url('avro')}/metrics", timeout=10).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0
