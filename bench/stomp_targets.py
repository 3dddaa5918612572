"""The two STOMP brokers the STOMP scenarios compare, behind one shape (:class:`Target`).

``polymq``: a fresh ``polymq run`` (core + frontends in one process, on the broker CPU) with
``--stomp-port 0 --stomp-ws-port 0``; its ports file must name ``stomp`` (and ``stomp_ws``).

``rabbitmq``: the machine's RabbitMQ with its STOMP plugins (STOMP on 127.0.0.1:61613,
web-stomp on ws://127.0.0.1:15674/ws; ``POLYMQ_BENCH_RABBITMQ_STOMP`` /
``POLYMQ_BENCH_RABBITMQ_WS`` as ``HOST:PORT`` to point elsewhere). When those ports are not
listening and ``rabbitmq-plugins`` exists, ``rabbitmq-plugins enable rabbitmq_stomp
rabbitmq_web_stomp`` runs once (idempotent); when RabbitMQ itself is not running it is
started once (``rabbitmq-server -detached``). If it is not installed or does not come up,
the RabbitMQ side is recorded as skipped with the reason. Its CPU is the ``beam.smp``
process's (every thread, via psutil); while a scenario measures it, every thread of it is
pinned to the broker CPU like polymq, and the previous affinity is restored afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from .scenario import Context, Skipped

__all__ = ["Target", "Unavailable", "polymq_target", "rabbitmq_target"]


class Unavailable(Exception):
    """This broker cannot take part (the message says why); the other side still runs."""


@dataclass
class Target:
    name: str
    host: str
    tcp_port: int | None
    ws_port: int | None
    cpu_seconds: Callable[[], float]
    ws_path: str = "/ws"
    login: str = "guest"
    passcode: str = "guest"
    facts: dict[str, Any] = field(default_factory=dict)
    alive: Callable[[], None] = lambda: None

    def endpoint(self, transport: str) -> dict[str, Any]:
        """The ``params`` keys a :mod:`bench.stomp_load` worker connects with."""
        port = self.ws_port if transport == "ws" else self.tcp_port
        if port is None:
            what = "a STOMP WebSocket port" if transport == "ws" else "a STOMP TCP port"
            raise Unavailable(f"{self.name} has no {what}")
        return {
            "transport": transport,
            "host": self.host,
            "port": port,
            "path": self.ws_path,
            "login": self.login,
            "passcode": self.passcode,
            "vhost": "/",
        }


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


# ---- polymq -------------------------------------------------------------------------------
@functools.cache
def _run_help() -> str:
    """``polymq run --help`` (asked once per bench run; empty if it could not be asked)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "polymq_cli", "run", "--help"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _run_knows(flag: str) -> bool:
    """Whether ``polymq run`` knows ``flag`` (``--stomp-port``, ``--amqp-port``) yet."""
    return flag in _run_help()


@contextlib.contextmanager
def polymq_target(ctx: Context) -> Iterator[Target]:
    args = ["--stomp-port", "0", "--stomp-ws-port", "0"] if _run_knows("--stomp-port") else []
    with ctx.broker("run", *args) as b:
        ports = b.ports
        if "stomp" not in ports:
            raise Unavailable(
                f"no stomp port in ports file (polymq run wrote {', '.join(sorted(ports))}): "
                "the STOMP frontend is not mounted by `polymq run` yet"
            )
        yield Target(
            "polymq",
            b.host,
            ports["stomp"],
            ports.get("stomp_ws"),
            b.cpu_seconds,
            facts={"process": "polymq run (core + HTTP + STOMP frontends)", "pid": b.pid},
            alive=b.check_alive,
        )


# ---- RabbitMQ ----------------------------------------------------------------------------
_rabbit_setup: str | None = None  # "" when ready, else why not (tried once per bench run)


def _addr(env: str, default: int) -> tuple[str, int]:
    raw = os.environ.get(env, "")
    if raw:
        host, _, port = raw.rpartition(":")
        return host or "127.0.0.1", int(port)
    return "127.0.0.1", default


def _run(argv: list[str], timeout: float) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(argv)}: {exc}"
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
        return f"{' '.join(argv)} exited {r.returncode}: {last[0]}"
    return ""


