"""What a scrape of the core's /metrics costs with per-destination metrics on.

The core answers ``GET /metrics`` on its event loop, so the time a scrape takes is time no
message moves. With ``POLYMQ_METRICS_PER_DESTINATION=true`` each destination exported adds
seven series (polymq_destination_*): this scenario fills a fresh ``polymq core`` with
``destinations`` queues of one message each, times ``scrapes`` scrapes one after another,
and does the same on a core without the opt-in. value = the median scrape with it, in ms.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import urllib.request

from polymq import Client, Message

from .scenario import Context, Result, Scenario


async def _fill(port: int, n: int) -> None:
    """One message in each of ``n`` queues (each a destination in memory)."""
    client = await Client.connect("127.0.0.1", port)
    try:
        for i in range(n):
            client.publish_nowait(f"queue/bench.metrics.{i}", [Message(b"x")])
            if i % 100 == 99:
                await client.drain()
        await client.stats(f"queue/bench.metrics.{n - 1}")  # every publish was applied
    finally:
        await client.close()


def _scrape(url: str, times: int) -> tuple[list[float], int]:
    """``times`` scrapes of ``url``, one after another: their seconds, and the bytes of one."""
    out, size = [], 0
    for _ in range(times):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            size = len(r.read())
        out.append(time.perf_counter() - t0)
    return out, size


def run_scrape(ctx: Context) -> Result:
    n = ctx.option("destinations", 200 if ctx.quick else 1000)
    times = ctx.option("scrapes", 5 if ctx.quick else 30)
    median_ms: dict[bool, float] = {}
    size: dict[bool, int] = {}
    for on in (False, True):
        env = (
            {"POLYMQ_METRICS_PER_DESTINATION": "true", "POLYMQ_METRICS_MAX_DESTINATIONS": str(n)}
            if on
            else {}
        )
        with ctx.broker("core", env=env) as b:
            asyncio.run(_fill(b.core_port, n))
            seconds, size[on] = _scrape(b.url("admin") + "/metrics", times)
        median_ms[on] = statistics.median(seconds) * 1000
    return Result(
        value=median_ms[True],
        params={"destinations": n, "scrapes": times},
        notes=(
            f"polymq core holding {n:,} queues of one message: median of {times} scrapes of "
            f"/metrics, {median_ms[True]:.1f} ms and {size[True]:,} bytes with "
            f"POLYMQ_METRICS_PER_DESTINATION=true (all {n:,} exported), "
            f"{median_ms[False]:.1f} ms and {size[False]:,} bytes without. Answered on the "
            "core's event loop. No fixed target."
        ),
        details={
            "on_ms": median_ms[True],
            "off_ms": median_ms[False],
            "on_bytes": size[True],
            "off_bytes": size[False],
            "on_ms_per_destination": (median_ms[True] - median_ms[False]) / n,
        },
    )


SCENARIOS = [
    Scenario(
        "metrics_scrape_per_destination",
        None,
        "ms",
        None,
        run_scrape,
        about="a scrape of the core's /metrics with 1,000 destinations exported, and without",
    )
]
