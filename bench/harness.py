"""What every scenario needs: the broker under test, load-generator processes, machine facts.

The broker is a real ``polymq core`` / ``polymq run`` subprocess started through
:class:`tests.procs.PolymqProcess` (ephemeral ports, its own temporary data directory).
Load generators are ``multiprocessing`` children (spawned, so each has its own interpreter
and GIL) that run one ``async def worker(params, channel)`` under uvloop and talk to the
parent over a pipe: they report ``ready`` when set up, may wait for ``go``, and send their
result last. Timestamps are ``time.monotonic()``, which is one clock system-wide on Linux, so
a producer's first publish and a consumer's last receive can be compared across processes.

On a machine with two or more CPUs the broker (every thread of it) is pinned to the first
CPU and the load generators to the rest, so neither steals the other's core.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import multiprocessing.connection
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import psutil

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # ``tests`` is importable from the repository root only
    sys.path.insert(0, str(_ROOT))

from tests.procs import PolymqProcess  # noqa: E402

__all__ = [
    "BenchError",
    "Broker",
    "Channel",
    "CpuPlan",
    "RssSampler",
    "Worker",
    "broker",
    "machine_info",
    "workers",
]

_MP = multiprocessing.get_context("spawn")


class BenchError(Exception):
    """A scenario could not run (a process died, timed out or reported an error)."""


# ---- CPUs -------------------------------------------------------------------------------
class CpuPlan:
    """Which CPUs the broker and the load generators run on (``None``: anywhere)."""

    def __init__(self, pin: bool = True) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self.all = cpus
        if pin and len(cpus) >= 2:
            self.broker: list[int] | None = cpus[:1]
            self.load: list[int] | None = cpus[1:]
        else:
            self.broker = self.load = None

    def describe(self) -> dict[str, Any]:
        return {"broker_cpus": self.broker, "load_cpus": self.load}


def cpu_seconds_of(procs: list[psutil.Process]) -> float:
    """User and system CPU-seconds of ``procs`` together (one gone meanwhile counts 0)."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _pin_process(pid: int, cpus: list[int]) -> None:
    """Pin every thread of ``pid`` (sched_setaffinity on a pid only moves one thread)."""
    for t in psutil.Process(pid).threads():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(t.id, cpus)


