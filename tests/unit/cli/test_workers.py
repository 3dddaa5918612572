"""The parts of ``polymq run --workers`` that need no process: how many, and the first
process's ``/metrics`` adding the workers' samples to its own."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from polymq_cli import workers
from polymq_cli.workers import (
    Spec,
    WorkerRegistry,
    families_from_json,
    families_to_json,
    merge_families,
    read_report,
    read_spec,
    report,
    spec_record,
    worker_count,
)


def _registry(connections: float, frames: float, observed: list[float]) -> CollectorRegistry:
    r = CollectorRegistry()
    Gauge("conns", "connections", ["listener"], registry=r).labels("stomp").set(connections)
    Counter("frames", "frames", ["command"], registry=r).labels("SEND").inc(frames)
    h = Histogram("latency", "seconds", buckets=(0.1, 1.0), registry=r)
    for x in observed:
        h.observe(x)
    return r


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


def test_the_first_process_adds_up_its_workers_samples() -> None:
    first = WorkerRegistry()
    Gauge("conns", "connections", ["listener"], registry=first).labels("stomp").set(2)
    Counter("frames", "frames", ["command"], registry=first).labels("SEND").inc(10)
    Histogram("latency", "seconds", buckets=(0.1, 1.0), registry=first).observe(0.05)
    first.snapshots[1] = list(_registry(3, 5, [0.5, 2.0]).collect())
    first.snapshots[2] = list(_registry(1, 1, []).collect())
    got = _samples(generate_latest(first))
    assert got[("conns", (("listener", "stomp"),))] == 6
    assert got[("frames_total", (("command", "SEND"),))] == 16
    assert got[("latency_bucket", (("le", "0.1"),))] == 1
    assert got[("latency_bucket", (("le", "1.0"),))] == 2
    assert got[("latency_bucket", (("le", "+Inf"),))] == 3
    assert got[("latency_count", ())] == 3
    assert got[("latency_sum", ())] == pytest.approx(2.55)
    # each family once: a duplicate would make the exposition invalid for Prometheus
    names = [f.name for f in text_string_to_metric_families(generate_latest(first).decode())]
    assert len(names) == len(set(names))


def test_samples_apart_stay_apart_and_created_is_the_earliest() -> None:
    a = _registry(1, 1, [])
    b = CollectorRegistry()
    Gauge("conns", "connections", ["listener"], registry=b).labels("amqp").set(4)
    Counter("only_in_b", "b's own", registry=b).inc(7)
    merged = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in merge_families([list(a.collect()), list(b.collect())])
        for s in f.samples
    }
    assert merged[("conns", (("listener", "stomp"),))] == 1
    assert merged[("conns", (("listener", "amqp"),))] == 4
    assert merged[("only_in_b_total", ())] == 7
    created = [
        s.value
        for reg in (a, _registry(0, 0, []))
        for f in reg.collect()
        for s in f.samples
        if s.name == "frames_created"
    ]
    both = merge_families([list(a.collect()), list(_registry(0, 0, []).collect())])
    (merged_created,) = [s.value for f in both for s in f.samples if s.name == "frames_created"]
    assert merged_created == min(created)


def test_auto_is_one_process_on_two_cpus_or_fewer(monkeypatch: pytest.MonkeyPatch) -> None:
    for cpus, want in ((1, 1), (2, 1), (3, 3), (16, 16)):
        monkeypatch.setattr(workers, "allowed_cpus", lambda n=cpus: n)
        assert worker_count("auto") == want
        assert worker_count(None) == want
    assert worker_count("4") == 4 and worker_count(1) == 1


@pytest.mark.parametrize("bad", ["0", "-1", "257", "two", "1.5"])
def test_a_bad_count_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--workers"):
        worker_count(bad)


def test_the_cpus_allowed_are_at_least_one() -> None:
    assert 1 <= workers.allowed_cpus() <= 4096


async def test_reports_cross_a_pipe_whole_and_end_at_its_end() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(report("ready", 42) + report("metrics", [1, 2]))
    reader.feed_data(report("x", None)[:3])  # a report cut short: the pipe's end
    reader.feed_eof()
    assert await read_report(reader) == ("ready", 42)
    assert await read_report(reader) == ("metrics", [1, 2])
    assert await read_report(reader) is None


async def test_what_is_not_a_report_is_refused_and_never_unpickled() -> None:
    for data in (b"\x80\x04K\x01.", b"{}", b'["ready"]', b"[1, 2]"):  # a pickle; not reports
        reader = asyncio.StreamReader()
        reader.feed_data(len(data).to_bytes(4, "big") + data)
        reader.feed_eof()
        with pytest.raises(ValueError):
            await read_report(reader)


async def test_a_spec_crosses_to_the_worker() -> None:
    spec = Spec(2, (("polymq_stomp.service:StompService", {"port": 1}),), "INFO")
    reader = asyncio.StreamReader()
    reader.feed_data(spec_record(spec))
    reader.feed_eof()
    assert await read_spec(reader) == spec
    assert await read_spec(reader) is None


def test_metric_families_survive_json() -> None:
    families = list(_registry(3, 5, [0.5, 2.0]).collect())
    back = families_from_json(json.loads(json.dumps(families_to_json(families))))
    assert [(f.name, f.type, f.documentation) for f in back] == [
        (f.name, f.type, f.documentation) for f in families
    ]
    assert [[(s.name, s.labels, s.value) for s in f.samples] for f in back] == [
        [(s.name, s.labels, s.value) for s in f.samples] for f in families
    ]
    with pytest.raises(ValueError):
        families_from_json([["x", "h", "counter"]])
