"""Reconnecting with backoff (a fake connection, no sockets), and a stream link's progress."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from polymq_bridge.metrics import BridgeMetrics
from polymq_bridge.outbound import StreamProgress
from polymq_bridge.side import Attachment, Backoff, Side, Stopping


def test_backoff_doubles_with_jitter_up_to_a_cap() -> None:
    draws: list[tuple[float, float]] = []

    def rand(lo: float, hi: float) -> float:
        draws.append((lo, hi))
        return hi

    b = Backoff(0.1, 1.0, rand)
    assert [b.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert draws[0] == (0.05, 0.1) and draws[-1] == (0.5, 1.0)  # each jittered in [d/2, d]
    b.reset()
    assert b.next() == 0.1
    real = Backoff(1.0, 8.0)
    for _ in range(20):
        d = real.next()
        assert 0.5 <= d <= 8.0


class FakeConn:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False


class FakeSide(Side[FakeConn]):
    """Fails ``failures`` times, then connects; each connection lives until dropped."""

    side = "core"

    def __init__(self, failures: int, registry: CollectorRegistry) -> None:
        super().__init__("fake:1", Backoff(0.001, 0.004), BridgeMetrics(registry))
        self.failures = failures
        self.attempts = 0

    async def _connect(self) -> FakeConn:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise ConnectionRefusedError("refused")
        return FakeConn(self.attempts)

    async def _watch(self, att: Attachment[FakeConn]) -> None:
        await asyncio.shield(att.lost)

    async def _close(self, conn: FakeConn) -> None:
        conn.closed = True


def sample(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name, {"side": "core"})
    assert value is not None
    return value


async def test_side_retries_then_reconnects_after_a_loss() -> None:
    reg = CollectorRegistry()
    side = FakeSide(failures=3, registry=reg)
    await side.start(first_wait=0.0)
    att = await asyncio.wait_for(side.wait(), 2)
    assert att.conn.n == 4 and att.number == 1 and att.alive and side.connected
    assert sample(reg, "polymq_bridge_connect_failures_total") == 3
    assert sample(reg, "polymq_bridge_connected") == 1
    assert sample(reg, "polymq_bridge_reconnects_total") == 0
    # a link finds the connection broken: the side closes it and connects again
    side.report_lost(att, "broken pipe")
    assert att.lost.result() == "broken pipe"
    att2 = await asyncio.wait_for(side.wait(), 2)
    assert att2 is not att and att2.number == 2 and att.conn.closed
    assert sample(reg, "polymq_bridge_reconnects_total") == 1
    assert sample(reg, "polymq_bridge_connects_total") == 2
    await side.stop()
    assert att2.conn.closed and not side.connected
    assert sample(reg, "polymq_bridge_connected") == 0
    with pytest.raises(Stopping):
        await side.wait()


async def test_waiters_are_released_by_stop() -> None:
    side = FakeSide(failures=10**9, registry=CollectorRegistry())
    await side.start(first_wait=0.0)
    waiter = asyncio.ensure_future(side.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await side.stop()
    with pytest.raises(Stopping):
        await asyncio.wait_for(waiter, 1)


def test_stream_progress_is_contiguous() -> None:
    p = StreamProgress(10)
    for seq in (11, 12, 13, 14):
        p.taken(seq)
    p.confirmed(13)
    assert p.committed == 10  # 11 and 12 are not confirmed yet
    p.confirmed(11)
    assert p.committed == 11
    p.confirmed(12)
    assert p.committed == 13 and p.outstanding == 1
    p.confirmed(14)
    assert p.committed == 14 and p.outstanding == 0
    # a stream trimmed under the reader: deliveries jump, progress follows them
    p.taken(40)
    p.confirmed(40)
    assert p.committed == 40


def test_metrics_names_are_polymq_and_bounded() -> None:
    reg = CollectorRegistry()
    BridgeMetrics(reg)
    names = {m.name for m in reg.collect()}
    assert names and all(n.startswith("polymq_bridge_") for n in names)
    values: dict[str, Any] = {
        s.name: s.value for m in reg.collect() for s in m.samples if s.labels.get("side")
    }
    assert values  # the per-side series exist before the first connection
