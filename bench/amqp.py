"""AMQP 0-9-1 scenarios: polymq's AMQP frontend against RabbitMQ, same clients, same load.

One scenario, ``amqp``, measures a matrix: three workloads (:mod:`bench.amqp_load`) —

- ``publish``: publish without confirms into a queue with no consumer; msg/s until the
  broker answered a request sent after the last publish on the channel (the time until the
  queue held them all is in the details, ``enqueued_seconds``);
- ``publish_confirm``: publish with publisher confirms, at most ``window`` unconfirmed;
  msg/s until the last confirm;
- ``consume_ack``: a queue filled beforehand (with confirms, not measured) is consumed with
  ``basic.qos(prefetch)`` and a ``basic.ack(multiple)`` every ``ack_every`` deliveries;
  msg/s from basic.consume to the last delivery —

each with two clients, aio-pika (what users run; it saturates a CPU near 8k msg/s here) and
``pamqp``, the load generator in :mod:`bench.amqp_wire` (pamqp frames over raw asyncio),
against both brokers (:mod:`bench.amqp_targets`). Every measurement runs its client in a
process of its own on the load CPU(s); the broker is pinned to the broker CPU. Broker CPU
seconds are read over the measured interval and reported per million messages.

Equivalent work on both brokers: 32-byte transient messages (``delivery_mode`` 1) through
the default exchange into a non-durable queue ``polymq.bench.amqp`` that is purged before
every run and deleted at the end.

Both brokers are up for the whole scenario, and each cell is measured against one and at
once against the other (which goes first alternates), ``rounds`` times (5; 1 with
``--quick``): the two measurements of a pair are seconds apart, so a slow spell of the
machine falls on both. A cell's ratio is the median of its rounds' ratios (paired measurements);
its figures for a broker are the median of its rounds (msg/s, and the CPU-seconds per
million of the same measurement). Here the speed of the machine
drifts by a third within minutes (RabbitMQ's pamqp publish: 65k, 85k, 75k msg/s in three
runs), and aio-pika cells, bound by the client's CPU against either broker, move by ±15%
from one measurement to the next: one measurement each, minutes apart, made their ratio a
coin toss.

Where the client is the bottleneck against both brokers (its CPU share 0.95 or more: aio-pika
here), msg/s is what the client can do, and a broker shows only in what each message costs
the client: such a cell is marked ``client_bound`` and lists each broker's client CPU
microseconds per message (``client_cpu_us_per_message``, the median of its rounds).

The entry's ``value`` is the geometric mean over the cells of polymq's msg/s / RabbitMQ's
(``x RabbitMQ``); ``cells`` lists each client and workload with both figures, the ratio, the
ratio of each round, and both brokers' CPU-seconds per million messages; ``details`` holds
every measurement in full (``details.<broker>.rounds``).
``--set amqp.clients='["pamqp"]'`` and ``--set amqp.workloads='["publish"]'`` narrow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
from collections.abc import Callable
from typing import Any

from .amqp_load import admin
from .amqp_targets import AmqpTarget, polymq_target, rabbitmq_target
from .harness import BenchError, Worker, workers
from .scenario import Context, Result, Scenario
from .stomp import _failed, _idle_cpu_share, _not_run, _Window

__all__ = ["SCENARIOS"]

CLIENTS = {"pamqp": "wire", "aio-pika": "pika"}
WORKLOADS = ("publish", "publish_confirm", "consume_ack")
QUEUE = "polymq.bench.amqp"


def _params(ctx: Context, client: str) -> dict[str, Any]:
    fast = client == "pamqp"
    if ctx.quick:
        count = 20_000 if fast else 3_000
    else:
        count = 400_000 if fast else 60_000
    key = "pamqp" if fast else "aio_pika"
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 6.0)
    return {
        "queue": QUEUE,
        "count": ctx.option(f"{key}_count", count),
        "seconds": seconds,
        "batch": ctx.option("batch", 100),
        "window": ctx.option(f"{key}_window", 1000 if fast else 100),
        "prefetch": ctx.option("prefetch", 1000),
        "ack_every": ctx.option("ack_every", 100),
        "body_bytes": ctx.option("body_bytes", 32),
        "persistent": ctx.option("persistent", False),
        "timeout": seconds + (30 if ctx.quick else 90),
    }


def _housekeep(ep: dict[str, Any], action: str) -> None:
    with contextlib.suppress(Exception):
        asyncio.run(admin({**ep, "queue": QUEUE}, action))


def _measure(t: AmqpTarget, w: Worker, workload: str, p: dict[str, Any]) -> dict[str, Any]:
    """One measurement by the client worker ``w`` against ``t``."""
    timeout = float(p["timeout"])
    stale = 0
    if workload == "consume_ack":
        # fill the queue first (the fast client, with confirms: every message is in)
        w.send(run="fill", params=p)
        w.expect("prepared", 60)
        w.send(go=True)
        w.expect("measured", timeout + 60)
        filled = int(w.expect("run_result", 60)["run_result"]["sent"])
        w.send(run="consume", params={**p, "count": filled})
        stale = int(w.expect("prepared", 60).get("depth", 0)) - filled
    else:
        w.send(run="publish", params={**p, "confirms": workload == "publish_confirm"})
        w.expect("prepared", 60)
    idle = _idle_cpu_share(t, 0.3)  # type: ignore[arg-type]
    with _Window(t) as win:  # type: ignore[arg-type]
        w.send(go=True)
        w.expect("measured", timeout + 30)
    r = w.expect("run_result", 60)["run_result"]
    t.alive()
    n = int(r.get("sent") or r.get("got") or 0)
    if n <= 0:
        raise BenchError("no message was moved")
    seconds = r["t_done"] - r["t_go"]
    load_cpu = float(r["cpu_seconds"])
    out = {
        "value": n / seconds,
        "messages": n,
        "seconds": round(seconds, 3),
        "broker_cpu_seconds": round(win.broker_cpu, 3),
        "cpu_seconds_per_million": round(win.broker_cpu / n * 1e6, 3),
        "broker_cpu_share": round(win.broker_cpu / win.wall, 3),
        "broker_idle_cpu_share_before": idle,
        "client_cpu_seconds": round(load_cpu, 3),
        # near 1.0: the client was the bottleneck, not the broker
        "client_cpu_share": round(load_cpu / seconds, 3),
        "other_cpu_share": win.other_share(load_cpu),
    }
    if r.get("enqueued_seconds") is not None:
        out["enqueued_seconds"] = round(r["enqueued_seconds"], 3)
        out["enqueued_msg_per_s"] = round(n / r["enqueued_seconds"], 1)
    if r.get("t_first"):
        out["first_delivery_after_seconds"] = round(r["t_first"] - r["t_go"], 4)
    if stale:
        out["stale_messages_in_queue"] = stale
    return out


class _Side:
    """One broker (open for the whole scenario) and its client workers, one process per
    client (made again after a cell fails)."""

    def __init__(self, ctx: Context, target: AmqpTarget, pool: Any) -> None:
        self.ctx = ctx
        self.target = target
        self.pool = pool
        self.live: dict[str, Worker] = {}
        self.rounds: list[dict[str, Any]] = []  # each round's cells

    def measure(self, client: str, workload: str) -> dict[str, Any]:
        ctx, t = self.ctx, self.target
        p = _params(ctx, client)
        try:
            w = self.live.get(client)
            if w is None:
                w = ctx.spawn(self.pool, f"bench.amqp_load:{CLIENTS[client]}_worker", t.endpoint)
                w.expect("ready", 60)
                self.live[client] = w
            _housekeep(t.endpoint, "purge")
            return {"status": "ok", **_measure(t, w, workload, p)}
        except Exception as exc:
            dead = self.live.pop(client, None)
            if dead is not None:
                dead.close()
            return _failed(exc)

    def close(self) -> None:
        for w in self.live.values():
            with contextlib.suppress(Exception):
                w.send(stop=True)
                w.wait_result(15)
        _housekeep(self.target.endpoint, "delete")


def _open(
    stack: contextlib.ExitStack,
    ctx: Context,
    opener: Callable[[], contextlib.AbstractContextManager[AmqpTarget]],
) -> _Side | dict[str, Any]:
    """A broker's side, or why there is none (skipped / failed)."""
    try:
        t = stack.enter_context(opener())
        side = _Side(ctx, t, stack.enter_context(workers()))
        stack.callback(side.close)
        return side
    except Exception as exc:
        return _not_run(exc)


