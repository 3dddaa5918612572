"""A persistent backlog larger than memory in the replicated core (issue 28: "a 3-node 10M x
1 KB backlog: each node's peak RSS <= 1 GB, drain rate >= 50% of the in-memory rate").

Scenario ``cluster_backlog``, on three fresh ``polymq run --peers`` nodes
(:class:`bench.cluster_nodes.PolymqCluster`, their queue window the default 100,000
messages or 32 MiB, bodies plus 512 B each; ``--set cluster_backlog.window=N`` sets
another), one durable queue in a shard led by node L:

1. **publish**: one producer process (:func:`bench.backlog.publisher`) connected to L
   publishes ``count`` persistent 1 KB messages (the first 8 bytes of each body its index)
   in awaited batches, ``inflight`` at a time: each receipt means the batch is committed to
   the log (a majority, fsynced). Every node's polymq and nats-server RSS is sampled every
   0.25 s throughout.
2. **drain**: one consumer (:func:`bench.backlog.drainer`, on L, ``prefetch`` unacked, one
   ack per message) takes every message; the order and the count are checked.
3. **in memory**: the same publish and drain of ``memory_count`` messages (fewer: 200k) on
   another fresh cluster with ``POLYMQ_QUEUE_WINDOW_MESSAGES=0`` (no paging): the in-memory
   drain rate, the reference of the 50% target.

``--set cluster_backlog.count=N`` sets the backlog (default 200,000; 20,000 with
``--quick``); the targets apply at 10M, a smaller run reports each figure and its verdict
but marks it ``at_scale: false``. A node's RSS is its polymq's plus its nats-server's.
"""

from __future__ import annotations

import time
from typing import Any

from .backlog import BODY_BYTES, GB, _check_disk, _drained
from .cluster_nodes import PolymqCluster, polymq_cluster, queue_in_shard
from .harness import BenchError, RssSampler, workers
from .scenario import Context, Result, Scenario

SCALE = 10_000_000  # the backlog the targets are set for


class _NodeRss:
    """Every process of every node sampled (:class:`bench.harness.RssSampler`): the peak
    of each node (polymq + nats-server, summed per sample) and of each part."""

    def __init__(self, cluster: PolymqCluster) -> None:
        self.parts = {
            (node.id, "polymq" if i == 0 else "nats_server"): RssSampler(pid)
            for node in cluster.running()
            for i, pid in enumerate(node.pids)
        }

    def __enter__(self) -> _NodeRss:
        for sampler in self.parts.values():
            sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for sampler in self.parts.values():
            sampler.stop()

    def peaks(self) -> dict[str, dict[str, int]]:
        """node id -> {"polymq", "nats_server": peak bytes, "node": the peak of their sum}."""
        out: dict[str, dict[str, int]] = {}
        for (nid, part), sampler in self.parts.items():
            out.setdefault(nid, {})[part] = sampler.peak
        for nid in out:
            samples = [s.samples for (n, _), s in self.parts.items() if n == nid]
            # samples of the parts taken at about the same moments: sum them pairwise
            pairs = zip(*samples, strict=False)  # (the samplers may have taken unequal counts)
            out[nid]["node"] = max((sum(r for _, r in rows) for rows in pairs), default=0)
        return out


