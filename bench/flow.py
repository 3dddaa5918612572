"""Flow control: a producer far faster than its consumer, held by the memory alarm (issue 17:
"a producer 10x faster than its consumer for 5 minutes: memory stays under the watermark, no
message lost, the producer slowed, not disconnected").

Scenario ``fast_producer``, on a fresh ``polymq core`` with ``POLYMQ_MEMORY_HIGH_WATERMARK``
set to ``watermark_bytes`` (300 MB: a figure the run reaches, so the alarm holds the
producer):

- one **producer** process publishes 1 KB messages (the first 8 bytes of each body are its
  index) to one queue as fast as it can: awaited batches of ``batch``, ``inflight`` at a
  time, for ``seconds``; it records how many were confirmed every 0.5 s and whether its
  connection was ever closed;
- one **consumer** process takes them at ``consumer_rate`` messages/s (a sleep every few
  messages; client-individual acks, ``prefetch``), then, when the producer's time is up,
  as fast as it can until it has every confirmed message (checked by index);
- when its time is up the producer waits up to ``settle`` seconds for the batches the alarm
  still holds (they are reported unconfirmed, not lost, if the alarm never clears);
- the parent samples the core's RSS every 0.05 s and its alarms (``GET /api/alarms`` on the
  admin port) every second; the peak is the kernel's high-water mark of the core's resident
  set (``VmHWM``, kept at every page fault: no peak between two samples escapes it), read
  once everything is drained, and the sampled peak if ever higher.

The queue is durable and the messages transient, on a core that pages nothing
(``POLYMQ_QUEUE_WINDOW_MESSAGES=0``, option ``window``): a queue that pages keeps its
backlog in the store, and memory would not grow with it (the ``backlog`` scenario measures
that). (A queue declared not durable should keep everything in memory too, but at
04b06e5 it pages and loses what it paged: ``--set fast_producer.durable=false`` shows it.)
Reported: the peak RSS
against the watermark, the producer's rate while the alarm was on vs off, how much faster
than the consumer it was while free, messages lost (confirmed, never delivered), and whether
the producer was disconnected; each target's verdict in ``targets``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from typing import Any

from polymq import Client, ConnectionClosed, Message, PolymqError

from .backlog import BODY_BYTES, index_of, make_body
from .harness import BenchError, Broker, RssSampler, workers
from .scenario import Context, Result, Scenario

DEST = "queue/bench.fast_producer"
MB = 1_000_000


def now() -> float:
    return time.monotonic()


# =========================================================================================
# workers (each runs in its own process)
# =========================================================================================
async def producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    client = await Client.connect(params["host"], params["port"])
    try:
        dest, batch = params["destination"], params["batch"]
        await client.declare(dest, durable=params["durable"])
        filler = b"x" * (params["body_bytes"] - 8)
        persistent = params["persistent"]
        ch.send(ready=True)
        await ch.recv()  # go
        next_i = confirmed = 0
        outstanding: set[int] = set()  # first index of each batch sent, not yet confirmed
        timeline: list[tuple[float, int]] = []
        closed: list[str] = []
        t0 = now()
        stop_at = t0 + params["seconds"]

        async def one() -> None:
            nonlocal next_i, confirmed
            while now() < stop_at and not closed:
                lo = next_i
                next_i += batch
                msgs = [
                    Message(body=make_body(i, filler), persistent=persistent)
                    for i in range(lo, lo + batch)
                ]
                outstanding.add(lo)
                try:
                    r = await client.publish(dest, msgs)
                except ConnectionClosed as exc:
                    closed.append(f"{now() - t0:.1f}s: {exc}")
                    return
                except PolymqError as exc:  # refused: not confirmed, the run goes on
                    closed.append(f"{now() - t0:.1f}s: refused: {type(exc).__name__}: {exc}")
                    return
                if r.count != batch:
                    raise BenchError(f"publish receipt counts {r.count}, not {batch}")
                outstanding.discard(lo)
                confirmed += batch

        async def ticker() -> None:
            while True:
                timeline.append((now(), confirmed))
                await asyncio.sleep(0.5)

        tick = asyncio.ensure_future(ticker())
        tasks = [asyncio.ensure_future(one()) for _ in range(params["inflight"])]
        # Past ``seconds`` no batch starts; those held by the alarm finish once it clears
        # (the consumer then drains at full speed), or are reported unconfirmed.
        _done, pending = await asyncio.wait(tasks, timeout=params["seconds"] + params["settle"])
        t_end = now()
        timeline.append((t_end, confirmed))
        tick.cancel()
        for t in pending:
            t.cancel()
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return {
            "sent": next_i,
            "confirmed": confirmed,
            "unconfirmed_batches": sorted(outstanding),
            "batch": batch,
            "t_first": t0,
            "t_stop": stop_at,
            "t_end": t_end,
            "timeline": timeline,
            "disconnected": closed,
            "client_closed": client.closed,
        }
    finally:
        await client.close()


def _confirmed(i: int, sent: int, batch: int, unconfirmed: frozenset[int]) -> bool:
    """Was message ``i`` confirmed to the producer (sent, in a batch that was receipted)?"""
    return i < sent and (i - i % batch) not in unconfirmed


async def consumer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """``consumer_rate`` msg/s until told ``full``; then as fast as it can until every
    confirmed message (told by ``expect``) came, or nothing came for ``idle_timeout``."""
    client = await Client.connect(params["host"], params["port"])
    try:
        dest = params["destination"]
        await client.declare(dest, durable=params["durable"])
        sub = await client.subscribe(
            dest, ack_mode="client-individual", prefetch=params["prefetch"]
        )
        ch.send(ready=True)
        rate = float(params["consumer_rate"])
        seen = bytearray(1 << 20)
        got = distinct = 0
        need: int | None = None  # confirmed messages not delivered yet, once known
        sent, batch, unconfirmed = 0, 1, frozenset[int]()
        t_first = t_last = t_full = 0.0
        limited = True
        counted_at = 0.0
        counted = 0  # messages since the rate's reference point
        timeline: list[tuple[float, int]] = []
        # the parent's next word; None after ``expect``, the last (no read is left pending:
        # its executor thread would keep the loop from closing)
        ctl: asyncio.Future[dict[str, Any]] | None = asyncio.ensure_future(ch.recv())
        t_tick = 0.0
        while need is None or need > 0:
            if ctl is not None and ctl.done():
                msg = ctl.result()
                ctl = None if "expect" in msg else asyncio.ensure_future(ch.recv())
                if msg.get("full"):
                    limited = False
                    t_full = now()
                if "expect" in msg:
                    limited = False
                    exp = msg["expect"]
                    sent, batch = int(exp["sent"]), int(exp["batch"])
                    unconfirmed = frozenset(exp["unconfirmed_batches"])
                    if len(seen) < sent:
                        seen.extend(bytes(sent - len(seen)))
                    need = sum(
                        1
                        for i in range(sent)
                        if not seen[i] and _confirmed(i, sent, batch, unconfirmed)
                    )
                    if not need:
                        break
            try:
                d = await sub.get(timeout=params["idle_timeout"] if need is not None else 0.5)
            except TimeoutError:
                if need is not None:
                    break  # nothing more comes: what is missing is lost
                continue
            t = now()
            if not got:
                t_first = counted_at = t
            got += 1
            t_last = t
            d.ack()
            i = index_of(d.message.body)
            if i >= len(seen):
                seen.extend(bytes(max(i + 1 - len(seen), len(seen))))
            if not seen[i]:
                seen[i] = 1
                distinct += 1
                if need is not None and _confirmed(i, sent, batch, unconfirmed):
                    need -= 1
            if t - t_tick >= 0.5:
                timeline.append((t, got))
                t_tick = t
            if limited:
                counted += 1
                if counted % 10 == 0:
                    delay = counted_at + counted / rate - now()
                    if delay > 0:
                        await asyncio.sleep(delay)
        timeline.append((now(), got))
        await client.ping()  # the acks went out before it
        stats = await client.stats(dest)
        return {
            "got": got,
            "distinct": distinct,
            "missing_confirmed": need,
            "t_first": t_first,
            "t_full": t_full,
            "t_last": t_last,
            "timeline": timeline,
            "queue_stats": stats.to_json(),
        }
    finally:
        await client.close()


# =========================================================================================
# the scenario (run in the parent)
# =========================================================================================
def _alarms(b: Broker) -> dict[str, Any]:
    with urllib.request.urlopen(f"{b.url('admin')}/api/alarms", timeout=5) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def _rates(
    timeline: list[tuple[float, int]], alarms: list[tuple[float, bool]]
) -> dict[str, float | None]:
    """The producer's confirmed rate over the intervals the alarm was on vs off (the state
    sampled last before each interval's middle)."""
    sums = {True: [0.0, 0.0], False: [0.0, 0.0]}  # alarm on? -> [messages, seconds]
    for (t0, c0), (t1, c1) in itertools.pairwise(timeline):
        mid = (t0 + t1) / 2
        on = False
        for t, state in alarms:
            if t > mid:
                break
            on = state
        sums[on][0] += c1 - c0
        sums[on][1] += t1 - t0
    return {
        "held_msg_per_s": sums[True][0] / sums[True][1] if sums[True][1] else None,
        "held_seconds": sums[True][1],
        "free_msg_per_s": sums[False][0] / sums[False][1] if sums[False][1] else None,
        "free_seconds": sums[False][1],
    }


