"""Scenarios over the native wire protocol, with :class:`polymq.Client` as the load generator.

Each scenario has two halves: an orchestrating function run in the parent (``run_*``: start
a fresh core, spawn the load generators, combine their timestamps into one number) and the
``async`` workers it spawns (``producer``, ``consumer``, ...), each in its own process.

Publishing is bounded both by a message count and by a duration: the producer stops at
whichever comes first and reports how many it sent; the parent then tells the consumers how
many to expect (``{"expect": n}``), so a slow build still finishes in bounded time and a fast
one is not cut short.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import time
from typing import Any

from polymq import Client, Message
from polymq_cli.process import tune_gc

from .harness import BenchError, Worker, filesystem_of, fsync_seconds, workers
from .scenario import Context, Result, Scenario

BODY = b"x" * 32
_SPAWN = multiprocessing.get_context("spawn")  # as bench.harness starts its workers


def now() -> float:
    return time.monotonic()


def _tune_gc() -> None:
    """What ``polymq run`` does to its own collector, and what a process that receives at
    these rates should do: with Python's default thresholds a consumer decoding 100k+
    messages a second spends about a third of its CPU in collections of the young
    generation, and, the slowest process of the scenario, lets a backlog build in the core
    (which then pages it: measured, the core's CPU per message 8.7 -> 7.2 us, the consumer's
    CPU 4.5 -> 2.8 s for the same run)."""
    tune_gc()


# =========================================================================================
# workers (each runs in its own process)
# =========================================================================================
async def _publish_for(
    client: Client,
    destination: str,
    *,
    count: int,
    batch: int,
    seconds: float,
    persistent: bool = False,
    progress: Any = None,
    window: int = 0,
) -> tuple[int, float, float]:
    """Fire-and-forget batches (``publish_nowait`` + ``drain``) until ``count`` messages or
    ``seconds`` have gone; returns (sent, first publish time, last flush time). With
    ``window`` and ``progress`` (the consumer's deliveries, in shared memory), at most
    ``window`` messages ahead of the consumer, as the STOMP scenarios' producer."""
    full = [Message(body=BODY, persistent=persistent) for _ in range(batch)]
    sent = 0
    t0 = now()
    stop_at = t0 + seconds
    while sent < count:
        k = min(batch, count - sent)
        client.publish_nowait(destination, full if k == batch else full[:k])
        sent += k
        await asyncio.sleep(0)  # lets the client flush this batch as one frame
        await client.drain()
        if now() >= stop_at:
            break
        if window and progress is not None and sent - progress.value > window:
            # until the consumer is within half a window (polling shared memory, as
            # bench.stomp_load's producer does)
            while sent - progress.value > window // 2 and now() < stop_at:  # noqa: ASYNC110
                await asyncio.sleep(0.002)
    return sent, t0, now()


async def producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    _tune_gc()
    client = await Client.connect(params["host"], params["port"])
    try:
        ch.send(ready=True)
        await ch.recv()  # go
        cpu0 = time.process_time()
        sent, t0, t_sent = await _publish_for(
            client,
            params["destination"],
            count=params["count"],
            batch=params["batch"],
            seconds=params["seconds"],
            progress=params.get("progress"),
            window=params.get("window", 0),
        )
        await client.ping()  # answered after every publish before it was handled
        return {
            "sent": sent,
            "t_first": t0,
            "t_sent": t_sent,
            "t_handled": now(),
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await client.close()


class _Counter:
    """Counts deliveries of one subscription until the expected number is known and reached."""

    __slots__ = ("done", "first", "got", "last", "target")

    def __init__(self) -> None:
        self.got = 0
        self.first = 0.0
        self.last = 0.0
        self.target = math.inf
        self.done = asyncio.Event()

    def expect(self, n: int) -> None:
        self.target = n
        if self.got >= n:
            self.done.set()


async def _drain(
    sub: Any, counter: _Counter, check_body: bool = True, progress: Any = None
) -> None:
    """Count ``sub``'s deliveries into ``counter`` (and every 1,000th into ``progress``,
    shared memory a producer with a window reads)."""
    clock = time.monotonic
    async for d in sub:
        if counter.got == 0:
            counter.first = clock()
            if check_body and d.message.body != BODY:
                raise BenchError(f"unexpected body {d.message.body[:40]!r}")
        counter.got += 1
        counter.last = clock()
        if progress is not None and not counter.got % 1000:
            progress.value = counter.got
        if counter.got >= counter.target:
            counter.done.set()
            return


async def _await_counters(
    ch: Any, counters: list[_Counter], tasks: list[asyncio.Task[None]], limit: float
) -> dict[str, Any]:
    """Wait for the parent's ``expect``, then for every counter to reach it (or time out)."""
    cpu0 = time.process_time()
    msg = await ch.recv()
    expect = int(msg["expect"])
    for c in counters:
        c.expect(expect)
    all_done = asyncio.ensure_future(asyncio.gather(*(c.done.wait() for c in counters)))
    # A drain that fails (the connection was cut) ends the wait at once, not at the deadline;
    # one that finished its count just leaves the set. (A drain whose messages all came
    # before the count was known never returns: all_done is what says it is complete.)
    waits: set[asyncio.Future[Any]] = {all_done, *tasks}
    deadline = time.monotonic() + limit
    while not all_done.done():
        left = deadline - time.monotonic()
        finished, _ = await asyncio.wait(
            waits, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED
        )
        if not finished:
            break  # the deadline
        for f in finished:
            if f is not all_done and not f.cancelled() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        waits -= finished
    complete = all_done.done()
    all_done.cancel()
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
        t.cancel()
    return {
        "expect": expect,
        "complete": complete,
        "got": [c.got for c in counters],
        "t_first": min((c.first for c in counters if c.got), default=None),
        "t_last": max((c.last for c in counters if c.got), default=None),
        "cpu_seconds": time.process_time() - cpu0,
    }


async def consumer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """One auto-ack subscription on a queue; counts until told how many to expect."""
    _tune_gc()
    client = await Client.connect(params["host"], params["port"])
    try:
        sub = await client.subscribe(params["destination"], **params["subscribe"])
        counter = _Counter()
        task = asyncio.ensure_future(_drain(sub, counter, progress=params.get("progress")))
        ch.send(ready=True)
        return await _await_counters(ch, [counter], [task], params["timeout"])
    finally:
        await client.close()


async def pair(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Producer and consumer in one process (two connections, one event loop)."""
    _tune_gc()
    pub = await Client.connect(params["host"], params["port"])
    cons = await Client.connect(params["host"], params["port"])
    try:
        sub = await cons.subscribe(params["destination"], **params["subscribe"])
        counter = _Counter()
        task = asyncio.ensure_future(_drain(sub, counter))
        ch.send(ready=True)
        await ch.recv()  # go
        cpu0 = time.process_time()
        sent, t0, t_sent = await _publish_for(
            pub,
            params["destination"],
            count=params["count"],
            batch=params["batch"],
            seconds=params["seconds"],
        )
        counter.expect(sent)
        try:
            await asyncio.wait_for(counter.done.wait(), params["timeout"])
        finally:
            task.cancel()
        return {
            "sent": sent,
            "t_first": t0,
            "t_sent": t_sent,
            "t_last": counter.last,
            "got": [counter.got],
            "complete": counter.got >= sent,
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await pub.close()
        await cons.close()


async def receipt_producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """``inflight`` concurrent awaited batch publishes of persistent messages, for
    ``seconds``; each receipt means the batch was fsynced."""
    client = await Client.connect(params["host"], params["port"])
    try:
        dest = params["destination"]
        await client.declare(dest, durable=True)
        batch = params["batch"]
        latencies: list[float] = []
        done = 0
        t_last = 0.0
        ch.send(ready=True)
        await ch.recv()  # go
        t0 = now()
        stop_at = t0 + params["seconds"]

        async def one() -> None:
            nonlocal done, t_last
            msgs = [Message(body=BODY, persistent=True) for _ in range(batch)]
            while now() < stop_at:
                t = now()
                r = await client.publish(dest, msgs)
                t_last = now()
                latencies.append(t_last - t)
                if r.count != batch:
                    raise BenchError(f"publish receipt counts {r.count}, not {batch}")
                done += batch

        await asyncio.gather(*(one() for _ in range(params["inflight"])))
        stats = await client.stats(dest)
        latencies.sort()
        return {
            "receipted": done,
            "t_first": t0,
            "t_last": t_last,
            "queue_messages": stats.messages,
            "latency_p50_s": latencies[len(latencies) // 2] if latencies else None,
            "latency_p99_s": latencies[int(len(latencies) * 0.99)] if latencies else None,
        }
    finally:
        await client.close()


async def fanout_subscribers(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """``subs`` subscriptions to one topic over ``connections`` connections."""
    _tune_gc()
    n_conn, n_subs = params["connections"], params["subs"]
    clients = [await Client.connect(params["host"], params["port"]) for _ in range(n_conn)]
    try:
        # Every delivery must arrive: give each subscription room for the whole run in the
        # core, so the slow-consumer policy cannot cut a subscriber that merely lags.
        opts = {"buffer_messages": params["buffer"], "buffer_bytes": 1 << 31}
        subs = [
            await clients[i % n_conn].subscribe(params["destination"], **opts)
            for i in range(n_subs)
        ]
        counters = [_Counter() for _ in subs]
        tasks = [
            asyncio.ensure_future(_drain(s, c, check_body=(i == 0)))
            for i, (s, c) in enumerate(zip(subs, counters, strict=True))
        ]
        ch.send(ready=True)
        return await _await_counters(ch, counters, tasks, params["timeout"])
    finally:
        for c in clients:
            await c.close()


async def idle_subscriber(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """``subs`` subscriptions to distinct topics over ``connections`` connections, issued in
    chunks of ``chunk`` concurrent requests per connection (one frame each)."""
    n_conn, n_subs, chunk = params["connections"], params["subs"], params["chunk"]
    offset = params["offset"]
    clients = [await Client.connect(params["host"], params["port"]) for _ in range(n_conn)]
    try:
        ch.send(ready=True)
        await ch.recv()  # go
        gc.disable()  # a million long-lived objects: the cyclic GC only slows this down
        t0 = now()
        cpu0 = time.process_time()
        per = -(-n_subs // n_conn)

        async def one(ci: int) -> int:
            c = clients[ci]
            lo: int = ci * per
            hi: int = min(n_subs, (ci + 1) * per)
            for start in range(lo, hi, chunk):
                names = range(offset + start, offset + min(hi, start + chunk))
                await asyncio.gather(*(c.subscribe(f"topic/idle.t{i}") for i in names))
            return hi - lo

        counts = await asyncio.gather(*(one(i) for i in range(n_conn)))
        seconds = now() - t0
        ch.send(subscribed=sum(counts), seconds=seconds, cpu_seconds=time.process_time() - cpu0)
        await ch.recv()  # the parent has measured; let go
        return {}
    finally:
        for c in clients:
            await c.close()


# =========================================================================================
# scenarios (run in the parent)
# =========================================================================================
def _addr(b: Any) -> dict[str, Any]:
    return {"host": b.host, "port": b.core_port}


def _ready(ws: list[Worker], timeout: float = 60.0) -> None:
    for w in ws:
        w.expect("ready", timeout)


def run_transient_queue(ctx: Context) -> Result:
    mode = ctx.option("mode", "separate")  # separate | single
    batch = ctx.option("batch", 1000)
    count = ctx.option("count", 100_000 if ctx.quick else 3_000_000)
    seconds = ctx.option("seconds", 1.5 if ctx.quick else 6.0)
    # The consumer must not be cut off as a slow consumer when a burst outruns it: either
    # "drop", which on a queue passes a full subscriber over (messages wait in the queue), or
    # "disconnect" with room for the whole run (the queue moves its backlog into the session).
    policy = ctx.option("slow_policy", "drop")
    subscribe: dict[str, Any] = {"ack_mode": "auto", "slow_policy": policy}
    if policy == "disconnect":
        subscribe["buffer_messages"] = count + 1
        subscribe["buffer_bytes"] = 1 << 31
    # The producer stays at most this many messages ahead of the consumer (0: no limit), as
    # the STOMP scenarios' does: without it the producer outruns the consumer by hundreds of
    # thousands, and the queue pages its backlog past its window (100,000 messages), which
    # is a backlog's cost, not a transient queue's (the backlog scenarios measure that).
    window = ctx.option("window", 50_000)
    timeout = seconds + 60
    dest = "queue/bench.transient"
    with ctx.broker("core") as b, workers() as pool:
        params = {
            **_addr(b),
            "destination": dest,
            "count": count,
            "batch": batch,
            "seconds": seconds,
            "timeout": timeout,
            "subscribe": subscribe,
            "window": window if mode == "separate" else 0,
            "progress": _SPAWN.RawValue("q", 0),
        }
        cpu0 = b.cpu_seconds()
        if mode == "single":
            p = ctx.spawn(pool, "bench.native:pair", params)
            _ready([p])
            p.send(go=True)
            r = p.wait_result(timeout + 30)
            sent, t_first, t_last = r["sent"], r["t_first"], r["t_last"]
            produce_rate = sent / (r["t_sent"] - t_first)
            got = r["got"][0]
            client_cpu = {"client": r["cpu_seconds"]}
        else:
            c = ctx.spawn(pool, "bench.native:consumer", params)
            _ready([c])
            p = ctx.spawn(pool, "bench.native:producer", params)
            _ready([p])
            p.send(go=True)
            pr = p.wait_result(timeout + 30)
            sent, t_first = pr["sent"], pr["t_first"]
            produce_rate = sent / (pr["t_handled"] - t_first)
            c.send(expect=sent)
            r = c.wait_result(timeout + 30)
            t_last, got = r["t_last"], r["got"][0]
            client_cpu = {"producer": pr["cpu_seconds"], "consumer": r["cpu_seconds"]}
        core_cpu = b.cpu_seconds() - cpu0
        if got < sent:
            raise BenchError(f"consumer got {got} of {sent} messages within {timeout:.0f}s")
        elapsed = t_last - t_first
    procs = (
        "one client process (producer and consumer on two connections, one event loop)"
        if mode == "single"
        else "two client processes: one producer, one consumer"
    )
    return Result(
        value=sent / elapsed,
        params={
            "messages": sent,
            "body_bytes": len(BODY),
            "batch": batch,
            "mode": mode,
            "subscribe": subscribe,
            "producer_window": window if mode == "separate" else 0,
            "persistent": False,
            "max_seconds": seconds,
        },
        notes=(
            f"{procs}, each on its own connection; publish_nowait with lists of {batch} "
            "Message + drain()"
            + (
                f", at most {window:,} ahead of the consumer"
                if window and mode == "separate"
                else ""
            )
            + "; counted from the first publish to the last delivery received. "
            f"Producer alone reached {produce_rate:,.0f} msg/s (until the core had handled "
            f"every publish). The core spent {core_cpu / sent * 1e6:.1f} CPU-us per message. "
            f"CPU-s used over the {elapsed:.1f}s: core {core_cpu:.1f}, "
            + ", ".join(f"{k} {v:.1f}" for k, v in client_cpu.items())
            + "."
        ),
        details={
            "seconds": elapsed,
            "producer_msg_per_s": produce_rate,
            "core_cpu_seconds": core_cpu,
            "core_cpu_us_per_message": core_cpu / sent * 1e6,
            **{f"{k}_cpu_seconds": v for k, v in client_cpu.items()},
        },
    )


def run_persistent_receipts(ctx: Context) -> Result:
    batch = ctx.option("batch", 100)
    inflight = ctx.option("inflight", 16)
    seconds = ctx.option("seconds", 1.5 if ctx.quick else 6.0)
    dest = "queue/bench.persistent"
    with ctx.broker("core") as b, workers() as pool:
        params = {
            **_addr(b),
            "destination": dest,
            "batch": batch,
            "inflight": inflight,
            "seconds": seconds,
        }
        p = ctx.spawn(pool, "bench.native:receipt_producer", params)
        _ready([p])
        cpu0 = b.cpu_seconds()
        p.send(go=True)
        r = p.wait_result(seconds + 60)
        core_cpu = b.cpu_seconds() - cpu0
        fs = filesystem_of(str(b.workdir))
        fsync = fsync_seconds(b.workdir)
    elapsed = r["t_last"] - r["t_first"]
    if not r["receipted"]:
        raise BenchError("no publish was receipted")
    if r["queue_messages"] is not None and r["queue_messages"] < r["receipted"]:
        raise BenchError(
            f"{r['receipted']} receipted but the queue holds only {r['queue_messages']}"
        )
    p50, p99 = r["latency_p50_s"], r["latency_p99_s"]
    return Result(
        value=r["receipted"] / elapsed,
        params={
            "batch": batch,
            "inflight_batches": inflight,
            "body_bytes": len(BODY),
            "persistent": True,
            "durable": True,
            "seconds": seconds,
        },
        notes=(
            f"One producer process, {inflight} awaited publish(batch of {batch}) calls in "
            "flight at once on one connection; a receipt comes after the core's store "
            f"committed and fsynced (SQLite WAL, synchronous=FULL, data dir on {fs}; a 4 KiB "
            f"write+fsync there takes {fsync * 1000:.2f} ms median). No consumer. Receipt "
            f"latency per batch p50 {p50 * 1000:.1f} ms, p99 "
            f"{p99 * 1000:.1f} ms; the core used {core_cpu:.1f} CPU-s over {elapsed:.1f}s "
            f"({core_cpu / r['receipted'] * 1e6:.1f} CPU-us per message)."
        ),
        details={
            "receipted": r["receipted"],
            "seconds": elapsed,
            "latency_p50_s": p50,
            "latency_p99_s": p99,
            "core_cpu_seconds": core_cpu,
            "data_dir_filesystem": fs,
            "fsync_median_s": fsync,
        },
    )


def run_topic_fanout(ctx: Context) -> Result:
    n_subs = ctx.option("subscribers", 100)
    n_conn = ctx.option("connections", 4)
    n_procs = ctx.option("subscriber_processes", 1)
    batch = ctx.option("batch", 100)
    count = ctx.option("count", 3_000 if ctx.quick else 20_000)
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 4.0)
    timeout = seconds + 90
    dest = "topic/bench.fanout"
    with ctx.broker("core") as b, workers() as pool:
        subs_ws = []
        for i in range(n_procs):
            share = n_subs // n_procs + (1 if i < n_subs % n_procs else 0)
            params = {
                **_addr(b),
                "destination": dest,
                "subs": share,
                "connections": max(1, n_conn // n_procs),
                "buffer": count + 1,
                "timeout": timeout,
            }
            subs_ws.append(ctx.spawn(pool, "bench.native:fanout_subscribers", params))
        _ready(subs_ws)
        params = {
            **_addr(b),
            "destination": dest,
            "count": count,
            "batch": batch,
            "seconds": seconds,
        }
        p = ctx.spawn(pool, "bench.native:producer", params)
        _ready([p])
        cpu0 = b.cpu_seconds()
        p.send(go=True)
        pr = p.wait_result(timeout)
        sent = pr["sent"]
        for w in subs_ws:
            w.send(expect=sent)
        results = [w.wait_result(timeout + 30) for w in subs_ws]
        core_cpu = b.cpu_seconds() - cpu0
    sub_cpu = sum(r["cpu_seconds"] for r in results)
    got = [g for r in results for g in r["got"]]
    if len(got) != n_subs or min(got) < sent:
        raise BenchError(
            f"not every subscriber got all {sent} messages within {timeout:.0f}s "
            f"(least: {min(got)}, subscribers: {len(got)})"
        )
    t_last = max(r["t_last"] for r in results)
    elapsed = t_last - pr["t_first"]
    deliveries = sent * n_subs
    return Result(
        value=deliveries / elapsed,
        params={
            "subscribers": n_subs,
            "connections": n_conn,
            "subscriber_processes": n_procs,
            "messages": sent,
            "batch": batch,
            "body_bytes": len(BODY),
        },
        notes=(
            f"{n_subs} auto-ack subscriptions on one topic over {n_conn} connections in "
            f"{n_procs} subscriber process(es); one producer process publishes {sent} messages "
            f"(publish_nowait, batches of {batch}). Deliveries/s = messages x subscribers / "
            "(last delivery at the slowest subscriber - first publish). The publisher alone "
            f"took {pr['t_handled'] - pr['t_first']:.2f}s until the core had routed all. "
            f"CPU-s over the {elapsed:.1f}s: core {core_cpu:.1f}, subscriber process(es) "
            f"{sub_cpu:.1f}, publisher {pr['cpu_seconds']:.1f} (the load generators share "
            f"CPU(s) {ctx.plan.load}); the core spent {core_cpu / deliveries * 1e6:.2f} CPU-us "
            "per delivery."
        ),
        details={
            "deliveries": deliveries,
            "seconds": elapsed,
            "core_cpu_seconds": core_cpu,
            "subscriber_cpu_seconds": sub_cpu,
            "publisher_cpu_seconds": pr["cpu_seconds"],
            "deliveries_per_core_cpu_second": deliveries / core_cpu if core_cpu else None,
            "publish_seconds": pr["t_handled"] - pr["t_first"],
        },
    )


def run_idle_subscriptions(ctx: Context) -> Result:
    total = ctx.option("subscriptions", 100_000 if ctx.quick else 1_000_000)
    n_procs = ctx.option("client_processes", 2)
    n_conn = ctx.option("connections", 16)  # the core allows 100,000 per connection
    chunk = ctx.option("chunk", 10_000)
    with ctx.broker("core") as b, workers() as pool:
        ws = []
        per_proc = -(-total // n_procs)
        for i in range(n_procs):
            lo = i * per_proc
            share = max(0, min(total, lo + per_proc) - lo)
            params = {
                **_addr(b),
                "subs": share,
                "connections": max(1, n_conn // n_procs),
                "chunk": chunk,
                "offset": lo,
            }
            ws.append(ctx.spawn(pool, "bench.native:idle_subscriber", params))
        _ready(ws)
        time.sleep(0.5)
        rss_before = b.rss()
        cpu0 = b.cpu_seconds()
        for w in ws:
            w.send(go=True)
        done = [w.expect("subscribed", 240) for w in ws]
        core_cpu = b.cpu_seconds() - cpu0
        subscribed = sum(d["subscribed"] for d in done)
        client_cpu = sum(d["cpu_seconds"] for d in done)
        seconds = max(d["seconds"] for d in done)
        time.sleep(1.0)  # let the allocator settle
        rss_after = b.rss()
        b.check_alive()
        for w in ws:
            w.send(done=True)
        for w in ws:
            w.wait_result(60)
    if subscribed != total:
        raise BenchError(f"only {subscribed} of {total} subscriptions were made")
    per_sub = (rss_after - rss_before) / total
    mb = 1_000_000  # MB, not MiB: the stricter reading of the target
    full = 1_000_000
    scale = (
        ""
        if total >= full
        else f"Only {total:,} subscriptions (the target is for {full:,}): no ratio. "
    )
    return Result(
        comparable=total >= full,
        value=rss_after / mb,
        params={
            "subscriptions": total,
            "connections": n_conn,
            "client_processes": n_procs,
            "chunk": chunk,
            "topic_names": "distinct: topic/idle.t<N>",
        },
        notes=(
            f"{scale}Core RSS after {total:,} idle subscriptions to distinct topics over {n_conn} "
            f"connections ({n_procs} client processes, {chunk:,} concurrent subscribe requests "
            f"per connection at a time). RSS before subscribing (clients connected): "
            f"{rss_before / mb:.1f} MB; growth {per_sub:.0f} bytes per subscription. "
            f"Subscribing took {seconds:.1f}s ({total / seconds:,.0f} subscriptions/s; CPU-s: "
            f"core {core_cpu:.1f}, clients {client_cpu:.1f})."
        ),
        details={
            "rss_before_bytes": rss_before,
            "rss_after_bytes": rss_after,
            "bytes_per_subscription": per_sub,
            "subscribe_seconds": seconds,
            "subscribe_per_s": total / seconds,
            "core_cpu_seconds": core_cpu,
            "client_cpu_seconds": client_cpu,
        },
    )


SCENARIOS = [
    Scenario("native_transient_queue", 150_000, "msg/s", "min", run_transient_queue),
    Scenario("native_persistent_queue_receipts", 40_000, "msg/s", "min", run_persistent_receipts),
    Scenario("topic_fanout_100", 500_000, "deliveries/s", "min", run_topic_fanout),
    Scenario("idle_subscriptions_1m", 300, "MB", "max", run_idle_subscriptions),
]