def _run(ctx: Context, params: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Publish ``params["count"]`` messages to a queue led by one node of a fresh cluster,
    then drain them from it; the rates and every node's peak RSS."""
    n = params["count"]
    with (
        polymq_cluster(3, ctx.plan.broker, "WARNING", env=env) as cluster,
        workers() as pool,
    ):
        leaders = cluster.wait_ready(timeout=120)
        leader = leaders[0]
        dest = f"queue/{queue_in_shard(0, 'bench.cbacklog')}"
        run = {**params, "destination": dest, "host": "127.0.0.1"}
        d = ctx.spawn(pool, "bench.backlog:drainer", run)
        d.expect("ready", 60)
        with _NodeRss(cluster) as rss:
            p = ctx.spawn(pool, "bench.backlog:publisher", {**run, "port": leader.ports["core"]})
            p.expect("ready", 60)
            p.send(go=True)
            pr = p.wait_result(params["timeout"])
            if pr["confirmed"] != n:
                raise BenchError(f"only {pr['confirmed']} of {n} publishes were receipted")
            t_published = time.monotonic()
            d.send(port=leader.ports["core"], expect=n)
            r = d.wait_result(params["timeout"] + 60)
        peaks = rss.peaks()
        leader_after = cluster.wait_ready(timeout=60)[0].id
    _drained(r, n, "cluster backlog")
    drain_seconds = r["t_last"] - r["t_first"]
    return {
        "messages": n,
        "leader": leader.id,
        "leader_after": leader_after,
        "publish_msg_per_s": n / (pr["t_last"] - pr["t_first"]),
        "queue_stats_when_full": pr["queue_stats"],
        "drain_msg_per_s": n / drain_seconds,
        "drain_seconds": drain_seconds,
        "drain_wait_after_publish_seconds": r["t_go"] - t_published,
        "drain_out_of_order": r["out_of_order"],
        "drain_redelivered": r["redelivered"],
        "drain_deliveries": r["got"],
        "peak_rss_by_node": peaks,
        "peak_node_rss_bytes": max(p["node"] for p in peaks.values()),
        "peak_polymq_rss_bytes": max(p["polymq"] for p in peaks.values()),
    }


def run_cluster_backlog(ctx: Context) -> Result:
    n = ctx.option("count", 20_000 if ctx.quick else 200_000)
    n_mem = ctx.option("memory_count", min(n, 20_000 if ctx.quick else 200_000))
    window = ctx.option("window", 100_000)
    params = {
        "body_bytes": BODY_BYTES,
        "batch": ctx.option("batch", 500),
        "inflight": ctx.option("inflight", 8),
        "prefetch": ctx.option("prefetch", 1000),
        "idle_timeout": 60.0,
    }
    disk = _check_disk(3 * n)  # every node stores the backlog (and its log, briefly)
    paged = _run(
        ctx,
        {**params, "count": n, "timeout": max(120.0, n / 1_000)},
        {"POLYMQ_QUEUE_WINDOW_MESSAGES": str(window)},
    )
    mem = _run(
        ctx,
        {**params, "count": n_mem, "timeout": max(120.0, n_mem / 1_000)},
        {"POLYMQ_QUEUE_WINDOW_MESSAGES": "0"},
    )
    ratio = paged["drain_msg_per_s"] / mem["drain_msg_per_s"]
    peak = paged["peak_node_rss_bytes"]
    at_scale = n >= SCALE
    targets = {
        "node_rss_le_1gb": {
            "target": "each node's peak RSS (polymq + nats-server) <= 1 GB, 10M x 1 KB backlog",
            "value_bytes": peak,
            "met": peak <= GB,
            "at_scale": at_scale,
        },
        "drain_ge_half_in_memory": {
            "target": "paged drain rate >= 50% of the in-memory drain rate",
            "value_ratio": round(ratio, 3),
            "met": ratio >= 0.5,
            "at_scale": at_scale,
        },
    }
    all_met = all(t["met"] is True for t in targets.values())
    mem_peak = mem["peak_polymq_rss_bytes"]
    scale = "" if at_scale else f"{n:,} messages, not the target's 10M: verdicts at this scale. "
    per_node = ", ".join(
        f"{nid} {p['polymq'] / 1e6:.0f} + {p['nats_server'] / 1e6:.0f} MB"
        for nid, p in paged["peak_rss_by_node"].items()
    )
    return Result(
        value=paged["drain_msg_per_s"],
        target=0.5 * mem["drain_msg_per_s"],
        comparable=at_scale,
        verdict=True,
        met=all_met if at_scale else None,
        params={
            "messages": n,
            "memory_messages": n_mem,
            "body_bytes": BODY_BYTES,
            "nodes": 3,
            "queue_window_messages": window,
            **params,
        },
        notes=(
            f"{scale}Three fresh nodes, one durable queue (window {window:,} messages): "
            f"{n:,} persistent {BODY_BYTES} B messages published to its leader at "
            f"{paged['publish_msg_per_s']:,.0f} msg/s, drained from it at "
            f"{paged['drain_msg_per_s']:,.0f} msg/s; in memory (window 0, {n_mem:,} "
            f"messages) {mem['drain_msg_per_s']:,.0f} msg/s: ratio {ratio:.2f}. Peak RSS by "
            f"node (polymq + nats-server): {per_node}; in memory the polymq peak was "
            f"{mem_peak / 1e6:.0f} MB."
        ),
        details={"paged": paged, "in_memory": mem, "disk": disk, "ratio": ratio},
        extra={"targets": targets, "all_targets_met": all_met},
    )


SCENARIOS = [
    Scenario(
        "cluster_backlog",
        None,
        "msg/s",
        "min",
        run_cluster_backlog,
        about="a persistent backlog past the window on three nodes: each node's RSS, drain rate",
    ),
]
