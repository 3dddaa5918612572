"""The replicated core: three local polymq nodes against one polymq node and against RabbitMQ
quorum queues on a local three-node RabbitMQ cluster; and failover.

Three systems are up at once for the throughput cells (each started by the scenario, each on
127.0.0.1, each pinned to the broker CPU(s); the load generators run on the load CPU(s)):

- ``polymq_cluster``: three ``polymq run --peers`` nodes (:class:`bench.cluster_nodes.
  PolymqCluster`), each with its nats-server. A cell's queue lies in a shard led by node L
  (``zlib.crc32(b"queue/<name>") % 4``); its clients connect either to L (``leader``) or to
  another node, which forwards to L (``forwarded``: one hop more).
- ``polymq_single``: one ``polymq run`` without peers (its SQLite store, fsync per commit).
- ``rabbitmq_quorum``: three private ``rabbitmq-server`` nodes joined into one cluster
  (:class:`bench.cluster_nodes.RabbitCluster`), a quorum queue (``x-queue-type: quorum``)
  declared on node 1 (its leader, ``client-local``); clients connect to node 1 (``leader``)
  or node 2 (``follower``). The machine's RabbitMQ on :5672 is not used. If the cluster
  cannot be started this side is recorded as skipped, with the reason.

A cell (:mod:`bench.cluster_load`): one producer and one consumer process on the same node,
persistent messages of 32 B or 1 KB with confirms (at most ``window`` unconfirmed) into a
fresh durable queue, consumed at once with manual cumulative acks, for ``seconds``. Clients:
``native`` (:class:`polymq.Client`; polymq only) and ``amqp`` (the pamqp load generator,
:mod:`bench.amqp_wire`; every system). Measured: ``msg_per_s`` (messages / first publish to
last delivery), ``publish_msg_per_s`` (confirmed), confirm latency p50/p99 (per message,
under that full load: with ``window`` messages always in flight it is about window /
throughput), and ``cpu_seconds_per_million``: the CPU of every process of the system
measured (all nodes: polymq and nats-server, or the three ``beam.smp``) from ``go`` to the
last delivery, per million messages. The systems not measured sit idle meanwhile; their CPU
is recorded (``idle_systems_cpu_seconds``). Each (client, size) measures every system back
to back, ``rounds`` times (2; 1 with ``--quick``; the order reversed every other round), and
the comparisons use each cell's median. A cell whose publish or delivery fails (a shard
leader that moved under load answers ``Unavailable``) is recorded as failed, with the error,
and not retried; ``leader_after`` names the shard's leader after a cell when it moved.

Failover (after the cells; the other systems stopped): a queue in a shard led by node L, a
native client on another node publishing one persistent message every 20 ms (each awaited
apart); ``kill -9`` of L's polymq and nats-server; the time from the kill to the first
confirm of a publish begun after it. L is restarted and the cluster is ready again between
rounds (``failover_rounds``: 5, 1 with ``--quick``); the median is the figure.

Targets (the issue): polymq cluster >= 2x RabbitMQ quorum-queue throughput at <= its CPU per
message (the AMQP cells, leader vs leader and forwarded vs follower); replicated >= 50% of
single-node persistent throughput (each client and size, both routes); failover <= 5 s
(median). ``value`` is the geometric mean over the AMQP cells of polymq cluster msg/s /
RabbitMQ msg/s; ``targets`` says which target holds, ``cells`` has every measurement,
``comparisons`` every ratio, ``failover`` every round. ``met``: all targets hold (null when
one could not be measured and none failed).

With ``--quick`` (1 s cells, one round, one failover round) ``met`` is null: a smoke run.

``--set cluster.KEY=VALUE``: ``seconds``, ``count``, ``sizes``, ``clients``, ``batch``,
``window``, ``prefetch``, ``ack_every``, ``rounds``, ``failover_rounds``,
``failover_interval``, ``rabbitmq`` (false: skip it), ``log_level`` (of the polymq nodes),
``keep_logs`` (keep the cluster's directory, under the system's temporary directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import psutil

from .amqp_wire import open_link
from .cluster_load import _declare
from .cluster_nodes import (
    PolymqCluster,
    RabbitCluster,
    polymq_cluster,
    queue_in_shard,
    rabbit_cluster,
)
from .harness import BenchError, Worker, filesystem_of, fsync_seconds, workers
from .scenario import Context, Result, Scenario, Skipped
from .stomp import _busy, _failed, _not_run

__all__ = ["SCENARIOS"]

T = TypeVar("T")

CLIENTS = ("native", "amqp")
SIZES = (32, 1024)


@dataclass
class _Route:
    """Where a cell's clients connect, and what the system's CPU is."""

    system: str  # polymq_cluster | polymq_single | rabbitmq_quorum
    route: str  # leader | forwarded | single | follower
    node: str
    core_port: int | None
    amqp_port: int
    cpu_seconds: Callable[[], float]
    pin: Callable[[], None] = lambda: None
    alive: Callable[[], None] = lambda: None
    predeclare: int | None = None  # RabbitMQ: declare the queue on this AMQP port first
    cpu_parts: Callable[[], dict[str, float]] | None = None  # CPU by process kind
    leader: str | None = None
    shard: int | None = None


def _params(ctx: Context) -> dict[str, Any]:
    seconds = float(ctx.option("seconds", 1.0 if ctx.quick else 5.0))
    return {
        "seconds": seconds,
        "count": int(ctx.option("count", 10**9)),
        "batch": int(ctx.option("batch", 100)),
        "window": int(ctx.option("window", 1000)),
        "prefetch": int(ctx.option("prefetch", 1000)),
        "ack_every": int(ctx.option("ack_every", 100)),
        "timeout": seconds + 60,
    }


# =========================================================================================
# one cell
# =========================================================================================
def _predeclare(port: int, queue: str) -> None:
    async def go() -> None:
        link = await open_link({"host": "127.0.0.1", "port": port})
        try:
            await _declare(link, queue)
        finally:
            await link.close()

    asyncio.run(go())


def _measure(
    ctx: Context,
    r: _Route,
    client: str,
    size: int,
    p: dict[str, Any],
    idle_cpu: Callable[[], float],
) -> dict[str, Any]:
    """One producer and one consumer process against ``r``: what they measured."""
    shard = r.shard if r.shard is not None else 0
    queue = queue_in_shard(shard, f"bench.cluster.{client}{size}")
    if client == "amqp":
        ep: dict[str, Any] = {"host": "127.0.0.1", "port": r.amqp_port}
        ep.update(user="guest", password="guest", vhost="/")
    elif r.core_port is not None:
        ep = {"host": "127.0.0.1", "port": r.core_port}
    else:
        raise BenchError(f"{r.system} has no native port")
    if r.predeclare is not None:
        _predeclare(r.predeclare, queue)
    params = {**p, **ep, "queue": queue, "body_bytes": size}
    timeout = float(p["timeout"])
    with workers() as pool:
        c = ctx.spawn(pool, f"bench.cluster_load:{client}_consumer", params)
        prod = ctx.spawn(pool, f"bench.cluster_load:{client}_producer", params)
        c.expect("ready", 60)
        prod.expect("ready", 60)
        r.pin()
        parts0 = r.cpu_parts() if r.cpu_parts else {}
        t0, busy0, cpu0, idle0 = time.monotonic(), _busy(), r.cpu_seconds(), idle_cpu()
        prod.send(go=True)
        pr = prod.wait_result(timeout + 60)
        c.send(expect=pr["sent"])
        c.expect("measured", timeout + 60)
        wall = time.monotonic() - t0
        broker_cpu = r.cpu_seconds() - cpu0
        idle = idle_cpu() - idle0
        busy = _busy() - busy0
        parts = r.cpu_parts() if r.cpu_parts else {}
        cr = c.wait_result(60)
    r.alive()
    sent, got = int(pr["sent"]), int(cr["got"][0])
    if sent <= 0:
        raise BenchError("no message was confirmed")
    if got < sent:
        raise BenchError(f"the consumer got {got} of {sent} confirmed messages in {timeout:g}s")
    elapsed = cr["t_last"] - pr["t_go"]
    load_cpu = float(pr["cpu_seconds"]) + float(cr["cpu_seconds"])
    other = max(0.0, busy - broker_cpu - idle - load_cpu)
    out: dict[str, Any] = {
        "status": "ok",
        "system": r.system,
        "route": r.route,
        "client": client,
        "body_bytes": size,
        "node": r.node,
        "leader": r.leader,
        "queue": queue,
        "messages": sent,
        "seconds": round(elapsed, 3),
        "msg_per_s": round(sent / elapsed, 1),
        "publish_msg_per_s": round(sent / (pr["t_done"] - pr["t_go"]), 1),
        "latency_p50_ms": _ms(pr.get("latency_p50_s")),
        "latency_p99_ms": _ms(pr.get("latency_p99_s")),
        "broker_cpu_seconds": round(broker_cpu, 3),
        "cpu_seconds_per_million": round(broker_cpu / sent * 1e6, 2),
        "broker_cpu_share": round(broker_cpu / wall, 3),
        "producer_cpu_share": round(pr["cpu_seconds"] / (pr["t_done"] - pr["t_go"]), 3),
        "consumer_cpu_seconds": round(cr["cpu_seconds"], 3),
        "idle_systems_cpu_seconds": round(idle, 3),
        "other_cpu_share": round(other / (wall * (psutil.cpu_count() or 1)), 3),
    }
    if parts:
        out["cpu_seconds_per_million_by_process"] = {
            k: round((v - parts0.get(k, 0.0)) / sent * 1e6, 2) for k, v in parts.items()
        }
    if cr.get("delete_error"):
        out["delete_error"] = cr["delete_error"]
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


# =========================================================================================
# the systems
# =========================================================================================
class _Background(Generic[T]):
    """A context manager entered in a thread of its own (a RabbitMQ cluster boots while the
    polymq nodes do); :meth:`result` waits for it, :meth:`close` exits it (once)."""

    def __init__(self, cm: contextlib.AbstractContextManager[T]) -> None:
        self.cm = cm
        self.value: T | None = None
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self._entered = self._closed = False
        self._thread = threading.Thread(target=self._enter, daemon=True)
        self._thread.start()

    def _enter(self) -> None:
        t0 = time.monotonic()
        try:
            self.value = self.cm.__enter__()
            self._entered = True
        except BaseException as exc:
            self.error = exc
        self.seconds = round(time.monotonic() - t0, 1)

    def result(self, timeout: float = 600.0) -> T:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise BenchError(f"still starting after {timeout:g}s")
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._thread.join(600)
        if self._entered:
            self.cm.__exit__(None, None, None)


class _Systems:
    """The three systems, open for the throughput cells (each may be missing, with why)."""

    def __init__(
        self,
        ctx: Context,
        cluster: PolymqCluster,
        stack: contextlib.ExitStack,
        rabbit: _Background[RabbitCluster] | None,
    ) -> None:
        self.ctx = ctx
        self.why: dict[str, dict[str, Any]] = {}
        self.facts: dict[str, Any] = {}
        self.cluster = cluster
        self.single: Any = None
        try:
            t0 = time.monotonic()
            self.single = stack.enter_context(ctx.broker("run"))
            self.facts["polymq_single_start_seconds"] = round(time.monotonic() - t0, 1)
        except Exception as exc:
            self.why["polymq_single"] = _not_run(exc)
        self.rabbit: RabbitCluster | None = None
        if rabbit is None:
            self.why["rabbitmq_quorum"] = {"status": "skipped", "reason": "--set rabbitmq=false"}
        else:
            try:
                self.rabbit = rabbit.result()
                self.facts["rabbitmq_cluster_start_seconds"] = rabbit.seconds
                self.facts["rabbitmq_version"] = self.rabbit.version
            except Exception as exc:
                why = _not_run(exc)
                reason = why.get("reason") or why.get("error") or "?"
                self.why["rabbitmq_quorum"] = {
                    "status": "skipped",
                    "reason": f"the three-node RabbitMQ cluster could not start: {reason}",
                }
        self.leaders = self.cluster.wait_ready()

    def cluster_routes(self) -> list[_Route]:
        """Leader and forwarded, for the shard with the lowest number led by ``L``: the node
        leading the most shards (so the forwarding node leads fewer)."""
        leaders = self.cluster.wait_ready()
        self.leaders = leaders
        counts: dict[str, int] = {}
        for n in leaders.values():
            counts[n.id] = counts.get(n.id, 0) + 1
        lead_id = max(counts, key=lambda k: (counts[k], -self.cluster.node(k).index))
        lead = self.cluster.node(lead_id)
        shard = min(s for s, n in leaders.items() if n is lead)
        fwd = next(n for n in self.cluster.others(lead))
        c = self.cluster

        def alive() -> None:
            for n in c.nodes:
                if len(n.alive_pids()) != len(n.pids):
                    raise BenchError(f"polymq node {n.id} died:\n{n.log_tail()}")

        return [
            _Route(
                "polymq_cluster", route, n.id, n.ports["core"], n.ports["amqp"], c.cpu_seconds,
                pin=c.pin, alive=alive, cpu_parts=c.cpu_parts, leader=lead.id, shard=shard,
            )
            for route, n in (("forwarded", fwd), ("leader", lead))
        ]  # fmt: skip

    def single_route(self) -> _Route | None:
        b = self.single
        if b is None:
            return None
        return _Route(
            "polymq_single", "single", "single", b.core_port, b.ports["amqp"], b.cpu_seconds,
            pin=b.pin, alive=b.check_alive,
        )  # fmt: skip

    def rabbit_routes(self) -> list[_Route]:
        rc = self.rabbit
        if rc is None:
            return []
        first, second = rc.nodes[0], rc.nodes[1]
        cpus = self.ctx.plan.broker

        def alive() -> None:
            for n in rc.nodes:
                if not n.alive:
                    raise BenchError(f"RabbitMQ node {n.node} died:\n{n.log_tail()}")

        return [
            _Route(
                "rabbitmq_quorum", route, n.node, None, n.port, rc.cpu_seconds,
                pin=lambda: rc.pin(cpus), alive=alive, predeclare=first.port, leader=first.node,
            )
            for route, n in (("leader", first), ("follower", second))
        ]  # fmt: skip

    def cpu_by_system(self) -> dict[str, Callable[[], float]]:
        out: dict[str, Callable[[], float]] = {"polymq_cluster": self.cluster.cpu_seconds}
        if self.single is not None:
            out["polymq_single"] = self.single.cpu_seconds
        if self.rabbit is not None:
            out["rabbitmq_quorum"] = self.rabbit.cpu_seconds
        return out


def _cells(ctx: Context, systems: _Systems, p: dict[str, Any]) -> list[dict[str, Any]]:
    clients = [c for c in ctx.option("clients", list(CLIENTS)) if c in CLIENTS]
    sizes = [int(s) for s in ctx.option("sizes", list(SIZES))]
    rounds = int(ctx.option("rounds", 1 if ctx.quick else 2))
    cpu_by = systems.cpu_by_system()
    out: list[dict[str, Any]] = []
    for rnd in range(rounds):
        for client in clients:
            for size in sizes:
                routes = systems.cluster_routes()
                single = systems.single_route()
                if single is not None:
                    routes.append(single)
                if client == "amqp":
                    routes += systems.rabbit_routes()
                if rnd % 2:
                    routes.reverse()  # the machine drifts: alternate who goes first
                for r in routes:
                    others = [f for name, f in cpu_by.items() if name != r.system]

                    def idle(fs: list[Callable[[], float]] = others) -> float:
                        return sum(f() for f in fs)

                    try:
                        cell = _measure(ctx, r, client, size, p, idle)
                    except Exception as exc:
                        cell = {
                            "system": r.system,
                            "route": r.route,
                            "client": client,
                            "body_bytes": size,
                            "node": r.node,
                            "leader": r.leader,
                            **_failed(exc),
                        }
                    cell["round"] = rnd
                    if r.system == "polymq_cluster":
                        # did the shard's leader stay put while measured?
                        leaders, why = systems.cluster.view()
                        now_leads = leaders.get(r.shard or 0) if leaders else None
                        if now_leads != r.leader:
                            cell["leader_after"] = now_leads or why
                    out.append(cell)
    return out


# =========================================================================================
# failover
# =========================================================================================
def _failover(ctx: Context, cluster: PolymqCluster, rounds: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rnd in range(rounds):
        try:
            out.append(_failover_round(ctx, cluster, rnd))
        except Exception as exc:
            out.append({"round": rnd, **_failed(exc)})
            # the cluster must be whole for the next round
            with contextlib.suppress(Exception):
                dead = [n for n in cluster.nodes if n.state != "running"]
                if dead:
                    cluster.start_nodes(dead)
                cluster.wait_ready(120)
    return out


def _failover_round(ctx: Context, cluster: PolymqCluster, rnd: int) -> dict[str, Any]:
    leaders = cluster.wait_ready(120)
    leading = sorted({n.id for n in leaders.values()})
    victim = cluster.node(leading[rnd % len(leading)])
    shard = min(s for s, n in leaders.items() if n is victim)
    entry = cluster.others(victim)[rnd % 2]
    queue = queue_in_shard(shard, "bench.failover")
    params = {
        "host": "127.0.0.1",
        "port": entry.ports["core"],
        "queue": queue,
        "interval": float(ctx.option("failover_interval", 0.02)),
        "attempt_timeout": 20.0,
        "limit": 60.0,
    }
    with workers() as pool:
        w: Worker = ctx.spawn(pool, "bench.cluster_load:failover_prober", params)
        w.expect("ready", 60)
        time.sleep(1.0)  # steady publishing through the relay first
        seen: dict[str, Any] = {}
        stop_probe = threading.Event()
        probe = cluster.leader_changed(entry, shard, victim.id)

        def watch() -> None:
            while not stop_probe.is_set():
                who = probe()
                if who:
                    seen["new_leader"], seen["at"] = who, time.monotonic()
                    return
                time.sleep(0.05)

        t_kill = time.monotonic()
        victim.kill()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        w.send(killed_at=t_kill)
        got = w.expect("recovered", 90)
        w.send(stop=True)
        summary = w.wait_result(60)
        stop_probe.set()
        watcher.join(5)
    any_confirm = summary.pop("first_confirm_of_any_publish", None)
    t0 = time.monotonic()
    cluster.start_nodes([victim])
    after = cluster.wait_ready(120)
    row: dict[str, Any] = {
        "round": rnd,
        "status": "ok" if got.get("recovered") else "failed",
        "killed": victim.id,
        "shard": shard,
        "publishing_through": entry.id,
        "failover_s": round(got["first_end"] - t_kill, 3) if got.get("recovered") else None,
        "first_confirmed_publish_began_after_kill_s": (
            round(got["first_start"] - t_kill, 3) if got.get("recovered") else None
        ),
        "first_confirm_of_any_publish_s": (
            round(any_confirm - t_kill, 3) if any_confirm is not None else None
        ),
        "new_leader": seen.get("new_leader"),
        "new_leader_seen_after_s": round(seen["at"] - t_kill, 3) if "at" in seen else None,
        "restart_to_ready_s": round(time.monotonic() - t0, 2),
        "leaders_after": {s: n.id for s, n in after.items()},
        "prober": summary,
    }
    if not got.get("recovered"):
        row["error"] = "no publish begun after the kill was confirmed within 60 s"
        row["logs"] = cluster.diagnose(20)
    return row


# =========================================================================================
# the comparisons and the verdict
# =========================================================================================
def _find(cells: list[dict[str, Any]], key: str, client: str, size: int) -> list[dict[str, Any]]:
    system, route = key.split("/")
    return [
        c
        for c in cells
        if c.get("status") == "ok"
        and c["system"] == system
        and c["route"] == route
        and c["client"] == client
        and c["body_bytes"] == size
    ]


def _median(cells: list[dict[str, Any]], field_: str) -> float | None:
    vals = [c[field_] for c in cells if c.get(field_) is not None]
    return round(statistics.median(vals), 2) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _compare(cells: list[dict[str, Any]], clients: list[str], sizes: list[int]) -> dict[str, Any]:
    vs_single: dict[str, float | None] = {}
    vs_rabbit: dict[str, float | None] = {}
    cpu_vs_rabbit: dict[str, float | None] = {}
    summary: dict[str, dict[str, Any]] = {}
    for client in clients:
        for size in sizes:
            keys = ["polymq_cluster/forwarded", "polymq_cluster/leader", "polymq_single/single"]
            if client == "amqp":
                keys += ["rabbitmq_quorum/leader", "rabbitmq_quorum/follower"]
            for key in keys:
                got = _find(cells, key, client, size)
                if got:
                    summary[f"{client}/{size}B/{key}"] = {
                        "msg_per_s": _median(got, "msg_per_s"),
                        "cpu_seconds_per_million": _median(got, "cpu_seconds_per_million"),
                        "latency_p50_ms": _median(got, "latency_p50_ms"),
                        "latency_p99_ms": _median(got, "latency_p99_ms"),
                    }

            def m(key: str, f: str, c: str = client, s: int = size) -> float | None:
                return summary.get(f"{c}/{s}B/{key}", {}).get(f)

            single = m("polymq_single/single", "msg_per_s")
            for route in ("forwarded", "leader"):
                vs_single[f"{client}/{size}B/{route}"] = _ratio(
                    m(f"polymq_cluster/{route}", "msg_per_s"), single
                )
            if client == "amqp":
                for route, rroute in (("leader", "leader"), ("forwarded", "follower")):
                    k = f"{client}/{size}B/{route} vs {rroute}"
                    vs_rabbit[k] = _ratio(
                        m(f"polymq_cluster/{route}", "msg_per_s"),
                        m(f"rabbitmq_quorum/{rroute}", "msg_per_s"),
                    )
                    cpu_vs_rabbit[k] = _ratio(
                        m(f"polymq_cluster/{route}", "cpu_seconds_per_million"),
                        m(f"rabbitmq_quorum/{rroute}", "cpu_seconds_per_million"),
                    )
    return {
        "medians": summary,
        "cluster_vs_single": vs_single,
        "cluster_vs_rabbitmq_quorum": vs_rabbit,
        "cpu_per_message_cluster_vs_rabbitmq_quorum": cpu_vs_rabbit,
    }


def _target(values: dict[str, float | None], ok: Callable[[float], bool], goal: str) -> Any:
    known = [v for v in values.values() if v is not None]
    met: bool | None
    if not known:
        met = None
    elif len(known) < len(values):
        met = False if not all(ok(v) for v in known) else None
    else:
        met = all(ok(v) for v in known)
    return {"goal": goal, "values": values, "met": met}


# =========================================================================================
# the scenario
# =========================================================================================
@contextlib.contextmanager
def _timed(facts: dict[str, Any], key: str) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    facts[key] = round(time.monotonic() - t0, 1)


def run_cluster(ctx: Context) -> Result:
    p = _params(ctx)
    clients = [c for c in ctx.option("clients", list(CLIENTS)) if c in CLIENTS]
    sizes = [int(s) for s in ctx.option("sizes", list(SIZES))]
    fo_rounds = int(ctx.option("failover_rounds", 1 if ctx.quick else 5))
    if not clients or not sizes:
        raise Skipped("no client or no size to measure (--set cluster.clients / sizes)")
    facts: dict[str, Any] = {"data_dir_filesystem": filesystem_of(tempfile.gettempdir())}
    with tempfile.TemporaryDirectory() as d:
        facts["fsync_median_ms"] = round(fsync_seconds(Path(d)) * 1000, 3)
    rabbit_cpu = 0.0
    rabbit = (
        _Background(rabbit_cluster(3, ctx.plan.broker)) if ctx.option("rabbitmq", True) else None
    )
    try:
        t0 = time.monotonic()
        with polymq_cluster(
            3,
            ctx.plan.broker,
            str(ctx.option("log_level", "WARNING")),
            keep=bool(ctx.option("keep_logs", False)),
            profile_dir=ctx.profile_dir,
        ) as cluster:
            ctx.profiles += cluster.profiles
            facts["polymq_cluster_start_seconds"] = round(time.monotonic() - t0, 1)
            with contextlib.ExitStack() as stack:  # the single node and RabbitMQ: cells only
                if rabbit is not None:
                    stack.callback(rabbit.close)
                systems = _Systems(ctx, cluster, stack, rabbit)
                facts.update(systems.facts)
                facts["leaders_at_start"] = {s: n.id for s, n in systems.leaders.items()}
                with _timed(facts, "cells_seconds"):
                    cells = _cells(ctx, systems, p)
                if systems.rabbit is not None:
                    rabbit_cpu = systems.rabbit.cpu_seconds()
                why = dict(systems.why)
            with _timed(facts, "failover_seconds"):
                failover = _failover(ctx, cluster, fo_rounds) if fo_rounds > 0 else []
    finally:
        if rabbit is not None:
            rabbit.close()
    return _result(ctx, p, clients, sizes, cells, failover, why, facts, rabbit_cpu)


def _result(
    ctx: Context,
    p: dict[str, Any],
    clients: list[str],
    sizes: list[int],
    cells: list[dict[str, Any]],
    failover: list[dict[str, Any]],
    why: dict[str, dict[str, Any]],
    facts: dict[str, Any],
    rabbit_cpu: float,
) -> Result:
    comp = _compare(cells, clients, sizes)
    fo = [r["failover_s"] for r in failover if r.get("failover_s") is not None]
    fo_median = round(statistics.median(fo), 3) if fo else None
    fo_met: bool | None = None
    if failover:
        fo_met = fo_median is not None and fo_median <= 5.0 and len(fo) == len(failover)
    targets = {
        "throughput_vs_rabbitmq_quorum": _target(
            comp["cluster_vs_rabbitmq_quorum"], lambda v: v >= 2.0, ">= 2.0 (AMQP cells)"
        ),
        "cpu_per_message_vs_rabbitmq_quorum": _target(
            comp["cpu_per_message_cluster_vs_rabbitmq_quorum"],
            lambda v: v <= 1.0,
            "<= 1.0 (AMQP cells)",
        ),
        "replicated_vs_single_node": _target(
            comp["cluster_vs_single"], lambda v: v >= 0.5, ">= 0.5 (every client, size, route)"
        ),
        "failover_median_s": {
            "goal": f"<= 5 s (median of {len(failover)})",
            "values": fo,
            "median": fo_median,
            "met": fo_met,
        },
    }
    verdicts = [t["met"] for t in targets.values()]
    met: bool | None
    if any(v is False for v in verdicts):
        met = False
    elif all(v is True for v in verdicts):
        met = True
    else:
        met = None
    if ctx.quick:
        met = None  # a smoke run: a second per cell, one failover round
    ratios = [v for v in comp["cluster_vs_rabbitmq_quorum"].values() if v]
    value = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    failed = [c for c in cells if c.get("status") != "ok"]
    errors = [
        f"{c['system']}/{c['route']} {c['client']} {c['body_bytes']}B: {c.get('error')}"
        for c in failed
    ]
    errors += [f"failover round {r['round']}: {r.get('error')}" for r in failover if r.get("error")]
    errors += [f"{name}: {w.get('error')}" for name, w in why.items() if w["status"] == "failed"]
    notes = [
        "Three local polymq nodes (polymq run --peers, each with its nats-server) vs one "
        "polymq node vs RabbitMQ quorum queues on a local three-node RabbitMQ cluster; "
        "persistent messages with confirms, published and consumed at once (one producer and "
        "one consumer process on the same node), native client and the pamqp AMQP load "
        f"generator, {', '.join(f'{s} B' for s in sizes)}, {p['seconds']:g} s per cell, "
        f"at most {p['window']} unconfirmed. value = geometric mean of polymq cluster / "
        "RabbitMQ quorum msg/s over the AMQP cells."
    ]
    for k, v in comp["cluster_vs_rabbitmq_quorum"].items():
        cpu = comp["cpu_per_message_cluster_vs_rabbitmq_quorum"].get(k)
        if v is not None:
            notes.append(f"{k}: x{v} RabbitMQ msg/s, x{cpu} its CPU per message.")
    for k, v in comp["cluster_vs_single"].items():
        if v is not None:
            notes.append(f"{k}: cluster/single {v}.")
    if failover:
        notes.append(
            f"Failover (kill -9 of a leader -> first confirmed publish begun after it): "
            f"{', '.join(f'{v:.2f}' for v in fo)} s, median {fo_median} s."
        )
    for name, w in why.items():
        notes.append(f"{name} {w['status']}: {w.get('reason') or w.get('error')}")
    return Result(
        value=value,
        params={**p, "clients": clients, "sizes": sizes, "failover_rounds": len(failover)},
        notes=" ".join(notes),
        details={"facts": facts, "not_run": why},
        comparable=not ctx.quick,
        verdict=True,
        met=met,
        error="; ".join(errors) or None,
        extra={
            "targets": targets,
            "comparisons": comp,
            "cells": cells,
            "failover": failover,
        },
        external_cpu_seconds=rabbit_cpu,
    )


def run_cluster_failover(ctx: Context) -> Result:
    """The failover rounds of ``cluster`` alone, on a fresh cluster (no throughput cells,
    no RabbitMQ): ``--set cluster_failover.rounds=N`` (5; 1 with ``--quick``)."""
    rounds = int(ctx.option("rounds", 1 if ctx.quick else 5))
    with polymq_cluster(
        3,
        ctx.plan.broker,
        str(ctx.option("log_level", "WARNING")),
        keep=bool(ctx.option("keep_logs", False)),
    ) as cluster:
        rows = _failover(ctx, cluster, rounds)
    fo = [r["failover_s"] for r in rows if r.get("failover_s") is not None]
    median = round(statistics.median(fo), 3) if fo else None
    errors = [f"failover round {r['round']}: {r.get('error')}" for r in rows if r.get("error")]
    return Result(
        value=median,
        params={"rounds": rounds, "interval": ctx.used.get("failover_interval", 0.02)},
        notes=(
            "kill -9 of the node leading a shard (its polymq and nats-server), a native "
            "client on a survivor publishing one persistent message every 20 ms: the time "
            "from the kill to the first confirm of a publish begun after it: "
            f"{', '.join(f'{v:.2f}' for v in fo)} s, median {median} s."
        ),
        details={"failover": rows},
        comparable=not ctx.quick,
        verdict=True,
        met=None if ctx.quick else (median is not None and median <= 5.0 and len(fo) == rounds),
        error="; ".join(errors) or None,
    )


SCENARIOS = [
    Scenario(
        "cluster_failover",
        5.0,
        "s",
        "max",
        run_cluster_failover,
        about="kill -9 of a shard's leader -> first confirmed publish (median of rounds)",
    ),
    Scenario(
        "cluster",
        2.0,
        "x RabbitMQ quorum",
        "min",
        run_cluster,
        about=(
            "three local polymq nodes vs one node vs a three-node RabbitMQ with quorum queues: "
            "persistent publish->consume with confirms, confirm latency, CPU per message; "
            "failover"
        ),
    ),
]
