"""The two AMQP brokers the AMQP scenarios compare, behind one shape (:class:`AmqpTarget`).

``rabbitmq``: the machine's RabbitMQ on 127.0.0.1:5672 with guest/guest
(``POLYMQ_BENCH_AMQP_URL`` to point elsewhere), as the STOMP scenarios use it. When nothing
listens there and ``rabbitmq-server`` is installed, a private node is started for the scenario
(:class:`tests.rabbit.RabbitNode`: its own node name, ports and data directory) and removed
afterwards. Its CPU is its ``beam.smp`` process's (every thread), pinned to the broker CPU
while measured and restored afterwards.

``polymq``: a fresh ``polymq run --amqp-port 0`` (core and frontends in one process) once
``polymq run`` mounts the AMQP frontend; until then a fresh ``polymq core`` and, beside it,
the AMQP frontend alone (``python -m polymq_amqp``), both pinned to the broker CPU, their CPU
summed. If neither exists the polymq side is recorded as failed with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import psutil

from .harness import BenchError, cpu_seconds_of
from .scenario import Context, Skipped
from .stomp_targets import Unavailable, _beam, _listening, _pinned, _run_knows

__all__ = ["DEFAULT_URL", "AmqpTarget", "polymq_target", "rabbitmq_target"]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


@dataclass
class AmqpTarget:
    name: str
    endpoint: dict[str, Any]  # host, port, user, password, vhost: what a worker connects with
    cpu_seconds: Callable[[], float]
    facts: dict[str, Any] = field(default_factory=dict)
    alive: Callable[[], None] = lambda: None


def _endpoint(url: str) -> dict[str, Any]:
    u = urlparse(url)
    vhost = unquote(u.path[1:]) if len(u.path) > 1 else "/"
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 5672,
        "user": unquote(u.username or "guest"),
        "password": unquote(u.password or "guest"),
        "vhost": vhost,
    }


def _cpu_of(procs: list[psutil.Process]) -> Callable[[], float]:
    return functools.partial(cpu_seconds_of, procs)


# ---- RabbitMQ --------------------------------------------------------------------------------
@contextlib.contextmanager
def rabbitmq_target(ctx: Context) -> Iterator[AmqpTarget]:
    url = os.environ.get("POLYMQ_BENCH_AMQP_URL", DEFAULT_URL)
    ep = _endpoint(url)
    if _listening(ep["host"], ep["port"]):
        beam = _beam(ep["port"])
        if beam is None:
            raise Skipped(
                f"an AMQP server answers on {ep['host']}:{ep['port']} but no single local "
                "beam.smp process was found to measure its CPU"
            )
        with _pinned(beam, ctx.plan.broker) as pinned:
            yield AmqpTarget(
                "rabbitmq",
                ep,
                _cpu_of([beam]),
                facts={
                    "process": "beam.smp (the machine's RabbitMQ)",
                    "pid": beam.pid,
                    "address": f"{ep['host']}:{ep['port']}",
                    "pinned_to": ctx.plan.broker if pinned else None,
                    "threads": beam.num_threads(),
                },
            )
        return
    root = Path(__file__).resolve().parent.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tests.rabbit import RabbitNode, find_server

    if find_server() is None:
        raise Skipped(
            f"no RabbitMQ on {ep['host']}:{ep['port']} and rabbitmq-server is not installed "
            "(apt-get install rabbitmq-server)"
        )
    node = RabbitNode()
    try:
        try:
            node.start()
        except RuntimeError as exc:
            raise Skipped(f"a private RabbitMQ node did not start: {exc}") from exc
        beam = node.beam()
        if beam is None:
            raise Skipped("the private RabbitMQ node has no beam.smp process to measure")
        with _pinned(beam, ctx.plan.broker) as pinned:

            def alive() -> None:
                if not node.alive:
                    raise BenchError(f"the private RabbitMQ node died:\n{node.log_tail()}")

            yield AmqpTarget(
                "rabbitmq",
                {**ep, "port": node.port, "user": "guest", "password": "guest", "vhost": "/"},
                _cpu_of([beam]),
                facts={
                    "process": "beam.smp (a private node started for the scenario)",
                    "pid": beam.pid,
                    "node": node.node,
                    "pinned_to": ctx.plan.broker if pinned else None,
                },
                alive=alive,
            )
    finally:
        node.cleanup()


# ---- polymq ----------------------------------------------------------------------------------
def _pin_all(proc: psutil.Process, cpus: list[int] | None) -> None:
    if cpus is None:
        return
    with contextlib.suppress(psutil.Error):
        for t in proc.threads():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(t.id, cpus)


@contextlib.contextmanager
def polymq_target(ctx: Context) -> Iterator[AmqpTarget]:
    ep = {"host": "127.0.0.1", "user": "guest", "password": "guest", "vhost": "/"}
    if _run_knows("--amqp-port"):
        with ctx.broker("run", "--amqp-port", "0") as b:
            if "amqp" not in b.ports:
                raise Unavailable(
                    f"polymq run wrote no amqp port (it wrote {', '.join(sorted(b.ports))})"
                )
            yield AmqpTarget(
                "polymq",
                {**ep, "port": b.ports["amqp"]},
                b.cpu_seconds,
                facts={"process": "polymq run (core + every frontend)", "pid": b.pid},
                alive=b.check_alive,
            )
        return
    if importlib.util.find_spec("polymq_amqp.service") is None:
        raise Unavailable(
            "polymq has no AMQP server yet (no polymq_amqp.service, and `polymq run` has no "
            "--amqp-port)"
        )
    with ctx.broker("core") as b:
        yield from _with_frontend(ctx, b, ep)


def _with_frontend(ctx: Context, b: Any, ep: dict[str, Any]) -> Iterator[AmqpTarget]:
    """The AMQP frontend alone beside a running core (until ``polymq run`` mounts it)."""
    workdir = Path(tempfile.mkdtemp(prefix="polymq-bench-amqp-"))
    ports_file = workdir / "ports.json"
    log_path = workdir / "amqp.log"
    argv = [
        sys.executable, "-m", "polymq_amqp", "--amqp-port", "0", "--amqp-admin-port", "0",
        "--core", f"127.0.0.1:{b.core_port}", "--ports-file", str(ports_file),
    ]  # fmt: skip
    env = {**os.environ, "POLYMQ_LOG_LEVEL": "WARNING"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while not ports_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise Unavailable(f"python -m polymq_amqp did not start:\n{tail}")
            time.sleep(0.05)
        ports = json.loads(ports_file.read_text())
        front = psutil.Process(proc.pid)
        _pin_all(front, ctx.plan.broker)

        def alive() -> None:
            b.check_alive()
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise BenchError(f"the AMQP frontend exited ({proc.returncode}):\n{tail}")

        yield AmqpTarget(
            "polymq",
            {**ep, "port": ports["amqp"]},
            _cpu_of([psutil.Process(b.pid), front]),
            facts={
                "process": "polymq core + python -m polymq_amqp (two processes, CPU summed; "
                "polymq run does not mount AMQP yet)",
                "pids": [b.pid, proc.pid],
            },
            alive=alive,
        )
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
