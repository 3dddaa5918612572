"""At least once through faults: RabbitMQ, then the core, restarted while 2,000 persistent
messages flow each way. Every message arrives (distinct ids are counted; duplicates are
allowed, and reported), and the bridge's metrics show the reconnects."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ...procs import PolymqProcess
from ...rabbit import RabbitNode
from .conftest import BridgeProcess, unique
from .flows import drain_polymq, drain_rabbit, ids, produce_polymq, produce_rabbit, report
from .test_messages import rabbit_queue

pytestmark = pytest.mark.timeout(120)

N = 2000


def links(src: str, rq_out: str, rq_in: str, dst: str) -> list[dict[str, Any]]:
    return [
        {"name": "out", "direction": "polymq-to-rabbitmq", "source": f"queue/{src}",
         "routing_key": rq_out, "prefetch": 100},
        {"name": "in", "direction": "rabbitmq-to-polymq", "queue": rq_in,
         "destination": f"queue/{dst}", "prefetch": 100},
    ]  # fmt: skip


async def wait_moved(bridge: Any, n: int) -> None:
    """Until each direction has moved at least ``n`` messages (mid-stream, not before)."""
    for link, direction in (("out", "to_rabbitmq"), ("in", "to_polymq")):
        await asyncio.to_thread(
            bridge.wait_metric, "polymq_bridge_messages_total", n, 30,
            link=link, direction=direction,
        )  # fmt: skip


@dataclass
class Flow:
    """N persistent messages on their way each way through a bridge: polymq ``queue/src``
    -> RabbitMQ ``rq_out``, RabbitMQ ``rq_in`` -> polymq ``queue/dst``."""

    rabbit_url: str
    port: int  # the core's
    links: list[dict[str, Any]]
    rq_out: str
    dst: str
    out_ids: list[str]
    in_ids: list[str]
    producers: asyncio.Future[tuple[int, int]]  # each producer's retries
    hold: asyncio.Event  # set: the polymq producer goes on past halfway
    bridge: BridgeProcess

    async def finish(self, across: str) -> tuple[int, int]:
        """Once the producers are done, every message arrives on the other side; the
        producers' retries (polymq, RabbitMQ). A message missing fails the test with the
        bridge's log and metrics (what tells a link waiting for its peer from one stuck)."""
        self.hold.set()
        retries = await self.producers
        seen_out = await drain_rabbit(self.rabbit_url, self.rq_out, set(self.out_ids))
        seen_in = await drain_polymq(self.port, f"queue/{self.dst}", set(self.in_ids))
        try:
            report(f"polymq -> RabbitMQ across {across}", set(self.out_ids), seen_out)
            report(f"RabbitMQ -> polymq across {across}", set(self.in_ids), seen_in)
        except AssertionError as exc:
            log = "\n".join(self.bridge.log().splitlines()[-80:])
            try:
                metrics = "\n".join(f"{k} {v}" for k, v in sorted(self.bridge.metrics().items()))
            except Exception as why:  # (a bridge that died answers nothing)
                metrics = f"none: {why!r}"
            raise AssertionError(
                f"{exc}\n--- the bridge's log (end) ---\n{log}\n--- its metrics ---\n{metrics}"
            ) from None
        return retries


async def start_flow(
    bridge_factory: Any, rabbit_url: str, port: int, tag: str, *, hold: bool = False
) -> tuple[Any, Flow]:
    """Queues on both sides, a bridge (to the core on ``port``) between them and N messages
    produced into each; returns once each direction has moved 300 (mid-stream). ``hold``:
    the polymq producer waits halfway until :meth:`Flow.finish`, so it cannot be done before
    a fault made meanwhile."""
    src, rq_out = unique(f"{tag}o"), unique(f"{tag}o")
    rq_in, dst = unique(f"{tag}i"), unique(f"{tag}i")
    await rabbit_queue(rabbit_url, rq_out)
    await rabbit_queue(rabbit_url, rq_in)
    flow_links = links(src, rq_out, rq_in, dst)
    bridge = bridge_factory(flow_links, core_port=port)
    bridge.wait_ready()
    out_ids, in_ids = ids("o", N), ids("i", N)
    gate = asyncio.Event()
    if not hold:
        gate.set()
    producers = asyncio.gather(
        produce_polymq(port, f"queue/{src}", out_ids, hold=gate),
        produce_rabbit(rabbit_url, rq_in, in_ids),
    )
    await wait_moved(bridge, 300)
    flow = Flow(rabbit_url, port, flow_links, rq_out, dst, out_ids, in_ids, producers, gate, bridge)
    return bridge, flow


