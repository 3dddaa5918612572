"""STOMP scenarios: polymq's STOMP frontend against RabbitMQ's STOMP plugin, same load.

Each scenario runs the same :mod:`bench.stomp_load` workers with the same parameters three
times, one after the other: against :mod:`bench.stomp_relay` (a do-nothing relay: the load
generator's own ceiling), against RabbitMQ (:func:`bench.stomp_targets.rabbitmq_target`) and
against a fresh ``polymq run`` (:func:`bench.stomp_targets.polymq_target`). The broker (or
relay) is pinned to the broker CPU, the producer and consumer processes to the load CPU(s).

The entry's ``value`` is polymq's figure and its ``target`` RabbitMQ's, so
``ratio_to_target`` is polymq / RabbitMQ; ``ratio_to_rabbitmq``, ``cpu_seconds_per_million``
(both brokers: broker CPU-seconds per million messages, or deliveries for the fanout, from
the producer's first SEND to the consumer's last MESSAGE), ``cpu_ratio_to_rabbitmq`` and
``generator_ceiling`` sit at the top of the entry; ``details`` holds each side in full. The
targets (issue 3): polymq >= 1.0x RabbitMQ's throughput over TCP and WebSocket, and <= 1.0x
its CPU per message; ``met`` says whether both hold.

Equivalent work on both brokers: SENDs carry ``destination`` and ``content-length`` and no
``persistent`` header, i.e. transient messages (the STOMP default on both; RabbitMQ keeps a
transient message in memory even in the durable queue it declares for ``/queue/x``). Queue
consumers subscribe with ``ack:client`` and ``prefetch-count`` and acknowledge cumulatively;
topic subscribers use ``ack:auto``. Before a run the consumer waits until nothing has arrived
for ``quiet`` seconds (RabbitMQ's durable queue may hold what an aborted run left) and
counts only what follows. A side that cannot run records why; the others still run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from .harness import BenchError, Worker, workers
from .scenario import Context, Result, Scenario, Skipped
from .stomp_targets import Target, Unavailable, polymq_target, rabbitmq_target
from .stomp_wire import BODY

__all__ = ["SCENARIOS"]

_SPAWN = multiprocessing.get_context("spawn")  # as bench.harness starts its workers

Measure = Callable[[Context, dict[str, Any], Target], dict[str, Any]]


def _busy() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


class _Window:
    """Broker CPU and the machine's busy CPU over one measurement."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def __enter__(self) -> _Window:
        self.t0 = time.monotonic()
        self.busy0 = _busy()
        self.cpu0 = self.target.cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.broker_cpu = self.target.cpu_seconds() - self.cpu0
        self.busy = _busy() - self.busy0
        self.wall = time.monotonic() - self.t0

    def other_share(self, load_cpu: float) -> float:
        """The share of all CPUs used by anything but the broker and the load generators."""
        other = max(0.0, self.busy - self.broker_cpu - load_cpu)
        return round(other / (self.wall * (os.cpu_count() or 1)), 3)


def _idle_cpu_share(target: Target, seconds: float = 0.5) -> float:
    """How busy the broker is with nothing from us (RabbitMQ is shared with the machine)."""
    c0 = target.cpu_seconds()
    time.sleep(seconds)
    return round((target.cpu_seconds() - c0) / seconds, 3)


def _ready(w: Worker) -> dict[str, Any]:
    return w.expect("ready", 60)


