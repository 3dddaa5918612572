"""The command line: run the scenarios, write one JSON document.

::

    python -m bench [--out FILE] [--only NAME[,NAME]] [--quick] [--no-pin] [--settle S]
                    [--set NAME.KEY=VALUE ...] [--profile DIR] [--list]
                    [--backlog-messages N] [--fast-producer-seconds S]

``--quick`` uses small counts and short durations (a smoke run, well under a minute).
``--set`` overrides one parameter of one scenario (``--set topic_fanout_100.connections=8``);
the value is parsed as JSON when it can be. ``--settle S`` waits, before each scenario, up to
S seconds for other processes to leave the CPUs alone (a shared machine). ``--profile DIR``
runs each broker under cProfile (slower: the numbers are then not the benchmark's), keeps the
pstats files in DIR and adds each scenario's top functions by own time to its entry as
``profile``.

Each entry of ``scenarios`` holds ``name``, ``target``, ``unit``, ``value``,
``ratio_to_target`` (value / target), ``bound`` (``min``: the target is a floor, ``max``: a
ceiling), ``met``, ``status`` (``ok``, ``failed``, ``skipped``), ``params``, ``notes``,
``details``, ``wall_seconds``, ``other_cpu_seconds`` / ``other_cpu_share`` (CPU time other
processes on the machine used meanwhile: a busy neighbour skews the numbers) and, when it
failed, ``error``. A comparison measures its own target (the STOMP scenarios: RabbitMQ's
figure in the same run, so ``ratio_to_target`` is polymq / RabbitMQ) and may add keys of its
own (``ratio_to_rabbitmq``, ``cpu_seconds_per_million``, ...); one whose side failed is
``failed`` but keeps what the other sides measured.
The document is rewritten after every scenario, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from .harness import CpuPlan, machine_info
from .scenario import Context, Scenario, Skipped


def all_scenarios() -> list[Scenario]:
    from . import (
        amqp,
        avro,
        backlog,
        cluster,
        cluster_backlog,
        cluster_rolling,
        fanout,
        flow,
        http,
        longpoll,
        metrics,
        native,
        rabbitmq,
        scaling,
        stomp,
    )

    return [
        *native.SCENARIOS,
        *backlog.SCENARIOS,
        *flow.SCENARIOS,
        *http.SCENARIOS,
        *longpoll.SCENARIOS,
        *fanout.SCENARIOS,
        *rabbitmq.SCENARIOS,
        *stomp.SCENARIOS,
        *scaling.SCENARIOS,
        *avro.SCENARIOS,
        *amqp.SCENARIOS,
        *cluster.SCENARIOS,
        *cluster_backlog.SCENARIOS,
        *cluster_rolling.SCENARIOS,
        *metrics.SCENARIOS,
    ]


def _parse_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        name, dot, param = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set {item!r}: expected NAME.KEY=VALUE")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(name, {})[param] = value
    return out


def _busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return float(
        sum(t)
        - t.idle
        - getattr(t, "iowait", 0.0)
        - getattr(t, "guest", 0.0)
        - getattr(t, "guest_nice", 0.0)
    )


def _own_cpu_seconds() -> float:
    """This process and its reaped children (the broker, the load generators)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _settle(limit: float) -> float:
    """Wait up to ``limit`` seconds for the machine to be quiet (other processes using less
    than 10% of the CPUs over a second); returns the share they used in the last second."""
    deadline = time.monotonic() + limit
    while True:
        busy0 = _busy_cpu_seconds()
        time.sleep(1.0)
        share = (_busy_cpu_seconds() - busy0) / (os.cpu_count() or 1)
        if share < 0.1 or time.monotonic() >= deadline:
            return share


def _entry(s: Scenario, ctx: Context) -> dict[str, Any]:
    t0 = time.monotonic()
    busy0, own0 = _busy_cpu_seconds(), _own_cpu_seconds()
    external = 0.0
    entry: dict[str, Any] = {
        "name": s.name,
        "target": s.target,
        "unit": s.unit,
        "bound": s.bound,
        "value": None,
        "ratio_to_target": None,
        "met": None,
        "status": "ok",
        "params": {},
        "notes": s.about,
        "details": {},
    }
    try:
        r = s.run(ctx)
    except Skipped as exc:
        entry.update(status="skipped", notes=str(exc), params=dict(ctx.used))
    except Exception as exc:  # a failed scenario is recorded; the run goes on
        entry.update(
            status="failed",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(limit=8),
            params=dict(ctx.used),
        )
    else:
        entry.update(params=r.params, notes=r.notes, details=r.details, **r.extra)
        target = r.target if r.target is not None else s.target
        entry["target"] = target
        if r.value is not None:
            entry["value"] = round(r.value, 3)
            if target and r.comparable:
                entry["ratio_to_target"] = round(r.value / target, 3)
                entry["met"] = r.value >= target if s.bound == "min" else r.value < target
        if r.verdict:
            entry["met"] = r.met
        if r.error:
            entry.update(status="failed", error=r.error)
        external = r.external_cpu_seconds
    if ctx.profiles:
        entry["profile"] = [_profile_top(p) for p in ctx.profiles if p.exists()]
    wall = time.monotonic() - t0
    entry["wall_seconds"] = round(wall, 2)
    # CPU that other processes on the machine used meanwhile: a busy neighbour (a test run,
    # a build) skews every number here, so say how much there was.
    other = max(0.0, (_busy_cpu_seconds() - busy0) - (_own_cpu_seconds() - own0) - external)
    entry["other_cpu_seconds"] = round(other, 2)
    entry["other_cpu_share"] = round(other / (wall * (os.cpu_count() or 1)), 3) if wall else None
    return entry


