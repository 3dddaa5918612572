"""`make bench` must keep working: a quick run writes one JSON with every scenario in it.

This checks the harness, not the figures: performance is read from `make bench`, never
asserted by a timed test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = {
    "native_transient_queue",
    "native_persistent_queue_receipts",
    "topic_fanout_100",
    "idle_subscriptions_1m",
    "http_batch_publish_pull",
    "longpoll_deliveries",
    "longpoll_latency_fixed_rate",
    "longpoll_fanout_10k",
    "stomp_connections_10k",
    "avro",  # raw container ingest, then Spark's format("polymq") (~40 s with Spark's start)
    "metrics_scrape_per_destination",
    "scaling",  # polymq run --workers 1 and N (on this machine's CPUs)
}
# Measured against RabbitMQ's STOMP plugin too; polymq's side must always have a figure (the
# RabbitMQ side may be recorded as skipped where none can be started).
STOMP_SCENARIOS = {
    "stomp_queue_tcp",
    "stomp_queue_ws",
    "stomp_fanout_10",
    "stomp_latency_fixed_rate",
    "amqp",  # the ratio to RabbitMQ (aio-pika and a pamqp load generator)
}
# Three polymq nodes against one and against RabbitMQ quorum queues (a three-node RabbitMQ
# the bench starts; recorded as skipped where it cannot): the replicated cells and the failover
# must have figures. Not every cell: on a small machine a shard's leader may move under load,
# and the cell it fails is recorded as failed (with the error) in the JSON, which is the news.
CLUSTER = "cluster"


@pytest.mark.timeout(610)
def test_quick_bench_writes_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--no-pin", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["machine"]["cpu_count"] >= 1
    by_name = {s["name"]: s for s in doc["scenarios"]}
    assert SCENARIOS | STOMP_SCENARIOS | {CLUSTER} <= set(by_name)
    for name in SCENARIOS:
        s = by_name[name]
        assert "error" not in s, (name, s.get("error"))
        assert isinstance(s["value"], int | float) and s["value"] > 0, (name, s)
    for name in STOMP_SCENARIOS:
        s = by_name[name]
        assert isinstance(s["value"], int | float) and s["value"] > 0, (name, s)
    c = by_name[CLUSTER]
    cells = c.get("cells", [])
    replicated = [x for x in cells if x["system"] == "polymq_cluster" and x["status"] == "ok"]
    assert replicated, (c.get("error"), c.get("traceback"), cells)
    assert all(x["msg_per_s"] > 0 and x["latency_p99_ms"] > 0 for x in replicated), replicated
    recovered = [r for r in c["failover"] if r["status"] == "ok"]
    assert recovered and all(r["failover_s"] > 0 for r in recovered), c["failover"]
