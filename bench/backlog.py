"""A persistent backlog larger than the queue's window, a restart under it, and its drain
(issue 17: "a 10M x 1 KB persistent backlog in one queue with the core's RSS <= 1 GB, then
drained at >= 50% of the in-memory drain rate; memory per queued message reported" and
"restart with a 1M-message backlog: first delivery <= 5 s after start").

Scenario ``backlog``, on a fresh ``polymq core`` (its own data directory), one durable queue:

1. **publish**: one producer process publishes ``messages`` persistent 1 KB messages (the
   first 8 bytes of each body are its index) in awaited batches, ``inflight`` at a time; each
   receipt means the batch is on disk. The core's RSS is sampled every 0.25 s (psutil).
2. **restart**: SIGTERM, then the same command on the same data directory; timed from the
   new process's start to its ports file (written once recovery ended, i.e. ``/readyz``
   ready; checked with a GET) and to the first delivery to a consumer that was waiting for
   the port.
3. **drain**: that consumer (``prefetch`` unacked, ``client-individual`` acks, one ack per
   message) takes every message; the order (indexes increasing) and the count are checked,
   then the queue's stats must say 0 messages.
4. **in memory**: the same publish and drain on another fresh core with
   ``POLYMQ_QUEUE_WINDOW_MESSAGES=0`` (no paging) and ``memory_messages`` (fewer) messages:
   "the in-memory drain rate", the reference of the 50% target, and its RSS per message.

5. **RabbitMQ** (:mod:`bench.backlog_rabbit`; ``rabbitmq_messages``, 200k, 0 to skip, 0 with
   ``--quick``): the same publish, restart and drain on a private RabbitMQ node.

``--backlog-messages N`` (or ``BENCH_BACKLOG_MESSAGES``, or ``--set backlog.messages=N``)
sets the backlog (``--set backlog.window=N``: the paged core's window in messages, for a
backlog too small to pass the default one); the free space of the temporary directory is
checked first. The targets apply at their own scale (10M for RSS and drain, 1M for the
restart): a smaller run reports each figure and its verdict but marks it ``at_scale: false``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import urllib.request
from typing import Any

from polymq import Client, ConnectionClosed, Message, Unavailable

from .harness import BenchError, Broker, RssSampler, workers
from .scenario import Context, Result, Scenario, Skipped

BODY_BYTES = 1024
# What a stored 1 KB message takes on disk (the data directory's bytes per message, as this
# scenario reports them in stored_bytes_per_message): 1.4 KB since schema version 5 (a rowid
# messages table), 4.7 KB before (WITHOUT ROWID, where each 1 KB row spilled into an overflow
# page of its own; see polymq_core.store.schema). Checked (with some slack for the WAL) before a
# run.
STORED_BYTES = 1_450
DISK_SLACK = 1.15
GB = 1_000_000_000  # GB, not GiB: the stricter reading of the target
DEST = "queue/bench.backlog"


def now() -> float:
    return time.monotonic()


def make_body(i: int, filler: bytes) -> bytes:
    return i.to_bytes(8, "big") + filler


def index_of(body: bytes) -> int:
    return int.from_bytes(body[:8], "big")


# =========================================================================================
# workers (each runs in its own process)
# =========================================================================================
async def connect(host: str, port: int, deadline: float) -> Client:
    """Connect, retrying while the core is starting (``unavailable``) until ``deadline``."""
    while True:
        try:
            return await Client.connect(host, port)
        except (ConnectionClosed, Unavailable):
            if now() >= deadline:
                raise
            await asyncio.sleep(0.05)


async def publisher(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """``count`` persistent messages to a durable queue, awaited batches ``inflight`` at a
    time (every receipt: the batch is durable)."""
    client = await Client.connect(params["host"], params["port"])
    try:
        dest = params["destination"]
        await client.declare(dest, durable=True)
        ch.send(ready=True)
        await ch.recv()  # go
        count, batch = params["count"], params["batch"]
        filler = b"x" * (params["body_bytes"] - 8)
        next_i = 0
        confirmed = 0
        cpu0 = time.process_time()
        t0 = now()

        async def one() -> None:
            nonlocal next_i, confirmed
            while next_i < count:
                lo = next_i
                hi = next_i = min(count, lo + batch)
                msgs = [Message(body=make_body(i, filler), persistent=True) for i in range(lo, hi)]
                r = await client.publish(dest, msgs)
                if r.count != hi - lo:
                    raise BenchError(f"publish receipt counts {r.count}, not {hi - lo}")
                confirmed += hi - lo

        await asyncio.gather(*(one() for _ in range(params["inflight"])))
        t1 = now()
        stats = await client.stats(dest)
        return {
            "confirmed": confirmed,
            "t_first": t0,
            "t_last": t1,
            "queue_stats": stats.to_json(),
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await client.close()


async def drainer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Waits for ``{"port", "expect"}``, connects (retrying while the core starts),
    subscribes with ``prefetch`` and client-individual acks, acks every message, checks the
    order, until ``expect`` distinct messages came; then the queue's stats."""
    ch.send(ready=True)
    go = await ch.recv()
    t_go = now()
    expect = int(go["expect"])
    deadline = t_go + params["timeout"]
    client = await connect(params["host"], go["port"], t_go + 30)
    try:
        t_connected = now()
        sub = await client.subscribe(
            params["destination"], ack_mode="client-individual", prefetch=params["prefetch"]
        )
        seen = bytearray(expect)
        got = distinct = out_of_order = redelivered = 0
        last = -1
        t_first = t_last = 0.0
        cpu0 = time.process_time()
        while distinct < expect:
            left = deadline - now()
            if left <= 0:
                break
            try:
                d = await sub.get(timeout=min(left, params["idle_timeout"]))
            except TimeoutError:
                break
            if not got:
                t_first = now()
            got += 1
            i = index_of(d.message.body)
            d.ack()
            if i < last:
                out_of_order += 1
            last = i
            if d.message.redelivered:
                redelivered += 1
            if 0 <= i < expect and not seen[i]:
                seen[i] = 1
                distinct += 1
        t_last = now()
        await client.ping()  # every ack was sent before it (and handled before its answer)
        stats = await client.stats(params["destination"])
        return {
            "expect": expect,
            "got": got,
            "distinct": distinct,
            "out_of_order": out_of_order,
            "redelivered": redelivered,
            "t_go": t_go,
            "t_connected": t_connected,
            "t_first": t_first,
            "t_last": t_last,
            "queue_stats": stats.to_json(),
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await client.close()


# =========================================================================================
# the scenario (run in the parent)
# =========================================================================================
def _readyz(b: Broker) -> int:
    try:
        with urllib.request.urlopen(f"{b.url('admin')}/readyz", timeout=5) as r:
            return int(r.status)
    except OSError as exc:
        return int(getattr(exc, "code", 0) or 0)


def _check_disk(messages: int) -> dict[str, Any]:
    need = int(messages * STORED_BYTES * DISK_SLACK)
    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free
    if free < need:
        raise Skipped(
            f"a backlog of {messages:,} x {BODY_BYTES} B persistent messages needs about "
            f"{need / GB:.1f} GB free in {where} ({messages:,} x ~{STORED_BYTES} B as stored, x "
            f"{DISK_SLACK} for the WAL); only {free / GB:.1f} GB is free. Use a "
            "smaller --backlog-messages or point TMPDIR at a larger disk."
        )
    return {"tmp_dir": where, "free_bytes": free, "needed_bytes": need}


def _publish(ctx: Context, b: Broker, pool: list[Any], params: dict[str, Any]) -> dict[str, Any]:
    p = ctx.spawn(pool, "bench.backlog:publisher", {**params, "host": b.host, "port": b.core_port})
    p.expect("ready", 60)
    p.send(go=True)
    r = p.wait_result(params["timeout"])
    if r["confirmed"] != params["count"]:
        raise BenchError(f"only {r['confirmed']} of {params['count']} publishes were receipted")
    return r


def _drained(r: dict[str, Any], expect: int, what: str) -> None:
    left = r["queue_stats"].get("messages")
    if r["distinct"] < expect:
        raise BenchError(
            f"{what}: the consumer got {r['distinct']:,} of {expect:,} distinct messages "
            f"({r['got']:,} deliveries); the queue's stats: {r['queue_stats']}"
        )
    if left:
        raise BenchError(f"{what}: {left} messages left in the queue after the drain: {r}")


def _run_in_memory(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Publish and drain ``params["count"]`` messages on a core that pages nothing."""
    env = {"POLYMQ_QUEUE_WINDOW_MESSAGES": "0"}
    with ctx.broker("core", env=env) as b, workers() as pool:
        d = ctx.spawn(pool, "bench.backlog:drainer", {**params, "host": b.host})
        d.expect("ready", 60)
        time.sleep(0.5)
        rss0 = b.rss()
        sampler = RssSampler(b.pid).start()
        try:
            pr = _publish(ctx, b, pool, params)
            time.sleep(1.0)
            rss_full = b.rss()
            cpu0 = b.cpu_seconds()
            d.send(port=b.core_port, expect=params["count"])
            r = d.wait_result(params["timeout"] + 60)
            core_cpu = b.cpu_seconds() - cpu0
        finally:
            sampler.stop()
    _drained(r, params["count"], "in memory")
    n = params["count"]
    seconds = r["t_last"] - r["t_first"]
    return {
        "messages": n,
        "publish_msg_per_s": n / (pr["t_last"] - pr["t_first"]),
        "drain_msg_per_s": n / seconds,
        "drain_seconds": seconds,
        "rss_before_bytes": rss0,
        "rss_full_bytes": rss_full,
        "peak_rss_bytes": sampler.peak,
        "rss_per_queued_message_bytes": (rss_full - rss0) / n,
        "queue_stats_when_full": pr["queue_stats"],
        "out_of_order": r["out_of_order"],
        "drain_core_cpu_seconds": core_cpu,
        "drain_consumer_cpu_seconds": r["cpu_seconds"],
    }


def _rabbit_note(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"RabbitMQ side {r['status']}: {r.get('reason') or r.get('error')}."
    return (
        f"RabbitMQ (private node, classic queue v2, aio-pika, {r['messages']:,} messages): "
        f"publish {r['publish_msg_per_s']:,.0f} msg/s, {r['rss_per_queued_message_bytes']:.0f} "
        f"B RSS per queued message, first delivery {r['restart_first_delivery_seconds']:.1f}s "
        f"after its start, drain {r['drain_msg_per_s']:,.0f} msg/s."
    )


def run_backlog(ctx: Context) -> Result:
    env_default = os.environ.get("BENCH_BACKLOG_MESSAGES")
    default = int(env_default) if env_default else (20_000 if ctx.quick else 1_000_000)
    n = ctx.option("messages", default)
    n_mem = ctx.option("memory_messages", min(n, 20_000 if ctx.quick else 200_000))
    batch = ctx.option("batch", 500)
    inflight = ctx.option("inflight", 8)
    prefetch = ctx.option("prefetch", 1000)
    restart = ctx.option("restart", True)
    n_rabbit = ctx.option("rabbitmq_messages", 0 if ctx.quick else min(n, 200_000))
    disk = _check_disk(n)
    timeout = max(120.0, n / 2_000)  # a floor of 2,000 msg/s before giving up
    params = {
        "destination": DEST,
        "body_bytes": BODY_BYTES,
        "batch": batch,
        "inflight": inflight,
        "prefetch": prefetch,
        "timeout": timeout,
        "idle_timeout": 60.0,
    }

    window = ctx.option("window", 0)  # the paged core's queue window (0: its default)
    paged_env = {"POLYMQ_QUEUE_WINDOW_MESSAGES": str(window)} if window else None
    with ctx.broker("core", env=paged_env) as b, workers() as pool:
        d = ctx.spawn(pool, "bench.backlog:drainer", {**params, "host": b.host})
        d.expect("ready", 60)
        time.sleep(0.5)
        rss0 = b.rss()
        sampler = RssSampler(b.pid).start()
        try:
            cpu0 = b.cpu_seconds()
            pr = _publish(ctx, b, pool, {**params, "count": n})
            publish_core_cpu = b.cpu_seconds() - cpu0
            t_published = now()
            time.sleep(1.0)
            rss_full = b.rss()
            peak_publish = sampler.peak
            data_files = {
                str(f.relative_to(b.proc.data_dir)): f.stat().st_size
                for f in b.proc.data_dir.rglob("*")
                if f.is_file()
            }
            data_bytes = sum(data_files.values())
            stop_seconds = start_seconds = readyz = None
            if restart:
                t_stop = now()
                code = b.proc.stop(timeout=120)
                stop_seconds = now() - t_stop
                if code != 0:
                    raise BenchError(f"the core exited {code} on SIGTERM:\n{b.log_tail()}")
                t_start = now()
                b.proc.start(timeout=120)
                start_seconds = now() - t_start
                b = Broker(b.proc, b.workdir, ctx.plan.broker)
                b.pin()
                sampler.follow(b.pid)
                d.send(port=b.core_port, expect=n)
                readyz = _readyz(b)
            else:
                t_start = now()
                d.send(port=b.core_port, expect=n)
            rss_restarted = b.rss()
            cpu0 = b.cpu_seconds()
            r = d.wait_result(timeout + 60)
            drain_core_cpu = b.cpu_seconds() - cpu0
            peak_drain = sampler.peak_between(t_published, now())
        finally:
            sampler.stop()
    _drained(r, n, "paged backlog")

    mem = _run_in_memory(ctx, {**params, "count": n_mem})
    rabbit: dict[str, Any] = {"status": "skipped", "reason": "rabbitmq_messages=0"}
    if n_rabbit:
        from .backlog_rabbit import run_rabbitmq

        try:
            rabbit = run_rabbitmq(ctx, n_rabbit, params)
        except Exception as exc:  # the RabbitMQ side is a reference: polymq's figures stand
            rabbit = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}

    publish_rate = n / (pr["t_last"] - pr["t_first"])
    drain_seconds = r["t_last"] - r["t_first"]
    drain_rate = n / drain_seconds
    ratio = drain_rate / mem["drain_msg_per_s"]
    per_msg = (rss_full - rss0) / n
    first_delivery = r["t_first"] - t_start
    peak = sampler.peak

    targets = {
        "rss_le_1gb": {
            "target": "core peak RSS <= 1 GB with a 10M x 1 KB backlog",
            "value_bytes": peak,
            "met": peak <= GB,
            "at_scale": n >= 10_000_000,
        },
        "drain_ge_half_in_memory": {
            "target": "paged drain rate >= 50% of the in-memory drain rate",
            "value_ratio": round(ratio, 3),
            "met": ratio >= 0.5,
            "at_scale": n >= 10_000_000,
        },
        "restart_first_delivery_le_5s": {
            "target": "first delivery <= 5 s after start with a 1M-message backlog",
            "value_seconds": round(first_delivery, 3) if restart else None,
            "met": first_delivery <= 5.0 if restart else None,
            "at_scale": restart and n >= 1_000_000,
        },
    }
    verdicts = [t["met"] for t in targets.values()]
    all_met = all(v is True for v in verdicts)
    scale = (
        ""
        if n >= 10_000_000
        else f"{n:,} messages, not the target's 10M: the RSS and drain verdicts are at this scale. "
    )
    restart_note = (
        f"Restart: SIGTERM took {stop_seconds:.1f}s; the new core was ready (ports file, "
        f"/readyz {readyz}) {start_seconds:.2f}s after its start and delivered its first message "
        f"{first_delivery:.2f}s after it. "
        if restart
        else "No restart (restart=false). "
    )
    return Result(
        value=drain_rate,
        target=0.5 * mem["drain_msg_per_s"],
        comparable=n >= 10_000_000,
        verdict=True,
        met=all_met if n >= 10_000_000 else None,
        params={
            "messages": n,
            "memory_messages": n_mem,
            "body_bytes": BODY_BYTES,
            "persistent": True,
            "durable": True,
            "batch": batch,
            "inflight_batches": inflight,
            "prefetch": prefetch,
            "ack_mode": "client-individual",
            "restart": restart,
            "rabbitmq_messages": n_rabbit,
            "queue_window": "default: 100000 messages or 32 MiB (bodies plus 512 B each)",
        },
        notes=(
            f"{scale}One durable queue on a fresh polymq core: {n:,} persistent {BODY_BYTES} B "
            f"messages published at {publish_rate:,.0f} msg/s (awaited batches of {batch}, "
            f"{inflight} in flight); core RSS {rss0 / 1e6:.0f} MB before, {rss_full / 1e6:.0f} "
            f"MB with the backlog ({per_msg:.1f} B per queued message), peak {peak / 1e6:.0f} "
            f"MB over the run. {restart_note}Drained by one consumer (prefetch {prefetch}, one "
            f"ack per message) at {drain_rate:,.0f} msg/s; in memory (window 0, "
            f"{n_mem:,} messages) {mem['drain_msg_per_s']:,.0f} msg/s: ratio {ratio:.2f}. "
            "The value is the paged drain rate; the target half the in-memory one. "
            + _rabbit_note(rabbit)
        ),
        details={
            "publish_msg_per_s": publish_rate,
            "publish_seconds": pr["t_last"] - pr["t_first"],
            "publish_core_cpu_seconds": publish_core_cpu,
            "queue_stats_when_full": pr["queue_stats"],
            "data_dir_bytes_when_full": data_bytes,
            "data_dir_files_when_full": data_files,
            "stored_bytes_per_message": data_bytes / n,
            "rss_before_bytes": rss0,
            "rss_full_bytes": rss_full,
            "rss_per_queued_message_bytes": per_msg,
            "peak_rss_publish_bytes": peak_publish,
            "peak_rss_drain_bytes": peak_drain,
            "peak_rss_bytes": peak,
            "restart_stop_seconds": stop_seconds,
            "restart_ready_seconds": start_seconds,
            "restart_readyz_status": readyz,
            "restart_first_delivery_seconds": first_delivery,
            "rss_after_restart_bytes": rss_restarted,
            "drain_msg_per_s": drain_rate,
            "drain_seconds": drain_seconds,
            "drain_out_of_order": r["out_of_order"],
            "drain_redelivered": r["redelivered"],
            "drain_deliveries": r["got"],
            "drain_core_cpu_seconds": drain_core_cpu,
            "drain_consumer_cpu_seconds": r["cpu_seconds"],
            "in_memory": mem,
            "rabbitmq": rabbit,
            "drain_ratio_to_in_memory": ratio,
            "disk": disk,
        },
        extra={"targets": targets, "all_targets_met": all_met},
    )


SCENARIOS = [
    Scenario(
        "backlog",
        None,
        "msg/s",
        "min",
        run_backlog,
        about="a persistent backlog past the queue window: RSS, restart, drain vs in memory",
    ),
]