def _profile_top(path: Path, n: int = 25) -> dict[str, Any]:
    import pstats

    st = pstats.Stats(str(path))
    total = st.total_tt or 1.0  # type: ignore[attr-defined]
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    top = []
    for (file, line, func), (_cc, ncalls, tt, ct, _callers) in rows[:n]:
        where = f"{Path(file).name}:{line}({func})" if line else func
        top.append(f"{tt / total:6.1%} own {tt:7.2f}s cum {ct:7.2f}s {ncalls:>9} calls  {where}")
    return {
        "process": path.stem.split("-", 1)[1] if "-" in path.stem else path.stem,
        "file": str(path),
        "total_seconds": round(total, 2),
        "top_by_own_time": top,
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _summary(e: dict[str, Any]) -> str:
    if e["status"] != "ok":
        why = e.get("error") or e["notes"]
        got = f" (value {e['value']:,.1f} {e['unit']})" if e.get("value") is not None else ""
        return f"{e['name']:<34} {e['status'].upper()}{got}: {why.splitlines()[0] if why else ''}"
    value = f"{e['value']:,.1f} {e['unit']}" if e["value"] is not None else "-"
    if (e.get("other_cpu_share") or 0) > 0.05:
        value += f" [other processes used {e['other_cpu_share']:.0%} of the CPUs]"
    if e["target"] is None:
        return f"{e['name']:<34} {value}"
    op = ">=" if e["bound"] == "min" else "<"
    if e["met"] is None and e["ratio_to_target"] is not None:
        verdict = f"ratio {e['ratio_to_target']}, no verdict"
    elif e["met"] is None:
        verdict = "not comparable at this scale"
    else:
        verdict = f"ratio {e['ratio_to_target']}, {'met' if e['met'] else 'MISSED'}"
    return f"{e['name']:<34} {value}  (target {op} {e['target']:,} {e['unit']}: {verdict})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench-results.json", help="the JSON document to write")
    p.add_argument("--only", action="append", default=[], help="scenario name(s), comma-separated")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    p.add_argument("--no-pin", action="store_true", help="do not pin broker and load to CPUs")
    p.add_argument("--set", action="append", default=[], metavar="NAME.KEY=VALUE")
    p.add_argument(
        "--settle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each scenario, wait up to this long for other processes to go quiet",
    )
    p.add_argument("--profile", default=None, metavar="DIR", help="run brokers under cProfile")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument(
        "--backlog-messages",
        type=int,
        default=None,
        metavar="N",
        help="the backlog scenario's message count (default 1M; env BENCH_BACKLOG_MESSAGES)",
    )
    p.add_argument(
        "--fast-producer-seconds",
        type=float,
        default=None,
        metavar="S",
        help="how long the fast_producer scenario's producer runs (default 300)",
    )
    args = p.parse_args(argv)

    scenarios = all_scenarios()
    if args.list:
        for s in scenarios:
            print(s.name)
        return 0
    wanted = [n for item in args.only for n in item.split(",") if n]
    known = {s.name for s in scenarios}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        print(
            f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            file=sys.stderr,
        )
        return 2
    if wanted:
        scenarios = [s for s in scenarios if s.name in wanted]
    sets = _parse_sets(args.set)
    if args.backlog_messages is not None:
        sets.setdefault("backlog", {})["messages"] = args.backlog_messages
    if args.fast_producer_seconds is not None:
        sets.setdefault("fast_producer", {})["seconds"] = args.fast_producer_seconds

    plan = CpuPlan(pin=not args.no_pin)
    out = Path(args.out)
    doc: dict[str, Any] = {
        "machine": machine_info(plan),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
        "scenarios": [],
    }
    t0 = time.monotonic()
    for s in scenarios:
        if args.settle > 0:
            share = _settle(args.settle)
            if share >= 0.1:
                print(
                    f"bench: the machine is still busy ({share:.0%} of the CPUs in use)",
                    file=sys.stderr,
                )
        print(f"bench: {s.name} ...", file=sys.stderr, flush=True)
        ctx = Context(
            name=s.name,
            quick=args.quick,
            plan=plan,
            overrides=sets.get(s.name, {}),
            profile_dir=Path(args.profile) if args.profile else None,
        )
        entry = _entry(s, ctx)
        doc["scenarios"].append(entry)
        doc["total_seconds"] = round(time.monotonic() - t0, 1)
        _write(out, doc)
        print(
            f"bench: {_summary(entry)}  [{entry['wall_seconds']:.0f}s]", file=sys.stderr, flush=True
        )
    print(f"bench: wrote {out} in {doc['total_seconds']:.0f}s", file=sys.stderr)
    return 0
