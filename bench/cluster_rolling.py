"""A rolling restart of a three-node replicated core under load (issue 28: "a rolling restart
of all three nodes: the longest publish stall per node restart <= 1 s, no confirmed message
lost").

Scenario ``cluster_rolling``, on three fresh ``polymq run --peers`` nodes
(:class:`bench.cluster_nodes.PolymqCluster`): one durable queue in each shard (so every
node leads some of them), one load process (:func:`rolling_loader`) with two failover
clients (``polymq.Client.connect([n1, n2, n3])``): a publisher connected to n1 that
publishes one persistent message to every queue every ``interval`` (20 ms), each publish
awaited apart (the first 8 bytes of each body its index), and a consumer connected to n2
that takes every queue with individual acks. Then, node after node (n1, n2, n3): SIGTERM
(a graceful stop: docs/cluster.md, "Stopping a node"), the node started again on the same
ports and data dir, the cluster ready again (every node ready and agreeing on the leaders),
then ``settle`` seconds more (25: the balancer hands a shard back to the restarted node
20 s after the takeover at the earliest, and that move is part of the restart too).

Measured for each restart, from its SIGTERM to the end of its settle: the **longest stall**,
the longer of the longest gap (per queue, the longest time with no publish confirmed; the
maximum over the queues) and the longest a single publish took (a publisher that awaits each
confirm waits that long), the slowest publishes, those that failed, and how long the stop,
the start and the cluster's readiness took. At the end the publisher stops, the consumer
drains, and every confirmed index must have been consumed (``lost``: confirmed and never
consumed; ``duplicates``: consumed more than once, each time flagged redelivered or not).
``value`` is the longest stall over all restarts; ``met``: <= 1 s, nothing lost, no publish
failed.

For each restart its **slowest publish** is explained from the nodes' logs (``worst``): its
queue and shard, when it began and ended (seconds after the SIGTERM), who led the shard
before, and the leadership events of every node from 2 s before it began to its end
(balancer moves, ``handing its lead``; stops' step-downs; takeovers; deposals; JetStream's
``new stream leader`` lines from each nats-server log; ``other_shards``: those of the
other shards meanwhile), with ``balancer_move`` and ``election`` said apart: a new stream
leader that no step-down (a balancer move or a stop) asked for within 2 s before is an
election. ``moves`` lists every balancer move in the
restart's window. The nodes log at INFO for this (``log_level``).

``--set cluster_rolling.KEY=VALUE``: ``interval``, ``settle``, ``body_bytes``,
``log_level``, ``keep_logs``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import itertools
import re
import time
from pathlib import Path
from typing import Any

from polymq import Client, Message

from .cluster_nodes import SHARDS, PolymqCluster, polymq_cluster, queue_in_shard
from .harness import BenchError, workers
from .scenario import Context, Result, Scenario

__all__ = ["SCENARIOS", "rolling_loader"]

STALL_GOAL = 1.0  # seconds


async def rolling_loader(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Publish to every queue every ``interval`` and consume them all until told to stop;
    then drain and say what was confirmed and what was consumed."""
    addresses: list[str] = params["addresses"]
    dests = [f"queue/{q}" for q in params["queues"]]
    interval = float(params["interval"])
    pad = b"x" * max(0, int(params["body_bytes"]) - 8)
    timeout = float(params["attempt_timeout"])
    rt = float(params["reconnect_timeout"])
    pub = await Client.connect(addresses, reconnect_timeout=rt)
    con = await Client.connect(addresses[1:] + addresses[:1], reconnect_timeout=rt)
    seen: collections.Counter[int] = collections.Counter()
    redelivered = [0]
    drained = asyncio.Event()  # publishing stopped, and every confirmed index consumed

    async def drain(sub: Any) -> None:
        async for d in sub:
            seen[int.from_bytes(d.message.body[:8], "big")] += 1
            if d.message.redelivered:
                redelivered[0] += 1
            d.ack()
            if stop.is_set() and not tasks and confirmed <= seen.keys():
                drained.set()

    confirms: list[tuple[int, float, float]] = []  # queue, begun, confirmed
    failures: list[tuple[int, float, float, str]] = []
    confirmed: set[int] = set()
    stop = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    async def one(q: int, index: int) -> None:
        t0 = time.monotonic()
        body = index.to_bytes(8, "big") + pad
        try:
            await asyncio.wait_for(
                pub.publish(dests[q], [Message(body=body, persistent=True)]), timeout
            )
        except Exception as exc:
            failures.append((q, t0, time.monotonic(), f"{type(exc).__name__}: {exc}"[:160]))
            return
        confirms.append((q, t0, time.monotonic()))
        confirmed.add(index)

    async def control() -> None:
        while True:
            msg = await ch.recv()
            if msg.get("stop"):
                stop.set()
                return

    for dest in dests:
        await pub.declare(dest, durable=True)
    subs = [await con.subscribe(d, ack_mode="client-individual", prefetch=200) for d in dests]
    drains = [asyncio.ensure_future(drain(s)) for s in subs]
    ctl = asyncio.ensure_future(control())
    ch.send(ready=True)
    index = 0
    try:
        while not stop.is_set():
            for q in range(len(dests)):
                t = asyncio.ensure_future(one(q, index))
                index += 1
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            await asyncio.sleep(interval)
        if tasks:
            await asyncio.wait(list(tasks), timeout=timeout + 5)
        if confirmed <= seen.keys():
            drained.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drained.wait(), float(params["drain_timeout"]))
    finally:
        ctl.cancel()
        for t in [*drains, *tasks]:
            t.cancel()
        for c in (pub, con):
            with contextlib.suppress(Exception):
                await c.close()
    lost = sorted(confirmed - seen.keys())
    return {
        "published": index,
        "confirmed": len(confirmed),
        "failed": len(failures),
        "failures": failures[:20],
        "consumed_distinct": len(seen),
        "deliveries": sum(seen.values()),
        "duplicates": sum(1 for n in seen.values() if n > 1),
        "redelivered": redelivered[0],
        "lost": len(lost),
        "lost_indexes": lost[:20],
        "confirms": confirms,
        "publisher_reconnects": pub.reconnects,
        "consumer_reconnects": con.reconnects,
    }