# =========================================================================================
# one measurement against one target
# =========================================================================================
def _queue(ctx: Context, ep: dict[str, Any], t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """One producer process, ``connections`` consumer connections in one process."""
    progress = _SPAWN.RawValue("q", 0)  # deliveries so far, written by the consumer
    params = {**ep, **p, "progress": progress}
    timeout = params["timeout"]
    idle = _idle_cpu_share(t, 0.3)
    with workers() as pool:
        c = ctx.spawn(pool, "bench.stomp_load:consumer", params)
        stale = _ready(c).get("stale", 0)
        prod = ctx.spawn(pool, "bench.stomp_load:producer", params)
        frame_bytes = _ready(prod)["frame_bytes"]
        with _Window(t) as w:
            prod.send(go=True)
            pr = prod.wait_result(timeout + 30)
            c.send(expect=pr["sent"])
            r = c.wait_result(timeout + 30)
    t.alive()
    sent, subs = pr["sent"], params.get("connections", 1)
    if min(r["got"]) < sent:
        raise BenchError(
            f"a subscriber got {min(r['got'])} of {sent} messages within {timeout:.0f}s"
        )
    elapsed = r["t_last"] - pr["t_first"]
    units = sent * subs
    load_cpu = pr["cpu_seconds"] + r["cpu_seconds"]
    out = {
        "value": units / elapsed,
        "messages": sent,
        "deliveries": units,
        "seconds": round(elapsed, 3),
        "producer_msg_per_s": round(sent / (pr["t_handled"] - pr["t_first"]), 1),
        "broker_cpu_seconds": round(w.broker_cpu, 3),
        "cpu_seconds_per_million": round(w.broker_cpu / units * 1e6, 3),
        "broker_cpu_share": round(w.broker_cpu / elapsed, 3),
        "broker_idle_cpu_share_before": idle,
        "producer_window_wait_seconds": round(pr["window_wait_seconds"], 3),
        "producer_cpu_seconds": round(pr["cpu_seconds"], 3),
        "consumer_cpu_seconds": round(r["cpu_seconds"], 3),
        # how busy the load CPU(s) were: well under 1.0, the generator was waiting on the broker
        "load_cpu_share": round(load_cpu / elapsed / len(ctx.plan.load or ctx.plan.all), 3),
        "other_cpu_share": w.other_share(load_cpu),
        "stale_messages_drained": stale,
        "send_frame_bytes": frame_bytes,
    }
    if r.get("ws_messages"):  # how the broker framed its MESSAGEs over WebSocket
        out["message_frames_per_ws_message"] = round((units + stale) / r["ws_messages"], 2)
    return out


def _latency(ctx: Context, ep: dict[str, Any], t: Target, p: dict[str, Any]) -> dict[str, Any]:
    params = {**ep, **p}
    idle = _idle_cpu_share(t, 0.3)
    with workers() as pool:
        c = ctx.spawn(pool, "bench.stomp_load:latency_consumer", params)
        stale = _ready(c).get("stale", 0)
        prod = ctx.spawn(pool, "bench.stomp_load:rate_producer", params)
        _ready(prod)
        with _Window(t) as w:
            prod.send(go=True)
            pr = prod.wait_result(params["seconds"] + 90)
            c.send(expect=pr["sent"])
            r = c.wait_result(params["timeout"] + 30)
    t.alive()
    if r["got"][0] < pr["sent"]:
        raise BenchError(f"the consumer got {r['got'][0]} of {pr['sent']} messages")
    load_cpu = pr["cpu_seconds"] + r["cpu_seconds"]
    ms = 1000.0
    return {
        "value": round(r["latency_p99_s"] * ms, 4),
        "latency_p50_ms": round(r["latency_p50_s"] * ms, 3),
        "latency_p90_ms": round(r["latency_p90_s"] * ms, 3),
        "latency_p99_ms": round(r["latency_p99_s"] * ms, 3),
        "latency_max_ms": round(r["latency_max_s"] * ms, 3),
        "latency_mean_ms": round(r["latency_mean_s"] * ms, 3),
        "messages": pr["sent"],
        "measured_messages": r["measured"],
        "achieved_rate": round(pr["achieved_rate"], 1),
        "broker_cpu_seconds": round(w.broker_cpu, 3),
        "cpu_seconds_per_million": round(w.broker_cpu / pr["sent"] * 1e6, 3),
        "broker_cpu_share": round(w.broker_cpu / w.wall, 3),
        "broker_idle_cpu_share_before": idle,
        "load_cpu_share": round(load_cpu / w.wall / len(ctx.plan.load or ctx.plan.all), 3),
        "other_cpu_share": w.other_share(load_cpu),
        "stale_messages_drained": stale,
    }


# =========================================================================================
# the three sides of a comparison
# =========================================================================================
@contextlib.contextmanager
def _relay_target(ctx: Context, transport: str) -> Iterator[Target]:
    with workers() as pool:
        w = Worker("bench.stomp_relay:relay", {"transport": transport}, ctx.plan.broker, "relay")
        pool.append(w)
        port = _ready(w)["port"]
        assert w.pid is not None
        proc = psutil.Process(w.pid)

        def cpu() -> float:
            c = proc.cpu_times()
            return float(c.user + c.system)

        yield Target(
            "relay",
            "127.0.0.1",
            port,
            port,
            cpu,
            facts={"process": f"bench.stomp_relay ({transport})", "pid": w.pid},
        )
        w.send(stop=True)
        w.wait_result(15)


def _failed(exc: Exception) -> dict[str, Any]:
    """What raised, as a failed side or cell records it (call it in the ``except`` block)."""
    return {
        "status": "failed",
        "error": f"{type(exc).__name__}: {exc}".strip()[:2000],
        "traceback": traceback.format_exc(limit=6),
    }


def _not_run(exc: Exception) -> dict[str, Any]:
    """Why a broker's side did not run: skipped (:class:`Skipped`), failed for the reason
    given (:class:`Unavailable`), or failed with a traceback (anything else)."""
    if isinstance(exc, Skipped):
        return {"status": "skipped", "reason": str(exc)}
    if isinstance(exc, Unavailable):
        return {"status": "failed", "error": str(exc)}
    return _failed(exc)


def _side(
    ctx: Context,
    opener: Callable[[], contextlib.AbstractContextManager[Target]],
    transport: str,
    measure: Measure,
) -> dict[str, Any]:
    try:
        with opener() as t:
            m = measure(ctx, t.endpoint(transport), t)
            return {"status": "ok", **m, "broker": t.facts}
    except Exception as exc:
        return _not_run(exc)


def _compare(
    ctx: Context,
    transport: str,
    measure: Measure,
    *,
    unit: str,
    params: dict[str, Any],
    about: str,
    ceiling: bool = True,
    verdict: bool = True,
) -> Result:
    sides: dict[str, dict[str, Any]] = {}
    if ceiling and ctx.option("ceiling", True):
        sides["generator_ceiling"] = _side(
            ctx, lambda: _relay_target(ctx, transport), transport, measure
        )
    sides["rabbitmq"] = _side(ctx, lambda: rabbitmq_target(ctx), transport, measure)
    sides["polymq"] = _side(ctx, lambda: polymq_target(ctx), transport, measure)
    pm, rb = sides["polymq"], sides["rabbitmq"]

    def ok(s: dict[str, Any]) -> bool:
        return s.get("status") == "ok"

    ratio = cpu_ratio = None
    if ok(pm) and ok(rb):
        ratio = round(pm["value"] / rb["value"], 3) if rb["value"] else None
        if rb["cpu_seconds_per_million"]:
            cpu_ratio = round(pm["cpu_seconds_per_million"] / rb["cpu_seconds_per_million"], 3)
    met = None
    if verdict and ratio is not None and cpu_ratio is not None:
        met = ratio >= 1.0 and cpu_ratio <= 1.0
    errors = [f"{name}: {s['error']}" for name, s in sides.items() if s["status"] == "failed"]

    def brief(s: dict[str, Any]) -> dict[str, Any]:
        keep = ("status", "value", "cpu_seconds_per_million", "reason", "error")
        out = {k: s[k] for k in keep if k in s}
        if "value" in out:
            out["value"] = round(out["value"], 3)
        return out

    ceiling_side = sides.get("generator_ceiling")
    extra: dict[str, Any] = {
        "rabbitmq_value": round(rb["value"], 3) if ok(rb) else None,
        "ratio_to_rabbitmq": ratio,
        "cpu_seconds_per_million": {
            "polymq": pm.get("cpu_seconds_per_million"),
            "rabbitmq": rb.get("cpu_seconds_per_million"),
        },
        "cpu_ratio_to_rabbitmq": cpu_ratio,
        "brokers": {"polymq": brief(pm), "rabbitmq": brief(rb)},
    }
    if ceiling_side is not None:
        extra["generator_ceiling"] = brief(ceiling_side)
    notes = [about]
    if rb["status"] == "skipped":
        notes.append(f"RabbitMQ skipped: {rb['reason']}")
    if ok(pm) and ok(rb):
        notes.append(
            f"polymq {pm['value']:,.1f} vs RabbitMQ {rb['value']:,.1f} {unit} (ratio {ratio}); "
            f"broker CPU-s per million: polymq {pm['cpu_seconds_per_million']:.2f}, "
            f"RabbitMQ {rb['cpu_seconds_per_million']:.2f} (ratio {cpu_ratio})."
        )
    busy = [
        f"{name} {s['broker_cpu_share']:.2f} / {s['load_cpu_share']:.2f}"
        for name, s in (("polymq", pm), ("RabbitMQ", rb))
        if ok(s)
    ]
    if busy:
        notes.append(
            "Broker CPU share / load-generator CPU share over the run (1.0 = one CPU busy): "
            + ", ".join(busy)
            + "."
        )
    if ceiling_side is not None and ok(ceiling_side):
        notes.append(
            f"The generator through a do-nothing relay: {ceiling_side['value']:,.1f} {unit} "
            f"(load CPU share {ceiling_side['load_cpu_share']})."
        )
    return Result(
        value=pm["value"] if ok(pm) else None,
        target=round(rb["value"], 3) if ok(rb) else None,
        met=met,
        verdict=True,
        params=params,
        notes=" ".join(notes),
        details=sides,
        error="; ".join(errors) or None,
        extra=extra,
        external_cpu_seconds=rb.get("broker_cpu_seconds", 0.0) if ok(rb) else 0.0,
    )


# =========================================================================================
# scenarios
# =========================================================================================
def _queue_params(ctx: Context, transport: str) -> dict[str, Any]:
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 4.0)
    p = {
        "destination": ctx.option("destination", f"/queue/polymq.bench.stomp.{transport}"),
        "count": ctx.option("count", 30_000 if ctx.quick else 1_000_000),
        "seconds": seconds,
        "batch": ctx.option("batch", 100),
        "ack": ctx.option("ack", "client"),
        "prefetch": ctx.option("prefetch", 1000),
        "ack_every": ctx.option("ack_every", 500),
        "window": ctx.option("window", 20_000),
        "quiet": ctx.option("quiet", 0.3),
        "timeout": seconds + (30 if ctx.quick else 60),
    }
    if transport == "ws":
        p["ws_frames_per_message"] = ctx.option("ws_frames_per_message", 1)
        p["ws_opcode"] = ctx.option("ws_opcode", "text")
    return p