def _measure_all(
    ctx: Context, cells: list[tuple[str, str]], rounds: int
) -> dict[str, dict[str, Any]]:
    """Both brokers open at once; each cell measured against one and then at once against
    the other (the first broker alternating from round to round), ``rounds`` times: the two
    measurements of a pair are seconds apart, so a slow spell of the machine falls on both."""
    with contextlib.ExitStack() as stack:
        sides: dict[str, _Side | dict[str, Any]] = {
            "rabbitmq": _open(stack, ctx, lambda: rabbitmq_target(ctx)),
            "polymq": _open(stack, ctx, lambda: polymq_target(ctx)),
        }
        open_sides = {name: s for name, s in sides.items() if isinstance(s, _Side)}
        order = list(open_sides)
        for r in range(rounds):
            for side in open_sides.values():
                side.rounds.append({})
            for client, workload in cells:
                for name in order if r % 2 == 0 else order[::-1]:
                    side = open_sides[name]
                    side.rounds[-1][f"{client}/{workload}"] = side.measure(client, workload)
        out: dict[str, dict[str, Any]] = {}
        for name, s in sides.items():
            if isinstance(s, _Side):
                out[name] = _combined(
                    [{"status": "ok", "broker": s.target.facts, "cells": c} for c in s.rounds]
                )
            else:
                out[name] = s
        return out