def _stalls(
    confirms: list[tuple[int, float, float]], queues: int, t0: float, t1: float
) -> dict[str, Any]:
    """Within [t0, t1]: per queue, the longest time with no publish confirmed (from the
    last confirm before t0, or t0, to the first at or after t1, or t1); the longest a
    publish begun in the window took."""
    longest: dict[int, float] = {}
    for q in range(queues):
        ends = sorted(e for qq, _, e in confirms if qq == q)
        before = [e for e in ends if e < t0]
        points = [before[-1] if before else t0, *(e for e in ends if t0 <= e <= t1)]
        after = [e for e in ends if e > t1]
        points.append(after[0] if after else t1)
        longest[q] = max(b - a for a, b in itertools.pairwise(points))
    took = [(e - b, q, b) for q, b, e in confirms if t0 <= b <= t1]
    worst = max(longest, key=lambda q: longest[q])
    slow = sorted((t for t in took if t[0] > STALL_GOAL), reverse=True)[:10]
    return {
        "longest_gap_s": round(longest[worst], 3),
        "longest_gap_queue": worst,
        "gap_by_queue_s": {q: round(v, 3) for q, v in longest.items()},
        "longest_publish_s": round(max(took)[0], 3) if took else None,
        # (took, queue, begun after the SIGTERM), the slowest first
        "slow_publishes": [(round(d, 3), q, round(b - t0, 3)) for d, q, b in slow],
    }


# leadership events in the nodes' logs: (pattern, kind); group 1 the shard, group 2 a detail
_EVENTS = [
    (re.compile(r"shard (\d+): handing its lead to node (\S+ \(.+\))"), "move"),
    (re.compile(r"shard (\d+): no longer led by this node \((.+)\)"), "let go"),
    (re.compile(r"SHARD_(\d+): this node leads from entry (\d+)"), "took over"),
    (re.compile(r"SHARD_(\d+): deposed: (.+)"), "deposed"),
    (re.compile(r"new stream leader for '.*SHARD_(\d+)'()"), "stream leader"),
]
_POLYMQ_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_NATS_TIME = re.compile(r"^\[\d+\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) ")
_ASKED_WITHIN = 2.0  # seconds: a new stream leader this soon after a step-down was asked for