def _wait_for(addrs: list[tuple[str, int]], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(_listening(*a) for a in addrs):
            return True
        time.sleep(0.3)
    return all(_listening(*a) for a in addrs)


def _ensure_rabbitmq_stomp(stomp: tuple[str, int], ws: tuple[str, int]) -> str:
    """Make RabbitMQ's STOMP and web-stomp listeners available; '' or why they are not."""
    if _listening(*stomp) and _listening(*ws):
        return ""
    if shutil.which("rabbitmq-plugins") is None:
        return (
            f"no RabbitMQ STOMP listener on {stomp[0]}:{stomp[1]} and RabbitMQ is not "
            "installed here (no rabbitmq-plugins; `apt-get install rabbitmq-server`)"
        )
    if not _listening("127.0.0.1", 5672):
        if shutil.which("rabbitmq-server") is None:
            return "rabbitmq-plugins exists but rabbitmq-server does not"
        why = _run(["rabbitmq-server", "-detached"], 60)
        if why or not _wait_for([("127.0.0.1", 5672)], 60):
            return f"RabbitMQ is installed but could not be started ({why or 'no AMQP port'})"
    why = _run(["rabbitmq-plugins", "enable", "rabbitmq_stomp", "rabbitmq_web_stomp"], 120)
    if why:
        return f"could not enable RabbitMQ's STOMP plugins: {why}"
    if not _wait_for([stomp, ws], 30):
        return (
            "rabbitmq-plugins enabled rabbitmq_stomp and rabbitmq_web_stomp but "
            f"{stomp[0]}:{stomp[1]} / {ws[0]}:{ws[1]} are not listening"
        )
    return ""


def _beam(port: int) -> psutil.Process | None:
    """The RabbitMQ node's ``beam.smp``, preferring the one listening on ``port``."""
    beams = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "beam.smp"]
    for p in beams:
        with contextlib.suppress(psutil.Error):
            if any(c.laddr and c.laddr.port == port for c in p.net_connections("tcp")):
                return p
    return beams[0] if len(beams) == 1 else None


def _cpu(p: psutil.Process) -> Callable[[], float]:
    def cpu_seconds() -> float:
        t = p.cpu_times()  # the process: every scheduler, dirty and async thread
        return float(t.user + t.system)

    return cpu_seconds


@contextlib.contextmanager
def _pinned(p: psutil.Process, cpus: list[int] | None) -> Iterator[bool]:
    """Every thread of ``p`` on ``cpus`` for the duration; restored afterwards."""
    if cpus is None:
        yield False
        return
    saved: dict[int, set[int]] = {}
    try:
        for t in p.threads():
            with contextlib.suppress(OSError):
                saved[t.id] = os.sched_getaffinity(t.id)
                os.sched_setaffinity(t.id, cpus)
    except psutil.Error:
        pass
    try:
        yield bool(saved)
    finally:
        for tid, cpuset in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpuset)


@contextlib.contextmanager
def rabbitmq_target(ctx: Context) -> Iterator[Target]:
    global _rabbit_setup
    stomp, ws = (
        _addr("POLYMQ_BENCH_RABBITMQ_STOMP", 61613),
        _addr("POLYMQ_BENCH_RABBITMQ_WS", 15674),
    )
    if _rabbit_setup is None:
        _rabbit_setup = _ensure_rabbitmq_stomp(stomp, ws)
    if _rabbit_setup:
        raise Skipped(_rabbit_setup)
    if not (_listening(*stomp) and _listening(*ws)):
        raise Skipped(f"RabbitMQ's STOMP listeners {stomp} / {ws} stopped answering")
    beam = _beam(stomp[1])
    if beam is None:
        raise Skipped(
            "RabbitMQ's STOMP port answers but no single local beam.smp process was found "
            "to measure its CPU"
        )
    version = ""
    with contextlib.suppress(OSError):
        with socket.create_connection(stomp, timeout=2) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
            s.settimeout(2)
            head = s.recv(4096).decode(errors="replace")
            version = next((ln[7:] for ln in head.splitlines() if ln.startswith("server:")), "")
    with _pinned(beam, ctx.plan.broker) as pinned:
        yield Target(
            "rabbitmq",
            stomp[0],
            stomp[1],
            ws[1],
            _cpu(beam),
            facts={
                "process": "beam.smp",
                "pid": beam.pid,
                "server": version,
                "pinned_to": ctx.plan.broker if pinned else None,
                "threads": beam.num_threads(),
            },
        )