async def test_rabbitmq_restart_mid_stream_loses_nothing(
    bridge_factory: Any, rabbit: RabbitNode, core: PolymqProcess
) -> None:
    bridge, flow = await start_flow(bridge_factory, rabbit.url, core.ports["core"], "f")
    await asyncio.to_thread(rabbit.restart)  # a clean stop and start, same port and data
    retries = await flow.finish("a RabbitMQ restart")
    print(f"producer retries (polymq, RabbitMQ): {retries}")
    assert retries[1] >= 1, "the RabbitMQ producer never noticed the restart: not mid-stream"
    m = bridge.metrics()
    assert m['polymq_bridge_reconnects_total{side="rabbitmq"}'] >= 1
    assert m['polymq_bridge_reconnects_total{side="core"}'] == 0
    assert m['polymq_bridge_connected{side="rabbitmq"}'] == 1
    assert m['polymq_bridge_link_sessions_total{link="out"}'] >= 2
    assert m['polymq_bridge_link_sessions_total{link="in"}'] >= 2
    assert m['polymq_bridge_errors_total{link="in",reason="connection_lost"}'] >= 1
    assert m['polymq_bridge_in_flight{link="out"}'] == 0
    assert bridge.stop() == 0, bridge.log()


async def test_core_restart_mid_stream_loses_nothing(
    bridge_factory: Any, rabbit: RabbitNode, tmp_path: Path
) -> None:
    workdir = tmp_path / "core"
    core = PolymqProcess("core", workdir).start()
    try:
        port = core.ports["core"]
        # the polymq producer waits halfway (past the 300 moved) until the core is back: it
        # was seen to finish all its messages before the stop otherwise
        bridge, flow = await start_flow(bridge_factory, rabbit.url, port, "c", hold=True)
        assert await asyncio.to_thread(core.stop) == 0, core.log()
        # the same port and data directory: persistent messages and durable queues come back
        core = PolymqProcess("core", workdir, "--core-port", str(port)).start()
        retries = await flow.finish("a core restart")
        print(f"producer retries (polymq, RabbitMQ): {retries}")
        assert retries[0] >= 1, "the polymq producer never noticed the restart: not mid-stream"
        m = bridge.metrics()
        assert m['polymq_bridge_reconnects_total{side="core"}'] >= 1
        assert m['polymq_bridge_connected{side="core"}'] == 1
        assert m['polymq_bridge_link_sessions_total{link="out"}'] >= 2
        assert m['polymq_bridge_link_sessions_total{link="in"}'] >= 2
        assert bridge.stop() == 0, bridge.log()
    finally:
        core.kill()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_bridge_replaced_mid_stream_loses_nothing(
    bridge_factory: Any, rabbit: RabbitNode, core: PolymqProcess, how: str
) -> None:
    """SIGKILL: no goodbye, nothing flushed; what the dead bridge held unconfirmed goes back
    to its source (the core and RabbitMQ each see the connection drop). SIGTERM: the bridge
    stops consuming, lets what is in flight be confirmed, gives back the rest and exits 0.
    Either way the next bridge moves everything that is left."""
    bridge, flow = await start_flow(bridge_factory, rabbit.url, core.ports["core"], "k")
    if how == "SIGKILL":
        bridge.kill()
    else:
        assert await asyncio.to_thread(bridge.stop) == 0, bridge.log()
        assert "Traceback" not in bridge.log()
    second = bridge_factory(flow.links)
    await flow.finish(f"a bridge stopped by {how}")
    assert second.metric("polymq_bridge_messages_total", link="out", direction="to_rabbitmq") > 0
    assert second.stop() == 0, second.log()
