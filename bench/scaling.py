"""``scaling``: the same STOMP load on ``polymq run --workers 1`` and ``--workers N``.

Each round starts a fresh ``polymq run --workers W`` with every process of it (the first and
its workers) pinned to the first W CPUs, and ``pairs`` producer/consumer process pairs (the
:mod:`bench.stomp_load` generators of ``stomp_queue_tcp``), each pair on its own queue, on
the CPUs left over (on every CPU when none is left: then the load shares the broker's CPUs,
and the entry says so). Throughput: the deliveries of every pair from the first SEND to the
last MESSAGE; CPU per message: every broker process's CPU over the same window.

On a machine with CPUs to spare (``N`` + a CPU or two for the load) this shows what the
workers give; on this project's two-CPU machine it can only show the cost of the extra hop
(a worker reaches the core over TCP, the first process in-process) and how the load shares
the CPUs. ``--set scaling.workers=N`` (default: every CPU the bench may use) and
``--set scaling.pairs=P`` (default: 2 N) choose.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import psutil

from .harness import BenchError, Broker, Worker, _pin_process, cpu_seconds_of, workers
from .scenario import Context, Result, Scenario
from .stomp import _busy
from .stomp_wire import BODY

__all__ = ["SCENARIOS"]

_SPAWN = multiprocessing.get_context("spawn")


def _processes(b: Broker) -> list[psutil.Process]:
    """The broker's processes: the first and its workers."""
    first = psutil.Process(b.pid)
    return [first, *first.children(recursive=True)]


def _round(ctx: Context, count: int, p: dict[str, Any], pairs: int) -> dict[str, Any]:
    cpus = ctx.plan.all
    broker_cpus = cpus[:count]
    load_cpus = cpus[count:] or cpus
    args = ["--workers", str(count), "--stomp-port", "0", "--stomp-ws-port", "0"]
    with ctx.broker("run", *args) as b:
        procs = _processes(b)
        if len(procs) != count:
            raise BenchError(f"polymq run --workers {count} runs {len(procs)} processes")
        for proc in procs:
            _pin_process(proc.pid, broker_cpus)
        endpoint = {
            "transport": "tcp",
            "host": b.host,
            "port": b.ports["stomp"],
            "path": "/ws",
            "login": "guest",
            "passcode": "guest",
            "vhost": "/",
        }
        run = f"{time.time_ns():x}"
        with workers() as pool:
            consumers: list[Worker] = []
            producers: list[Worker] = []
            for i in range(pairs):
                progress = _SPAWN.RawValue("q", 0)
                params = {
                    **endpoint,
                    **p,
                    "destination": f"/queue/polymq.bench.scaling.{run}.{i}",
                    "progress": progress,
                }
                c = Worker("bench.stomp_load:consumer", params, load_cpus, name=f"consumer{i}")
                pool.append(c)
                consumers.append(c)
                c.expect("ready", 60)
                prod = Worker("bench.stomp_load:producer", params, load_cpus, name=f"producer{i}")
                pool.append(prod)
                producers.append(prod)
                prod.expect("ready", 60)
            load = [psutil.Process(w.pid) for w in pool if w.pid is not None]
            busy0, cpu0, load0, t0 = (
                _busy(),
                cpu_seconds_of(procs),
                cpu_seconds_of(load),
                time.monotonic(),
            )
            for prod in producers:
                prod.send(go=True)
            sent = [prod.wait_result(p["timeout"] + 30) for prod in producers]
            for c, pr in zip(consumers, sent, strict=True):
                c.send(expect=pr["sent"])
            got = [c.wait_result(p["timeout"] + 30) for c in consumers]
            broker_cpu, busy = cpu_seconds_of(procs) - cpu0, _busy() - busy0
            load_cpu = cpu_seconds_of(load) - load0
            wall = time.monotonic() - t0
        b.check_alive()
    for pr, r in zip(sent, got, strict=True):
        if min(r["got"]) < pr["sent"]:
            raise BenchError(f"a consumer got {min(r['got'])} of {pr['sent']} messages")
    messages = sum(pr["sent"] for pr in sent)
    elapsed = max(r["t_last"] for r in got) - min(pr["t_first"] for pr in sent)
    return {
        "workers": count,
        "broker_cpus": broker_cpus,
        "load_cpus": load_cpus,
        "load_shares_broker_cpus": load_cpus == cpus and count == len(cpus),
        "msg_per_s": round(messages / elapsed, 1),
        "messages": messages,
        "seconds": round(elapsed, 3),
        "broker_cpu_seconds": round(broker_cpu, 3),
        "cpu_us_per_message": round(broker_cpu / messages * 1e6, 3),
        "broker_cpu_share": round(broker_cpu / elapsed, 3),
        "load_cpu_seconds": round(load_cpu, 3),
        "machine_busy_share": round(busy / (wall * len(cpus)), 3),
    }


def run_scaling(ctx: Context) -> Result:
    cpus = ctx.plan.all
    n = ctx.option("workers", len(cpus))
    pairs = ctx.option("pairs", 2 * n)
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 4.0)
    p = {
        "count": ctx.option("count", 20_000 if ctx.quick else 1_000_000),
        "seconds": seconds,
        "batch": ctx.option("batch", 100),
        "ack": "client",
        "prefetch": 1000,
        "ack_every": 500,
        "window": ctx.option("window", 20_000),
        "quiet": 0.3,
        "timeout": seconds + (30 if ctx.quick else 60),
    }
    rounds = [_round(ctx, count, p, pairs) for count in sorted({1, n})]
    one, most = rounds[0], rounds[-1]
    speedup = most["msg_per_s"] / one["msg_per_s"]
    notes = (
        f"STOMP over TCP, {pairs} producer/consumer pairs (each its own queue, {len(BODY)}-byte "
        f"transient bodies, pipelined SENDs, client acks): --workers {n} moved "
        f"{speedup:.2f}x the messages per second of --workers 1, at "
        f"{most['cpu_us_per_message']:.1f} vs {one['cpu_us_per_message']:.1f} broker CPU-us "
        f"per message, on {len(cpus)} CPUs"
    )
    if most["load_shares_broker_cpus"]:
        notes += " (no CPU left for the load generators: they shared the broker's)"
    return Result(
        round(speedup, 3),
        {**p, "pairs": pairs, "workers": n},
        notes,
        details={"rounds": rounds, "cpus": cpus},
    )


SCENARIOS = [
    Scenario(
        "scaling",
        None,
        "x",
        None,
        run_scaling,
        about="STOMP throughput of polymq run --workers N over --workers 1, CPU per message each",
    ),
]