def _run_queue(ctx: Context, transport: str) -> Result:
    p = _queue_params(ctx, transport)
    over = (
        "WebSocket (aiohttp client, v12.stomp, one frame per message)"
        if transport == "ws"
        else "TCP"
    )
    about = (
        f"STOMP over {over}: one producer process (pipelined SENDs, {p['batch']} per write, "
        f"{len(BODY)}-byte bodies, transient), one consumer process (ack:{p['ack']}, "
        f"prefetch-count {p['prefetch']}, cumulative ACK every {p['ack_every']}); the "
        f"producer stays at most {p['window']:,} messages ahead of the consumer; msg/s from "
        "the first SEND to the last MESSAGE."
    )

    def measure(c: Context, ep: dict[str, Any], t: Target) -> dict[str, Any]:
        return _queue(c, ep, t, p)

    return _compare(ctx, transport, measure, unit="msg/s", params=p, about=about)


def run_queue_tcp(ctx: Context) -> Result:
    return _run_queue(ctx, "tcp")


def run_queue_ws(ctx: Context) -> Result:
    return _run_queue(ctx, "ws")


def run_fanout(ctx: Context) -> Result:
    subs = ctx.option("subscribers", 10)
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 3.0)
    p = {
        "destination": ctx.option("destination", "/topic/polymq.bench.stomp.fanout"),
        "connections": subs,
        "count": ctx.option("count", 10_000 if ctx.quick else 300_000),
        "seconds": seconds,
        "batch": ctx.option("batch", 100),
        "window": ctx.option("window", 5_000),
        "ack": "auto",
        "quiet": 0.0,
        "timeout": seconds + (30 if ctx.quick else 90),
    }
    about = (
        f"STOMP over TCP: {subs} subscriber connections (ack:auto) on one topic in one "
        "process, one producer process (pipelined SENDs, at most "
        f"{p['window']:,} messages ahead of the slowest subscriber); deliveries/s = messages x "
        "subscribers / (last MESSAGE at the slowest subscriber - first SEND); CPU per "
        "million deliveries."
    )

    def measure(c: Context, ep: dict[str, Any], t: Target) -> dict[str, Any]:
        return _queue(c, ep, t, p)

    return _compare(ctx, "tcp", measure, unit="deliveries/s", params=p, about=about)