def run_fast_producer(ctx: Context) -> Result:
    seconds = ctx.option("seconds", 10.0 if ctx.quick else 300.0)
    watermark = ctx.option("watermark_bytes", 100 * MB if ctx.quick else 300 * MB)
    rate = ctx.option("consumer_rate", 1000)
    batch = ctx.option("batch", 100)
    inflight = ctx.option("inflight", 4)
    prefetch = ctx.option("prefetch", 100)
    durable = ctx.option("durable", True)
    window = ctx.option("window", 0)
    persistent = ctx.option("persistent", False)
    settle = ctx.option("settle", 5.0 if ctx.quick else 30.0)
    params = {
        "destination": DEST,
        "body_bytes": BODY_BYTES,
        "batch": batch,
        "inflight": inflight,
        "prefetch": prefetch,
        "durable": durable,
        "persistent": persistent,
        "seconds": seconds,
        "settle": settle,
        "consumer_rate": rate,
        "idle_timeout": 30.0,
    }
    env = {
        "POLYMQ_MEMORY_HIGH_WATERMARK": str(watermark),
        "POLYMQ_QUEUE_WINDOW_MESSAGES": str(window),
    }
    alarm_samples: list[tuple[float, bool]] = []
    with ctx.broker("core", env=env) as b, workers() as pool:
        addr = {"host": b.host, "port": b.core_port}
        c = ctx.spawn(pool, "bench.flow:consumer", {**params, **addr})
        c.expect("ready", 60)
        p = ctx.spawn(pool, "bench.flow:producer", {**params, **addr})
        p.expect("ready", 60)
        rss0 = b.rss()
        sampler = RssSampler(b.pid, every=0.05).start()
        try:
            t_go = now()
            p.send(go=True)
            next_tick = t_go
            while now() < t_go + seconds:
                b.check_alive()
                doc = _alarms(b)
                alarm_samples.append((now(), "memory" in doc["alarms"]))
                next_tick += 1.0
                time.sleep(max(0.0, next_tick - now()))
            c.send(full=True)
            t_full = now()
            pr = p.wait_result(settle + 60)
            c.send(expect={k: pr[k] for k in ("sent", "batch", "unconfirmed_batches")})
            cr = c.wait_result(settle + 120)
            t_drained = now()
            last = _alarms(b)
            alarm_samples.append((now(), "memory" in last["alarms"]))
            hwm = b.peak_rss()
            rises = b.proc.log().count("memory alarm on")  # (a warning: logged at any level)
        finally:
            sampler.stop()
    peak_held = sampler.peak_between(t_go, t_full)
    peak = max(hwm, sampler.peak)
    marks = last["memory"]
    rates = _rates(pr["timeline"], alarm_samples)
    first_on = next((t for t, on in alarm_samples if on), None)
    # the free rate proper: before the alarm first held the producer
    free_before = None
    if first_on is not None:
        before = [(t, n) for t, n in pr["timeline"] if t <= first_on]
        if len(before) >= 2 and before[-1][0] > before[0][0]:
            free_before = (before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])
    free_rate = free_before or rates["free_msg_per_s"] or 0.0
    consumed_limited = [(t, n) for t, n in cr["timeline"] if t <= t_full]
    consumer_rate = (
        (consumed_limited[-1][1] - consumed_limited[0][1])
        / (consumed_limited[-1][0] - consumed_limited[0][0])
        if len(consumed_limited) >= 2 and consumed_limited[-1][0] > consumed_limited[0][0]
        else None
    )
    lost = cr["missing_confirmed"]
    disconnected = bool(pr["disconnected"]) or pr["client_closed"]
    held = rates["held_msg_per_s"]
    slowed = first_on is not None and held is not None and free_rate > 0 and held < free_rate / 2
    speed_ratio = free_rate / consumer_rate if consumer_rate else None
    alarm_seconds = sum(1 for _t, on in alarm_samples if on)
    targets = {
        "memory_under_watermark": {
            "target": "the core's RSS stays under POLYMQ_MEMORY_HIGH_WATERMARK",
            "peak_rss_bytes": peak,
            "watermark_bytes": watermark,
            "overshoot_bytes": max(0, peak - watermark),
            "met": peak <= watermark,
        },
        "no_message_lost": {
            "target": "every confirmed message delivered",
            "confirmed": pr["confirmed"],
            "lost": lost,
            "met": lost == 0,
        },
        "producer_slowed": {
            "target": "the alarm held the producer (its rate while held < half its free rate)",
            "alarm_seen": first_on is not None,
            "held_msg_per_s": held,
            "free_msg_per_s": free_rate,
            "met": slowed,
        },
        "producer_not_disconnected": {
            "target": "the producer's connection was never closed",
            "disconnected": pr["disconnected"],
            "met": not disconnected,
        },
        "producer_10x_consumer": {
            "target": "the producer (free) at least 10x faster than the consumer",
            "ratio": speed_ratio,
            "met": speed_ratio is not None and speed_ratio >= 10,
        },
    }
    all_met = all(t["met"] for t in targets.values())
    full_scale = seconds >= 300
    scale = "" if full_scale else f"{seconds:.0f}s, not the target's 5 minutes. "
    held_s = f"{held:,.0f}" if held is not None else "-"
    conn = (
        "DISCONNECTED: " + "; ".join(pr["disconnected"]) if disconnected else "never disconnected"
    )
    return Result(
        value=peak / MB,
        target=watermark / MB,
        comparable=full_scale,
        verdict=True,
        met=all_met if full_scale else None,
        params={
            "seconds": seconds,
            "watermark_bytes": watermark,
            "consumer_rate": rate,
            "body_bytes": BODY_BYTES,
            "batch": batch,
            "inflight_batches": inflight,
            "prefetch": prefetch,
            "durable": durable,
            "persistent": persistent,
            "queue_window_messages": window,
        },
        notes=(
            f"{scale}A producer publishing 1 KB messages as fast as it can (awaited batches of "
            f"{batch}, {inflight} in flight) and a consumer held to {rate:,} msg/s, on one "
            f"queue of a core with POLYMQ_MEMORY_HIGH_WATERMARK={watermark / MB:.0f} MB, for "
            f"{seconds:.0f}s. Core RSS {rss0 / MB:.0f} MB at the start, peak {peak / MB:.0f} MB "
            f"(value, in MB: the kernel's high-water mark VmHWM, which misses no peak; the "
            f"most of the samples every 0.05 s: {sampler.peak / MB:.0f} MB; the target is the "
            f"watermark; the alarm rises at {marks.get('rises_at', watermark) / MB:.0f} MB and "
            f"clears under {marks.get('clears_at', watermark) / MB:.0f} MB). The memory alarm "
            "was on in "
            f"{alarm_seconds} of {len(alarm_samples)} one-second samples (it rose {rises} "
            "times), first after "
            f"{(first_on - t_go) if first_on else float('nan'):.1f}s. Producer: "
            f"{free_rate:,.0f} msg/s free, {held_s} msg/s while held; "
            f"{pr['confirmed']:,} confirmed of {pr['sent']:,} sent, "
            f"{conn}. "
            f"Consumer: {consumer_rate or 0:,.0f} msg/s while held to its rate, then drained "
            f"everything; {lost} confirmed message(s) lost."
        ),
        details={
            "rss_start_bytes": rss0,
            "peak_rss_bytes": peak,
            "peak_rss_vmhwm_bytes": hwm,
            "peak_rss_sampled_bytes": sampler.peak,
            "peak_rss_sampled_while_producing_bytes": peak_held,
            "memory_alarm_rises_at_bytes": marks.get("rises_at"),
            "memory_alarm_clears_at_bytes": marks.get("clears_at"),
            "watermark_bytes": watermark,
            "peak_rss_to_watermark": peak / watermark,
            "rss_samples_per_second": [
                (round(t - t_go, 2), r) for t, r in sampler.samples[::20] if t >= t_go
            ],
            "memory_alarm_rises": rises,
            "alarm_on_samples": alarm_seconds,
            "alarm_samples": len(alarm_samples),
            "alarm_first_on_after_seconds": (first_on - t_go) if first_on else None,
            "producer_free_msg_per_s_before_first_alarm": free_before,
            **{f"producer_{k}": v for k, v in rates.items()},
            "producer_sent": pr["sent"],
            "producer_confirmed": pr["confirmed"],
            "producer_unconfirmed_batches": len(pr["unconfirmed_batches"]),
            "producer_disconnected": pr["disconnected"],
            "producer_wait_after_stop_seconds": pr["t_end"] - pr["t_stop"],
            "consumer_limited_msg_per_s": consumer_rate,
            "producer_to_consumer_ratio": speed_ratio,
            "consumer_got": cr["got"],
            "consumer_distinct": cr["distinct"],
            "consumer_duplicates": cr["got"] - cr["distinct"],
            "lost_confirmed": lost,
            "final_drain_seconds": t_drained - t_full,
            "queue_stats_after": cr["queue_stats"],
        },
        extra={"targets": targets, "all_targets_met": all_met},
    )


SCENARIOS = [
    Scenario(
        "fast_producer",
        None,
        "MB",
        "max",
        run_fast_producer,
        about="a producer 10x faster than its consumer, held by the memory alarm",
    ),
]