# ---- the broker under test ----------------------------------------------------------------
class Broker:
    """A running ``polymq`` process; ``host``/``ports`` to reach it, ``rss()`` to weigh it."""

    def __init__(
        self,
        proc: PolymqProcess,
        workdir: Path,
        cpus: list[int] | None,
        profiled: bool = False,
    ) -> None:
        self.proc = proc
        self.profiled = profiled
        self.workdir = workdir
        self.cpus = cpus
        self.host = "127.0.0.1"
        assert proc.proc is not None
        self.pid = proc.proc.pid
        self._ps = psutil.Process(self.pid)

    @property
    def ports(self) -> dict[str, int]:
        return self.proc.ports

    @property
    def core_port(self) -> int:
        return self.proc.ports["core"]

    def url(self, name: str = "http") -> str:
        return self.proc.url(name)

    def rss(self) -> int:
        """Resident set size of the broker process, in bytes."""
        return int(self._ps.memory_info().rss)

    def peak_rss(self) -> int:
        """The most the broker process has had resident at once since it started, in bytes:
        the kernel's high-water mark (``VmHWM`` in ``/proc/PID/status``; Linux), kept at
        every page fault, so no peak between two samples escapes it (0 elsewhere)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        t = self._ps.cpu_times()
        return float(t.user + t.system)

    def check_alive(self) -> None:
        if not self.proc.alive:
            raise BenchError(f"the broker exited unexpectedly; its log ends:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.proc.log().splitlines()[-n:])

    @contextlib.contextmanager
    def profile_window(self) -> Iterator[None]:
        """Under ``--profile``, keep only what the broker does inside the block in its
        profile (the set-up before and the tear-down after are left out)."""
        if self.profiled:
            os.kill(self.pid, signal.SIGUSR1)
        try:
            yield
        finally:
            if self.profiled and self.proc.alive:
                os.kill(self.pid, signal.SIGUSR2)

    def pin(self) -> None:
        """Re-pin (threads started after the broker came up are not pinned otherwise)."""
        if self.cpus is not None:
            _pin_process(self.pid, self.cpus)


@contextlib.contextmanager
def broker(
    command: str = "core",
    *args: str,
    plan: CpuPlan,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    profile: Path | None = None,
) -> Iterator[Broker]:
    """Start a fresh ``polymq <command>`` on a temporary data dir; stop it and remove the
    directory afterwards, whatever happens. With ``profile``, the broker runs under cProfile
    and writes pstats there when it stops."""
    workdir = Path(tempfile.mkdtemp(prefix=f"polymq-bench-{command}-"))
    # one process (the broker CPU's) unless the scenario asks for workers (--workers N)
    env = {"POLYMQ_LOG_LEVEL": "WARNING", "POLYMQ_WORKERS": "1", **(env or {})}
    if profile is not None:
        hook = str(Path(__file__).resolve().parent / "_profile")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [hook, os.environ.get("PYTHONPATH")]))
        env["POLYMQ_BENCH_PROFILE"] = str(profile)
    proc = PolymqProcess(command, workdir, *args, env=env)
    try:
        try:
            proc.start(timeout=timeout)
        except RuntimeError as exc:
            lines = proc.log().strip().splitlines() or ["(no output)"]
            raise BenchError(
                f"polymq {command} did not start: {lines[-1]}\n" + "\n".join(lines[-25:])
            ) from exc
        b = Broker(proc, workdir, plan.broker, profiled=profile is not None)
        b.pin()
        try:
            yield b
        except Exception as exc:
            if not proc.alive:  # the broker dying is the news, not the client's lost connection
                raise BenchError(
                    f"the broker died (exit code {proc.proc.returncode if proc.proc else '?'}) "
                    f"during the scenario ({exc}); its log ends:\n{b.log_tail()}"
                ) from exc
            raise
        b.check_alive()
    finally:
        try:
            if proc.alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.stop(timeout=10)
        finally:
            proc.kill()
            shutil.rmtree(workdir, ignore_errors=True)


class RssSampler:
    """Samples a process's resident set size every ``every`` seconds on a thread, from
    ``start()`` to ``stop()``: ``peak`` and the ``(time.monotonic(), bytes)`` ``samples``.
    ``follow(pid)`` moves it to another process (the broker restarted)."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.every = every
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self._ps = psutil.Process(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def follow(self, pid: int) -> None:
        self._ps = psutil.Process(pid)

    def sample(self) -> int:
        try:
            rss = int(self._ps.memory_info().rss)
        except psutil.Error:
            return 0  # between a stop and the next start
        self.samples.append((time.monotonic(), rss))
        self.peak = max(self.peak, rss)
        return rss

    def peak_between(self, t0: float, t1: float) -> int:
        return max((r for t, r in self.samples if t0 <= t <= t1), default=0)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def start(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ---- load-generator processes -----------------------------------------------------------
class Channel:
    """The child's end of the pipe to the parent."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self._conn = conn

    def send(self, **msg: Any) -> None:
        self._conn.send(msg)

    async def recv(self) -> dict[str, Any]:
        """The parent's next message (without blocking the event loop)."""
        loop = asyncio.get_running_loop()
        msg: dict[str, Any] = await loop.run_in_executor(None, self._conn.recv)
        return msg


def _entry(
    target: str,
    params: dict[str, Any],
    conn: multiprocessing.connection.Connection,
    cpus: list[int] | None,
    profile: str | None = None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    if cpus is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    module, _, name = target.partition(":")
    fn: Callable[[dict[str, Any], Channel], Coroutine[Any, Any, dict[str, Any] | None]]
    fn = getattr(importlib.import_module(module), name)
    try:
        if profile is None:
            result = asyncio.run(fn(params, Channel(conn))) or {}
        else:
            import cProfile

            prof = cProfile.Profile()
            try:
                coro = fn(params, Channel(conn))
                result = prof.runcall(asyncio.run, coro) or {}  # type: ignore[arg-type]
            finally:
                prof.dump_stats(profile)
        t = os.times()
        result.setdefault("process_cpu_seconds", t.user + t.system)
        conn.send({"result": result})
    except BaseException as exc:  # report everything; the parent records it
        conn.send({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    finally:
        conn.close()


class Worker:
    """One load-generator process running ``target`` (``"module:function"``)."""

    def __init__(
        self,
        target: str,
        params: dict[str, Any],
        cpus: list[int] | None,
        name: str = "",
        profile: Path | None = None,
    ) -> None:
        self.name = name or target.rpartition(":")[2]
        parent, child = _MP.Pipe()
        self._conn = parent
        args = (target, params, child, cpus, str(profile) if profile else None)
        self._proc = _MP.Process(target=_entry, args=args, name=self.name, daemon=True)
        self._proc.start()
        child.close()
        self.result: dict[str, Any] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def recv(self, timeout: float) -> dict[str, Any]:
        """The next message from the worker; raises BenchError on error, death or timeout."""
        if not self._conn.poll(timeout):
            raise BenchError(f"worker {self.name}: no answer within {timeout:.0f}s")
        try:
            msg: dict[str, Any] = self._conn.recv()
        except EOFError:
            raise BenchError(f"worker {self.name} died (exit code {self._proc.exitcode})") from None
        if "error" in msg:
            raise BenchError(f"worker {self.name}: {msg['error']}\n{msg.get('traceback', '')}")
        return msg

    def expect(self, key: str, timeout: float) -> dict[str, Any]:
        msg = self.recv(timeout)
        if key not in msg:
            raise BenchError(f"worker {self.name}: expected {key!r}, got {sorted(msg)}")
        return msg

    def wait_result(self, timeout: float) -> dict[str, Any]:
        self.result = self.expect("result", timeout)["result"]
        return self.result

    def send(self, **msg: Any) -> None:
        self._conn.send(msg)

    def close(self) -> None:
        """Stop the process if it is still running (SIGTERM, then SIGKILL)."""
        p = self._proc
        p.join(timeout=2 if self.result is not None else 0.1)
        if p.is_alive():
            p.terminate()
            p.join(timeout=3)
        if p.is_alive():
            p.kill()
            p.join(timeout=3)
        self._conn.close()


@contextlib.contextmanager
def workers() -> Iterator[list[Worker]]:
    """A list to append workers to; every one is stopped on exit."""
    started: list[Worker] = []
    try:
        yield started
    finally:
        for w in started:
            w.close()


# ---- machine facts ----------------------------------------------------------------------
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=_ROOT,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def filesystem_of(path: str) -> str:
    """The filesystem type holding ``path`` (fsync on tmpfs is free: say so)."""
    best = ("", "unknown")
    real = os.path.realpath(path)
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best[0]):
            best = (mp, part.fstype)
    return best[1]


def fsync_seconds(directory: Path, rounds: int = 20) -> float:
    """Median time of a 4 KiB write + fsync in ``directory`` (what a group commit waits on)."""
    path = directory / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return sorted(times)[len(times) // 2]


def machine_info(plan: CpuPlan) -> dict[str, Any]:
    try:
        import uvloop

        loop = f"uvloop {uvloop.__version__}"  # type: ignore[attr-defined]
    except ImportError:
        loop = "asyncio"
    import msgpack

    return {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpus_usable": len(plan.all),
        "cpu_model": _cpu_model(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "event_loop": loop,
        "msgpack": ".".join(map(str, msgpack.version)),
        "tmp_filesystem": filesystem_of(tempfile.gettempdir()),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        **plan.describe(),
    }


def now() -> float:
    return time.monotonic()
