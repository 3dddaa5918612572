"""The core's /metrics beyond the totals (test_admin.py): the one gauge of client connections
by protocol, the resource alarms' measures and limits, and the per-destination figures that
POLYMQ_METRICS_PER_DESTINATION turns on, with their cap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from polymq import Message

from ...procs import PolymqProcess
from .helpers import collect, connect, uid

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _scrape(proc: PolymqProcess) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(f"{proc.url('admin')}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _of(samples: Samples, name: str) -> dict[str, float]:
    """``name``'s samples by their destination label."""
    return {dict(labels)["destination"]: v for (n, labels), v in samples.items() if n == name}


@pytest.fixture(scope="module")
def per_destination(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    env = {"POLYMQ_METRICS_PER_DESTINATION": "true", "POLYMQ_METRICS_MAX_DESTINATIONS": "4"}
    workdir: Path = tmp_path_factory.mktemp("metrics")
    with PolymqProcess("core", workdir, env=env) as proc:
        yield proc


async def test_native_connections_and_the_alarms_measures(core: PolymqProcess) -> None:
    before = await _scrape(core)
    key = ("polymq_client_connections", (("listener", "core"), ("protocol", "native")))
    assert before[key] == 0
    async with await connect(core.ports["core"]), await connect(core.ports["core"]):
        during = await _scrape(core)
    assert during[key] == 2
    assert during[("polymq_connections", (("protocol", "native"),))] == 2  # the one it reads
    assert during[("polymq_memory_resident_bytes", ())] > 1_000_000
    assert (
        during[("polymq_memory_high_watermark_bytes", ())]
        > during[("polymq_memory_resident_bytes", ())]
    )
    assert during[("polymq_disk_free_bytes", ())] > during[("polymq_disk_free_limit_bytes", ())]
    assert during[("polymq_disk_free_limit_bytes", ())] == 50_000_000  # the default
    mark = during[("polymq_memory_high_watermark_bytes", ())]
    rise = during[("polymq_memory_alarm_threshold_bytes", (("edge", "rise"),))]
    clear = during[("polymq_memory_alarm_threshold_bytes", (("edge", "clear"),))]
    assert clear < rise < mark
    assert rise == pytest.approx(0.9 * mark, rel=1e-6)  # the default headroom: 0.1
    assert clear == pytest.approx(0.85 * mark, rel=1e-6)  # the default low watermark
    assert during[("polymq_memory_pressure", ())] == 0
    # off by default: no series per destination
    assert not any(name.startswith("polymq_destination_") for name, _ in during)


async def test_per_destination_depth_consumers_and_totals(
    per_destination: PolymqProcess,
) -> None:
    q, s = f"queue/{uid()}", f"stream/{uid()}"
    async with await connect(per_destination.ports["core"]) as c:
        await c.publish(q, [Message(b"m%d" % i, persistent=True) for i in range(10)])
        await c.publish(s, [Message(b"entry") for _ in range(3)])
        sub = await c.subscribe(q, ack_mode="client-individual", prefetch=4)
        got = await collect(sub, 4)
        first = await _scrape(per_destination)
        got[0].ack()
        got[1].ack()
        await collect(sub, 2)  # the two places the acks freed
        await c.stats(q)  # a round trip after the acks: they have been applied
        samples = await _scrape(per_destination)
    for when, ready, unacked, delivered, acked in ((first, 6, 4, 4, 0), (samples, 4, 4, 6, 2)):
        assert _of(when, "polymq_destination_messages_ready")[q] == ready
        assert _of(when, "polymq_destination_ready_bytes")[q] == ready * 2
        assert _of(when, "polymq_destination_messages_unacked")[q] == unacked
        assert _of(when, "polymq_destination_delivered_messages_total")[q] == delivered
        assert _of(when, "polymq_destination_acked_messages_total")[q] == acked
        assert _of(when, "polymq_destination_consumers")[q] == 1
        assert _of(when, "polymq_destination_published_messages_total")[q] == 10
    # a stream: its entries and publishes (it has no unacked messages, nor deliveries here)
    assert _of(samples, "polymq_destination_messages_ready")[s] == 3
    assert _of(samples, "polymq_destination_published_messages_total")[s] == 3
    assert _of(samples, "polymq_destination_consumers")[s] == 0
    assert s not in _of(samples, "polymq_destination_messages_unacked")


async def test_per_destination_export_is_capped_and_says_how_many_it_left_out(
    per_destination: PolymqProcess,
) -> None:
    names = [f"queue/{uid()}" for _ in range(6)]
    async with await connect(per_destination.ports["core"]) as c:
        for name in names:
            await c.publish(name, b"waiting")
        samples = await _scrape(per_destination)
    in_memory = samples[("polymq_destinations_in_memory", ())]
    assert in_memory >= 6
    exported = _of(samples, "polymq_destination_messages_ready")
    assert len(exported) == 4  # POLYMQ_METRICS_MAX_DESTINATIONS
    assert samples[("polymq_destination_metrics_omitted", ())] == in_memory - 4
    for name in ("polymq_destination_consumers", "polymq_destination_published_messages_total"):
        assert _of(samples, name).keys() == exported.keys()
