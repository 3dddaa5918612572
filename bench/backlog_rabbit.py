"""RabbitMQ beside the ``backlog`` scenario: the same backlog, restart and drain on a private
RabbitMQ node (:class:`tests.rabbit.RabbitNode`: its own node name, port and data directory,
started for the scenario and removed afterwards; the machine's RabbitMQ on :5672 is left
alone), with aio-pika: a durable classic queue (``x-queue-version: 2``), persistent 1 KB
messages published with publisher confirms ``inflight`` at a time, the ``beam.smp``
process's RSS sampled; the node stopped (SIGTERM) and started again, timed to its AMQP
handshake and to the first delivery; then drained by one consumer (``prefetch``, one ack per
message). aio-pika is a slower client than polymq's own: the drain rates compare the
brokers only as far as the client keeps up (its CPU is reported).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from .backlog import index_of, make_body
from .harness import BenchError, RssSampler, workers
from .scenario import Context

QUEUE = "polymq.bench.backlog"
ARGS = {"x-queue-version": 2}


def now() -> float:
    return time.monotonic()


async def publisher(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aio_pika

    conn = await aio_pika.connect(params["url"])
    try:
        chan = await conn.channel(publisher_confirms=True)
        await chan.declare_queue(QUEUE, durable=True, arguments=ARGS)
        ch.send(ready=True)
        await ch.recv()  # go
        filler = b"x" * (params["body_bytes"] - 8)
        count, inflight = params["count"], params["inflight"]
        ex = chan.default_exchange
        persistent = aio_pika.DeliveryMode.PERSISTENT
        cpu0 = time.process_time()
        t0 = now()
        for lo in range(0, count, inflight):
            await asyncio.gather(
                *(
                    ex.publish(
                        aio_pika.Message(make_body(i, filler), delivery_mode=persistent),
                        routing_key=QUEUE,
                    )
                    for i in range(lo, min(count, lo + inflight))
                )
            )
        return {"t_first": t0, "t_last": now(), "cpu_seconds": time.process_time() - cpu0}
    finally:
        await conn.close()


async def drainer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aio_pika

    ch.send(ready=True)
    go = await ch.recv()
    expect = int(go["expect"])
    conn = await aio_pika.connect(go["url"])
    try:
        chan = await conn.channel()
        await chan.set_qos(prefetch_count=params["prefetch"])
        q = await chan.declare_queue(QUEUE, durable=True, arguments=ARGS)
        seen = bytearray(expect)
        got = distinct = out_of_order = 0
        last = -1
        t_first = 0.0
        cpu0 = time.process_time()
        async with q.iterator() as it:
            async for m in it:
                if not got:
                    t_first = now()
                got += 1
                await m.ack()
                i = index_of(m.body)
                out_of_order += i < last
                last = i
                if 0 <= i < expect and not seen[i]:
                    seen[i] = 1
                    distinct += 1
                    if distinct >= expect:
                        break
        return {
            "got": got,
            "distinct": distinct,
            "out_of_order": out_of_order,
            "t_first": t_first,
            "t_last": now(),
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await conn.close()


def run_rabbitmq(ctx: Context, n: int, params: dict[str, Any]) -> dict[str, Any]:
    """The RabbitMQ side's figures, or ``{"status": "skipped", "reason"}``."""
    root = Path(__file__).resolve().parent.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tests.rabbit import RabbitNode, find_server

    if importlib.util.find_spec("aio_pika") is None:
        return {"status": "skipped", "reason": "aio-pika is not installed"}
    if find_server() is None:
        return {"status": "skipped", "reason": "rabbitmq-server is not installed"}
    node = RabbitNode()
    try:
        try:
            node.start()
        except RuntimeError as exc:
            return {"status": "skipped", "reason": f"a private RabbitMQ node did not start: {exc}"}
        beam = node.beam()
        if beam is None:
            raise BenchError("the private RabbitMQ node has no beam.smp process")
        with workers() as pool:
            p = ctx.spawn(
                pool, "bench.backlog_rabbit:publisher", {**params, "url": node.url, "count": n}
            )
            d = ctx.spawn(pool, "bench.backlog_rabbit:drainer", params)
            p.expect("ready", 60)
            d.expect("ready", 60)
            rss0 = beam.memory_info().rss
            sampler = RssSampler(beam.pid).start()
            try:
                p.send(go=True)
                pr = p.wait_result(params["timeout"])
                time.sleep(1.0)
                rss_full = beam.memory_info().rss
                t_stop = now()
                node.stop(timeout=120)
                stop_seconds = now() - t_stop
                t_start = now()
                node.start(timeout=180)
                ready_seconds = now() - t_start
                beam = node.beam()
                if beam is not None:
                    sampler.follow(beam.pid)
                d.send(url=node.url, expect=n)
                r = d.wait_result(params["timeout"] + 60)
            finally:
                sampler.stop()
    finally:
        node.cleanup()
    if r["distinct"] < n:
        raise BenchError(f"RabbitMQ: the consumer got {r['distinct']:,} of {n:,} messages")
    return {
        "status": "ok",
        "broker": "RabbitMQ 3.10 (a private node), classic queue v2, aio-pika",
        "messages": n,
        "publish_msg_per_s": n / (pr["t_last"] - pr["t_first"]),
        "publisher_cpu_seconds": pr["cpu_seconds"],
        "rss_before_bytes": rss0,
        "rss_full_bytes": rss_full,
        "rss_per_queued_message_bytes": (rss_full - rss0) / n,
        "peak_rss_bytes": sampler.peak,
        "restart_stop_seconds": stop_seconds,
        "restart_ready_seconds": ready_seconds,
        "restart_first_delivery_seconds": r["t_first"] - t_start,
        "drain_msg_per_s": n / (r["t_last"] - r["t_first"]),
        "drain_out_of_order": r["out_of_order"],
        "drain_consumer_cpu_seconds": r["cpu_seconds"],
    }
