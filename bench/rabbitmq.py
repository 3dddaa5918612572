"""An optional reference point: the transient queue scenario against a local RabbitMQ.

Runs only when RabbitMQ accepts connections on 127.0.0.1:5672 (``POLYMQ_BENCH_AMQP_URL`` to
point elsewhere) and aio-pika is importable; otherwise the entry is ``skipped`` and says why.
Same shape as ``native_transient_queue``: one producer process and one consumer process,
32-byte transient messages, auto ack (``no_ack``), from the first publish to the last
delivery. The producer publishes without confirms (like ``publish_nowait``) in bursts of
``batch``, yielding to the loop between them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import time
from typing import Any
from urllib.parse import urlparse

from .harness import BenchError, workers
from .native import BODY, _await_counters, _Counter
from .scenario import Context, Result, Scenario, Skipped

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def now() -> float:
    return time.monotonic()


def _listening(url: str) -> bool:
    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 5672), timeout=1):
            return True
    except OSError:
        return False


async def consumer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aio_pika

    conn = await aio_pika.connect(params["url"])
    try:
        chan = await conn.channel()
        await chan.set_qos(prefetch_count=0)
        q = await chan.declare_queue(params["queue"], durable=False, auto_delete=False)
        await q.purge()
        counter = _Counter()

        def on_message(msg: Any) -> None:
            if counter.got == 0:
                counter.first = now()
            counter.got += 1
            counter.last = now()
            if counter.got >= counter.target:
                counter.done.set()

        await q.consume(on_message, no_ack=True)
        ch.send(ready=True)
        return await _await_counters(ch, [counter], [], params["timeout"])
    finally:
        await conn.close()


async def producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aio_pika

    conn = await aio_pika.connect(params["url"])
    try:
        chan = await conn.channel(publisher_confirms=False)
        ex = chan.default_exchange
        ch.send(ready=True)
        await ch.recv()  # go
        count, batch, queue = params["count"], params["batch"], params["queue"]
        sent = 0
        t0 = now()
        stop_at = t0 + params["seconds"]
        while sent < count and now() < stop_at:
            k = min(batch, count - sent)
            await asyncio.gather(
                *(ex.publish(aio_pika.Message(BODY), routing_key=queue) for _ in range(k))
            )
            sent += k
        return {"sent": sent, "t_first": t0, "t_sent": now()}
    finally:
        await conn.close()


def run_rabbitmq(ctx: Context) -> Result:
    url = os.environ.get("POLYMQ_BENCH_AMQP_URL", DEFAULT_URL)
    if not _listening(url):
        raise Skipped(f"no RabbitMQ listening at {urlparse(url).netloc.split('@')[-1]}")
    if importlib.util.find_spec("aio_pika") is None:
        raise Skipped(
            "RabbitMQ is listening on 127.0.0.1:5672 but aio-pika is not installed in this "
            "environment (the bench installs nothing), so there is no client to compare with"
        )
    batch = ctx.option("batch", 1000)
    count = ctx.option("count", 100_000 if ctx.quick else 2_000_000)
    seconds = ctx.option("seconds", 1.5 if ctx.quick else 6.0)
    timeout = seconds + 60
    params = {
        "url": url,
        "queue": "polymq.bench.transient",
        "count": count,
        "batch": batch,
        "seconds": seconds,
        "timeout": timeout,
    }
    with workers() as pool:
        c = ctx.spawn(pool, "bench.rabbitmq:consumer", params)
        c.expect("ready", 60)
        p = ctx.spawn(pool, "bench.rabbitmq:producer", params)
        p.expect("ready", 60)
        p.send(go=True)
        pr = p.wait_result(timeout + 30)
        c.send(expect=pr["sent"])
        r = c.wait_result(timeout + 30)
    if r["got"][0] < pr["sent"]:
        raise BenchError(f"consumer got {r['got'][0]} of {pr['sent']} within {timeout:.0f}s")
    elapsed = r["t_last"] - pr["t_first"]
    return Result(
        value=pr["sent"] / elapsed,
        params={
            "messages": pr["sent"],
            "body_bytes": len(BODY),
            "batch": batch,
            "no_ack": True,
            "confirms": False,
        },
        notes=(
            "RabbitMQ (not polymq) on 127.0.0.1:5672 via aio-pika, for comparison with "
            "native_transient_queue: one producer and one consumer process, transient 32-byte "
            "messages, no_ack consumer, no publisher confirms; first publish to last delivery. "
            "RabbitMQ is not pinned to a CPU."
        ),
        details={"seconds": elapsed},
    )


SCENARIOS = [
    Scenario(
        "rabbitmq_comparison",
        None,
        "msg/s",
        None,
        run_rabbitmq,
        about="optional: the transient queue scenario against a local RabbitMQ",
    ),
]