def _log_events(cluster: PolymqCluster, clock: float) -> list[tuple[float, str, int, str, str]]:
    """Every node's leadership events, (monotonic time, node, shard, kind, detail), in
    order; ``clock``: wall-clock time less monotonic time (the logs say local time)."""
    out: list[tuple[float, str, int, str, str]] = []
    for node in cluster.nodes:
        paths = [(node.workdir / "run.log", _POLYMQ_TIME, "%Y-%m-%d %H:%M:%S,%f")]
        nats = node.workdir.rglob("nats-server.log")
        paths += [(p, _NATS_TIME, "%Y/%m/%d %H:%M:%S.%f") for p in nats]
        for path, stamp, fmt in paths:
            for line in _lines(path):
                m = stamp.match(line)
                if m is None:
                    continue
                for pattern, kind in _EVENTS:
                    e = pattern.search(line)
                    if e is not None:
                        t = datetime.datetime.strptime(m.group(1), fmt).timestamp() - clock
                        out.append((t, node.id, int(e.group(1)), kind, e.group(2)[:80]))
                        break
    return sorted(out)


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def _elections(events: list[tuple[float, str, int, str, str]]) -> set[int]:
    """The indexes of the ``stream leader`` events no step-down asked for: no balancer move
    of that shard and no stop's letting it go within _ASKED_WITHIN seconds before."""
    out = set()
    for k, (t, _, shard, kind, _) in enumerate(events):
        if kind != "stream leader":
            continue
        asked = any(
            s == shard and kd in ("move", "let go") and t - _ASKED_WITHIN <= tt <= t
            for tt, _, s, kd, _ in events
        )
        if not asked:
            out.add(k)
    return out


def _explain(
    row: dict[str, Any],
    confirms: list[tuple[int, float, float]],
    events: list[tuple[float, str, int, str, str]],
    t0: float,
    t1: float,
) -> None:
    """Add to a restart's ``row`` its slowest publish (``worst``) and what the logs say
    about its shard around it, and every balancer move in the window (``moves``)."""
    elected = _elections(events)

    def rel(t: float) -> float:
        return round(t - t0, 3)

    def shown(k: int) -> dict[str, Any]:
        t, node, shard, kind, detail = events[k]
        kind = "election" if k in elected else kind
        return {"t": rel(t), "node": node, "shard": shard, "kind": kind, "detail": detail}

    row["moves"] = [shown(k) for k, e in enumerate(events) if e[3] == "move" and t0 <= e[0] <= t1]
    took = [(e - b, q, b, e) for q, b, e in confirms if t0 <= b <= t1]
    if not took:
        return
    _, q, begun, ended = max(took)
    during = [k for k, e in enumerate(events) if begun - _ASKED_WITHIN <= e[0] <= ended]
    near = [k for k in during if events[k][2] == q]
    row["worst"] = {
        "queue": q,
        "shard": q,  # (queue q is made in shard q: queue_in_shard)
        "begun_s": rel(begun),
        "ended_s": rel(ended),
        "took_s": round(ended - begun, 3),
        "led_before": row["leaders_before"].get(q),
        "events": [shown(k) for k in near],
        "balancer_move": any(events[k][3] == "move" for k in near),
        "election": any(k in elected for k in near),
        # (the other shards' events meanwhile: a node stopping or starting, a move)
        "other_shards": [shown(k) for k in during if events[k][2] != q],
    }