def _cell(side: dict[str, Any], key: str) -> dict[str, Any]:
    if side.get("status") != "ok":
        return {"status": side.get("status"), "why": side.get("reason") or side.get("error")}
    return dict(side["cells"].get(key, {"status": "missing"}))


def _client_us(c: dict[str, Any]) -> float | None:
    n = c.get("messages") or 0
    return round(c["client_cpu_seconds"] / n * 1e6, 2) if n else None


def _median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None


def _combined(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One broker's rounds as one side: each cell is the measurement with the median msg/s
    of the rounds that measured it (the lower middle one of an even count), with every
    round's msg/s beside it."""
    ok = [r for r in rounds if r.get("status") == "ok"]
    if not ok:
        return rounds[-1]
    keys = {k for r in ok for k in r["cells"]}
    cells: dict[str, Any] = {}
    for key in sorted(keys):
        runs = [r["cells"][key] for r in ok if key in r["cells"]]
        good = sorted((c for c in runs if c.get("status") == "ok"), key=lambda c: c["value"])
        if not good:
            cells[key] = runs[-1]
            continue
        median = dict(good[(len(good) - 1) // 2])
        median["rounds_msg_per_s"] = [
            round(c["value"], 1) if c.get("status") == "ok" else None for c in runs
        ]
        # what each message cost the client (its CPU over the messages it moved): where the
        # client is the bottleneck this, not the broker, sets the msg/s
        median["rounds_client_cpu_us_per_message"] = [
            _client_us(c) if c.get("status") == "ok" else None for c in runs
        ]
        cells[key] = median
    return {**ok[-1], "cells": cells, "rounds": rounds}


def run_amqp(ctx: Context) -> Result:
    clients = list(ctx.option("clients", list(CLIENTS)))
    workloads = list(ctx.option("workloads", list(WORKLOADS)))
    unknown = [c for c in clients if c not in CLIENTS]
    unknown += [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise BenchError(f"unknown client(s)/workload(s): {unknown}")
    cells = [(c, w) for c in clients for w in workloads]
    rounds = int(ctx.option("rounds", 1 if ctx.quick else 5))
    if rounds < 1:
        raise BenchError("amqp.rounds must be at least 1")
    sides = _measure_all(ctx, cells, rounds)
    table: list[dict[str, Any]] = []
    ratios: list[float] = []
    errors: list[str] = []
    for name, side in sides.items():
        if side["status"] == "failed":
            errors.append(f"{name}: {side['error']}")
        elif side["status"] == "ok":
            errors += [
                f"{name} {k}: {c['error']}" for k, c in side["cells"].items() if c["status"] != "ok"
            ]
    for client, workload in cells:
        key = f"{client}/{workload}"
        pm, rb = _cell(sides["polymq"], key), _cell(sides["rabbitmq"], key)
        row: dict[str, Any] = {"client": client, "workload": workload}
        for name, c in (("polymq", pm), ("rabbitmq", rb)):
            row[name] = (
                {
                    "msg_per_s": round(c["value"], 1),
                    "cpu_seconds_per_million": c["cpu_seconds_per_million"],
                    "client_cpu_share": c["client_cpu_share"],
                    "client_cpu_us_per_message": _median_of(
                        c.get("rounds_client_cpu_us_per_message") or [_client_us(c)]
                    ),
                }
                if c.get("status") == "ok"
                else {"status": c.get("status"), "why": c.get("why") or c.get("error")}
            )
        if pm.get("status") == "ok" and rb.get("status") == "ok":
            both = zip(
                pm.get("rounds_msg_per_s") or [], rb.get("rounds_msg_per_s") or [], strict=False
            )
            paired = [a / b for a, b in both if a and b]
            # the median of the rounds' ratios (each of two measurements seconds apart);
            # with one round, the ratio of the two measurements
            ratio = statistics.median(paired) if paired else pm["value"] / rb["value"]
            row["ratio_to_rabbitmq"] = round(ratio, 3)
            row["ratio_each_round"] = [round(r, 3) for r in paired]
            if rb["cpu_seconds_per_million"]:
                row["cpu_ratio_to_rabbitmq"] = round(
                    pm["cpu_seconds_per_million"] / rb["cpu_seconds_per_million"], 3
                )
            # bound by the client against both: its msg/s is what the client can do, and the
            # broker shows only in what each message costs the client
            row["client_bound"] = min(pm["client_cpu_share"], rb["client_cpu_share"]) >= 0.95
            ratios.append(ratio)
        table.append(row)
    value = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    notes = [
        "AMQP 0-9-1, polymq vs RabbitMQ: publish (no confirms), publish with confirms, "
        "consume with acks; 32-byte transient messages, default exchange, one non-durable "
        f"queue; clients {', '.join(clients)}, each in its own process on the load CPU(s). "
        "value = geometric mean over the cells of polymq msg/s / RabbitMQ msg/s, each cell's "
        f"ratio the median over {rounds} round(s) of a pair of measurements seconds apart; "
        "msg/s and CPU-s/M: each broker's median."
    ]
    for row in table:
        pm, rb = row["polymq"], row["rabbitmq"]
        if "msg_per_s" in pm and "msg_per_s" in rb:
            notes.append(
                f"{row['client']} {row['workload']}: polymq {pm['msg_per_s']:,.0f} vs RabbitMQ "
                f"{rb['msg_per_s']:,.0f} msg/s (x{row['ratio_to_rabbitmq']}), CPU-s/M "
                f"{pm['cpu_seconds_per_million']:.1f} vs {rb['cpu_seconds_per_million']:.1f}"
                + (
                    f", client-bound against both (client CPU us/msg "
                    f"{pm['client_cpu_us_per_message']} vs {rb['client_cpu_us_per_message']})"
                    if row.get("client_bound")
                    else ""
                )
                + (
                    f" (rounds x{', x'.join(str(r) for r in row['ratio_each_round'])})."
                    if row.get("ratio_each_round")
                    else "."
                )
            )
    if sides["rabbitmq"]["status"] == "skipped":
        notes.append(f"RabbitMQ skipped: {sides['rabbitmq']['reason']}")
    rb_cpu = sum(
        c.get("broker_cpu_seconds", 0.0)
        for r in sides["rabbitmq"].get("rounds", [])
        for c in r.get("cells", {}).values()
        if c.get("status") == "ok"
    )
    return Result(
        value=value,
        params={
            **_params(ctx, "pamqp"),
            "clients": clients,
            "workloads": workloads,
            "rounds": rounds,
        },
        notes=" ".join(notes),
        details=sides,
        verdict=True,
        met=None,
        error="; ".join(errors) or None,
        extra={
            "cells": table,
            "ratio_to_rabbitmq": {
                f"{r['client']}/{r['workload']}": r.get("ratio_to_rabbitmq") for r in table
            },
        },
        external_cpu_seconds=rb_cpu,
    )


SCENARIOS = [
    Scenario(
        "amqp",
        None,
        "x RabbitMQ",
        None,
        run_amqp,
        about="AMQP publish / confirm / consume-ack, polymq vs RabbitMQ, aio-pika and pamqp",
    ),
]