def run_latency(ctx: Context) -> Result:
    rate = ctx.option("rate", 5000)
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 4.0)
    p = {
        "destination": ctx.option("destination", "/queue/polymq.bench.stomp.latency"),
        "rate": rate,
        "seconds": seconds,
        "warmup_messages": int(rate * ctx.option("warmup_seconds", 0.2)),
        "ack": ctx.option("ack", "client"),
        "prefetch": ctx.option("prefetch", 1000),
        "ack_every": ctx.option("ack_every", 100),
        "quiet": ctx.option("quiet", 0.3),
        "timeout": seconds + 30,
    }
    about = (
        f"STOMP over TCP at a fixed {rate:,} msg/s for {seconds:g}s (one producer process, "
        "a SEND every millisecond tick carrying monotonic_ns in its 32-byte body; one "
        f"consumer process, ack:{p['ack']}); value = p99 end-to-end latency in ms after a "
        f"{p['warmup_messages']}-message warm-up (p50/p90/max in details). Both processes "
        "share the load CPU. No target: ratio_to_target is polymq / RabbitMQ."
    )

    def measure(c: Context, ep: dict[str, Any], t: Target) -> dict[str, Any]:
        return _latency(c, ep, t, p)

    r = _compare(
        ctx, "tcp", measure, unit="ms", params=p, about=about, ceiling=False, verdict=False
    )
    for name in ("polymq", "rabbitmq"):
        side = r.details.get(name, {})
        if side.get("status") == "ok":
            r.extra["brokers"][name]["latency_p50_ms"] = side["latency_p50_ms"]
    return r


SCENARIOS = [
    Scenario(
        "stomp_queue_tcp",
        None,
        "msg/s",
        "min",
        run_queue_tcp,
        about="STOMP queue over TCP, polymq vs RabbitMQ",
    ),
    Scenario(
        "stomp_queue_ws",
        None,
        "msg/s",
        "min",
        run_queue_ws,
        about="STOMP queue over WebSocket, polymq vs RabbitMQ",
    ),
    Scenario(
        "stomp_fanout_10",
        None,
        "deliveries/s",
        "min",
        run_fanout,
        about="STOMP topic to 10 subscribers, polymq vs RabbitMQ",
    ),
    Scenario(
        "stomp_latency_fixed_rate",
        None,
        "ms",
        "max",
        run_latency,
        about="STOMP latency at a fixed rate, polymq vs RabbitMQ",
    ),
]