def _restart(cluster: PolymqCluster, index: int, settle: float) -> dict[str, Any]:
    node = cluster.nodes[index]
    before = cluster.wait_ready(120)
    led = sorted(s for s, n in before.items() if n is node)
    t0 = time.monotonic()
    node.stop(timeout=60)
    t_gone = time.monotonic()
    cluster.start_nodes([node])
    t_up = time.monotonic()
    after = cluster.wait_ready(120)
    t_ready = time.monotonic()
    time.sleep(settle)
    t1 = time.monotonic()
    final = cluster.wait_ready(120)
    return {
        "node": node.id,
        "led_before": led,
        "leaders_before": {s: n.id for s, n in before.items()},
        "leaders_after_ready": {s: n.id for s, n in after.items()},
        "leaders_after_settle": {s: n.id for s, n in final.items()},
        "stop_s": round(t_gone - t0, 3),
        "start_s": round(t_up - t_gone, 3),
        "ready_after_start_s": round(t_ready - t_up, 3),
        "window": (t0, t1),
    }


def run_cluster_rolling(ctx: Context) -> Result:
    interval = float(ctx.option("interval", 0.02))
    settle = float(ctx.option("settle", 5.0 if ctx.quick else 25.0))
    queues = [queue_in_shard(s, "bench.rolling") for s in range(SHARDS)]
    params: dict[str, Any] = {
        "queues": queues,
        "interval": interval,
        "body_bytes": int(ctx.option("body_bytes", 256)),
        "attempt_timeout": 60.0,
        "reconnect_timeout": 120.0,
        "drain_timeout": 90.0,
    }
    with (
        polymq_cluster(
            3,
            ctx.plan.broker,
            str(ctx.option("log_level", "INFO")),
            keep=bool(ctx.option("keep_logs", False)),
        ) as cluster,
        workers() as pool,
    ):
        cluster.wait_ready(120)
        clock = time.time() - time.monotonic()
        params["addresses"] = [f"127.0.0.1:{n.ports['core']}" for n in cluster.nodes]
        w = ctx.spawn(pool, "bench.cluster_rolling:rolling_loader", params)
        w.expect("ready", 60)
        time.sleep(min(settle, 3.0))  # steady publishing and consuming first
        restarts = [_restart(cluster, i, settle) for i in range(len(cluster.nodes))]
        w.send(stop=True)
        r = w.wait_result(params["attempt_timeout"] + params["drain_timeout"] + 60)
        events = _log_events(cluster, clock)
    confirms = [(int(q), float(b), float(e)) for q, b, e in r.pop("confirms")]
    for row in restarts:
        t0, t1 = row.pop("window")
        row.update(_stalls(confirms, len(queues), t0, t1))
        _explain(row, confirms, events, t0, t1)
        # a publisher that waits for each confirm stalls as long as its slowest publish
        row["longest_stall_s"] = max(row["longest_gap_s"], row["longest_publish_s"] or 0.0)
        row["failed_publishes"] = sum(1 for f in r["failures"] if t0 <= f[1] <= t1)
    if not confirms:
        raise BenchError(f"no publish was confirmed: {r}")
    worst = max(row["longest_stall_s"] for row in restarts)
    met = worst <= STALL_GOAL and r["lost"] == 0 and r["failed"] == 0
    stalls = ", ".join(f"{row['node']} {row['longest_stall_s']:.2f} s" for row in restarts)
    return Result(
        value=worst,
        params={**params, "settle": settle, "nodes": 3},
        notes=(
            f"Rolling restart (SIGTERM, start, ready, {settle:g} s) of three nodes, one by "
            f"one, while a failover client published one persistent {params['body_bytes']} B "
            f"message to each of {len(queues)} durable queues (one per shard) every "
            f"{interval * 1000:g} ms and another consumed them: longest stall per restart "
            f"{stalls}; {r['confirmed']} confirmed, {r['failed']} failed, {r['lost']} "
            f"confirmed and never consumed, {r['duplicates']} consumed twice "
            f"({r['redelivered']} deliveries flagged redelivered)."
        ),
        details={"restarts": restarts, "load": r},
        verdict=True,
        met=met,
        extra={
            "targets": {
                "longest_stall_s": {"goal": f"<= {STALL_GOAL:g} s", "value": worst},
                "lost_confirmed": {"goal": 0, "value": r["lost"]},
            }
        },
    )


SCENARIOS = [
    Scenario(
        "cluster_rolling",
        STALL_GOAL,
        "s",
        "max",
        run_cluster_rolling,
        about="rolling restart of three nodes under load: longest publish stall, lost messages",
    ),
]
