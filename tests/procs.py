"""Real polymq processes on 127.0.0.1 with ephemeral ports, and raw sockets to their
listeners, for integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

WAIT = 10.0  # seconds to wait for something that should come at once


class LoggedProcess:
    """A subprocess with our environment (``POLYMQ_LOG_LEVEL=INFO``, then ``env``), its
    output in ``log_path``, that tells its ports in a ports file once it listens: the base of
    :class:`PolymqProcess` and of the bridge tests' ``BridgeProcess``."""

    def __init__(self, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self.env = {**os.environ, "POLYMQ_LOG_LEVEL": "INFO", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self, argv: list[str], ports_file: Path, what: str, timeout: float) -> Any:
        """Start ``argv`` and wait until it wrote ``ports_file``; what that file holds.
        RuntimeError (with the log) if ``what`` exits first or is not up by ``timeout``."""
        ports_file.unlink(missing_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        deadline = time.monotonic() + timeout
        while not ports_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited early:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{what} did not start:\n{self.log()}")
            time.sleep(0.02)
        return json.loads(ports_file.read_text())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class PolymqProcess(LoggedProcess):
    """``polymq <command>`` in a subprocess; ``ports`` is read from its ports file."""

    def __init__(self, command: str, workdir: Path, *args: str, env: dict[str, str] | None = None):
        # one process unless a test asks for workers (--workers N), whatever the machine's CPUs
        super().__init__(workdir / f"{command}.log", {"POLYMQ_WORKERS": "1", **(env or {})})
        self.command = command
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.args = list(args)
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 20.0) -> PolymqProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports_file = self.workdir / f"{self.command}-ports.json"
        argv = [sys.executable, "-m", "polymq_cli", self.command, "--ports-file", str(ports_file)]
        for flag in ("core", "admin", "http"):
            if self.command in ("run", "core") or flag == "http":
                if flag == "http" and self.command in ("core", "stomp", "longpoll", "avro", "amqp"):
                    continue
                if f"--{flag}-port" not in self.args:
                    argv += [f"--{flag}-port", "0"]
        if self.command in ("run", "stomp"):
            for flag in ("stomp", "stomp-ws"):
                if f"--{flag}-port" not in self.args:
                    argv += [f"--{flag}-port", "0"]
        if self.command in ("run", "longpoll") and "--longpoll-port" not in self.args:
            argv += ["--longpoll-port", "0"]
        if self.command in ("run", "avro") and "--avro-port" not in self.args:
            argv += ["--avro-port", "0"]
        if self.command in ("run", "amqp"):
            for flag in ("amqp", "amqp-admin", "amqp-tls"):
                if f"--{flag}-port" not in self.args:
                    argv += [f"--{flag}-port", "0"]
        if self.command in ("run", "core") and "--data-dir" not in self.args:
            argv += ["--data-dir", str(self.data_dir)]
        argv += self.args
        told = self.spawn(argv, ports_file, f"polymq {self.command}", timeout)
        self.pids: list[int] = told.pop("pids", [])  # the node's processes (polymq, nats-server)
        self.ports = told
        return self

    def url(self, name: str = "http") -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def __enter__(self) -> PolymqProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


def threads_stopped(pid: int) -> bool:
    """Is every thread of process ``pid`` stopped (or the process gone)? A ``SIGSTOP`` does
    not stop a process when ``kill`` returns: one of its threads takes the signal when it
    next runs, and only then stops the others. On a busy machine the rest run on meanwhile
    (measured beside the cluster tests: in 3 of 60 rounds a thread of a nats-server just
    signalled was still running; a write made at once may then be committed by the very
    follower that was to be frozen). /proc's ``stat`` of the process names its first thread
    alone; each thread's is under ``task/``."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # (a thread that ended)
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def freeze(*pids: int, within: float = WAIT) -> None:
    """``SIGSTOP`` every process of ``pids`` (all first, so that they stop together), then
    wait until every thread of each is stopped (:func:`threads_stopped`); AssertionError if
    that takes longer than ``within``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within
    for pid in pids:
        while not threads_stopped(pid):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"pid {pid}: not every thread stopped {within:g} s after SIGSTOP"
                )
            time.sleep(0.001)


def node_processes(proc: PolymqProcess) -> list[psutil.Process]:
    """A ``polymq run``'s first process and its workers (``--workers``)."""
    assert proc.proc is not None
    first = psutil.Process(proc.proc.pid)
    workers = [c for c in first.children() if "polymq_cli.worker" in c.cmdline()]
    return [first, *workers]


def connections_held(port: int, pids: list[int]) -> Counter[int]:
    """How many established connections to ``port`` each of ``pids`` holds (the kernel's
    view: which process accepted each)."""
    held: Counter[int] = Counter()
    for pid in pids:
        for c in psutil.Process(pid).net_connections("tcp"):
            if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port:
                held[pid] += 1
    return held


def spread_over(
    connect: Callable[[], T], port: int, pids: list[int], at_least: int, most: int = 64
) -> list[T]:
    """``connect()`` at least ``at_least`` times, and on until every one of ``pids`` holds a
    connection to ``port``; AssertionError if ``most`` are open and some process holds none.
    The kernel hashes each connection's addresses to pick a SO_REUSEPORT listener, so a
    fixed count lands all on one of two processes once in 2^(n-1): 8 did in a CI run."""
    conns = [connect() for _ in range(at_least)]
    while len(held := connections_held(port, pids)) < len(pids) and len(conns) < most:
        conns.append(connect())
    assert len(held) == len(pids), f"{len(conns)} connections, not in every process: {held}"
    return conns


@contextlib.contextmanager
def serving(
    command: str, workdir: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[PolymqProcess]:
    """A process shared by several tests: it must still be alive at the end, and stop with 0."""
    proc = PolymqProcess(command, workdir, *args, env=env).start()
    try:
        yield proc
        assert proc.alive, proc.log()
        assert proc.stop() == 0, proc.log()
    finally:
        proc.kill()


class RawSocket:
    """A plain TCP connection to a listener, for what no client library would send: bytes
    out, and what comes back gathered in ``buf`` for the protocol's own reader to parse."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, deadline: float) -> None:
        """More bytes into ``buf`` (by ``deadline``, a ``time.monotonic()``); AssertionError
        if the server closes the connection first."""
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = self.sock.recv(65536)
        assert chunk, f"the server closed the connection; unread: {self.buf!r}"
        self.buf += chunk

    def closed_by_server(self, timeout: float = WAIT) -> bool:
        """True once the server closed (EOF or reset), reading and dropping what comes."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()
