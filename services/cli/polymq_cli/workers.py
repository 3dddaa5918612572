"""``polymq run --workers N``: the STOMP and AMQP frontends in N - 1 more processes.

The first process serves the core and every frontend as ``polymq run`` does alone; each
worker (:mod:`polymq_cli.worker`, started here) serves the STOMP and AMQP frontends again on
the same ports (SO_REUSEPORT: the kernel spreads new connections over every process
listening) and reaches the core over its TCP port on the loopback, logging in with the
process's one-off token. What is served over HTTP (the HTTP, long-polling and Avro APIs,
STOMP over WebSocket, the admin ports) stays in the first process, whose ``/metrics`` counts
the workers' too (:class:`WorkerRegistry`). docs/workers.md has the design and its limits.

- :func:`worker_count`: what ``--workers`` asks for (``auto``: the CPUs this process may use,
  one process on two CPUs or fewer, where one is faster).
- :class:`Workers`: the worker processes as a service of ``polymq run``: started once the
  first process listens, each restarted (with back-off) when it dies, stopped first.

The pipes between the processes: the first writes a worker its :class:`Spec` (pickled,
length-prefixed) on its stdin and keeps that pipe open (the worker stops when it closes); a
worker writes ``[kind, value]`` reports as JSON, length-prefixed, on the pipe that was its
stdout (its own stdout then goes to stderr, so that no stray print can corrupt them):
``["ready", pid]`` once it listens, then ``["metrics", families]`` every
:data:`METRICS_INTERVAL` seconds. Nothing a worker writes is unpickled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import pickle
import signal
import struct
import sys
from collections.abc import Iterable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

__all__ = [
    "METRICS_INTERVAL",
    "Spec",
    "WorkerRegistry",
    "Workers",
    "families_from_json",
    "families_to_json",
    "merge_families",
    "read_report",
    "read_spec",
    "report",
    "spec_record",
    "worker_count",
]

log = logging.getLogger("polymq")

METRICS_INTERVAL: Final = 2.0  # seconds between a worker's metrics snapshots
_READY_TIMEOUT: Final = 60.0  # seconds a worker may take to listen
_STOP_TIMEOUT: Final = 15.0  # seconds a worker may take to stop (its services: 12 s)
_BACKOFF: Final = (1.0, 30.0)  # seconds before a died worker is started again: first, most
_STEADY: Final = 60.0  # a worker that lived this long starts again after the first back-off
_HEADER: Final = struct.Struct(">I")
_MAX_RECORD: Final = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a worker serves: its number (1..N-1) and each frontend's service class
    (``"module:class"``) with its settings (the first process's, its ports and core
    address filled in), and the log level."""

    index: int
    frontends: tuple[tuple[str, Any], ...]
    log_level: str


def spec_record(spec: Spec) -> bytes:
    """A worker's spec as the first process writes it on the worker's stdin: its length,
    then the pickle (read by the worker alone, from the process that started it)."""
    data = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def _chunk(reader: asyncio.StreamReader) -> bytes | None:
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if size > _MAX_RECORD:
            raise ValueError(f"a record of {size} bytes")
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None


async def read_spec(reader: asyncio.StreamReader) -> Spec | None:
    """The spec the first process wrote (:func:`spec_record`), or None at the pipe's end."""
    data = await _chunk(reader)
    if data is None:
        return None
    spec = pickle.loads(data)  # (from the first process, which started this one)
    if not isinstance(spec, Spec):
        raise ValueError(f"not a worker's spec: {type(spec).__name__}")
    return spec


def report(kind: str, value: Any) -> bytes:
    """One report of a worker to the first process (``ready`` with its pid, ``metrics``
    with :func:`families_to_json`): its length, then JSON. Not a pickle: a worker serves
    clients, and the first process decodes nothing from it that could run code."""
    data = json.dumps([kind, value], separators=(",", ":")).encode()
    return _HEADER.pack(len(data)) + data


async def read_report(reader: asyncio.StreamReader) -> tuple[str, Any] | None:
    """The next report (:func:`report`), or None at the pipe's end; a ValueError if it is
    not one."""
    data = await _chunk(reader)
    if data is None:
        return None
    got = json.loads(data)
    if not (isinstance(got, list) and len(got) == 2 and isinstance(got[0], str)):
        raise ValueError("not a worker's report")
    return got[0], got[1]


def families_to_json(families: Iterable[Metric]) -> list[Any]:
    """Metric families as JSON values: name, help, type, unit and each sample's name,
    labels and value."""
    return [
        [f.name, f.documentation, f.type, f.unit, [[s.name, s.labels, s.value] for s in f.samples]]
        for f in families
    ]


def families_from_json(data: Any) -> list[Metric]:
    """What :func:`families_to_json` made, as metric families again (a ValueError if it is
    something else)."""
    out: list[Metric] = []
    try:
        for name, documentation, typ, unit, samples in data:
            family = Metric(str(name), str(documentation), str(typ), str(unit))
            for sample_name, labels, value in samples:
                family.add_sample(
                    str(sample_name), {str(k): str(v) for k, v in labels.items()}, float(value)
                )
            out.append(family)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not metric families: {exc}") from None
    return out


def allowed_cpus() -> int:
    """The CPUs this process may use: its affinity, bounded by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    return cpus


def worker_count(value: str | int | None) -> int:
    """The processes ``--workers`` (``POLYMQ_WORKERS``) asks for: a number from 1, or
    ``auto`` (the default): the CPUs this process may use, but one process where that is two
    or fewer (on two CPUs one process moved more than two, docs/workers.md)."""
    if value is None or str(value).strip().lower() in ("", "auto"):
        cpus = allowed_cpus()
        return 1 if cpus <= 2 else cpus
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--workers {value!r}: a number of processes, or 'auto'") from None
    if not 1 <= count <= 256:
        raise ValueError(f"--workers {count}: from 1 to 256 processes")
    return count


# ---- the first process's /metrics: every process's samples added up ----------------------
def merge_families(lists: Iterable[Iterable[Metric]]) -> list[Metric]:
    """The metric families of several processes as one process's: samples of the same name
    and labels added up (``_created`` the earliest), the others kept."""
    out: dict[str, Metric] = {}
    where: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], int]] = {}
    for families in lists:
        for family in families:
            merged = out.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                out[family.name] = merged
                where[family.name] = {}
            index = where[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                at = index.get(key)
                if at is None:
                    index[key] = len(merged.samples)
                    merged.samples.append(sample)
                    continue
                old = merged.samples[at]
                if sample.name.endswith("_created"):
                    value = min(old.value, sample.value)
                else:
                    value = old.value + sample.value
                merged.samples[at] = old._replace(value=value)
    return list(out.values())


class WorkerRegistry(CollectorRegistry):
    """The first process's registry, which adds the workers' last snapshots (at most
    :data:`METRICS_INTERVAL` seconds old) to its own samples."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshots: dict[int, list[Metric]] = {}

    def collect(self) -> Iterator[Metric]:
        own = list(super().collect())
        if not self.snapshots:
            yield from own
            return
        yield from merge_families([own, *self.snapshots.values()])


# ---- the worker processes ---------------------------------------------------------------
class Workers:
    """``count - 1`` worker processes serving ``frontends`` (see :class:`Spec`), as a
    service of ``polymq run``: :meth:`start` returns once every one listens (an
    :class:`OSError` if one cannot), a worker that dies later is started again after a
    back-off, :meth:`lame_duck` tells them to stop (SIGTERM: each stops as ``polymq run``
    does) and :meth:`stop` waits for them (SIGKILL past :data:`_STOP_TIMEOUT`)."""

    def __init__(
        self,
        count: int,
        frontends: tuple[tuple[str, Any], ...],
        registry: WorkerRegistry,
        log_level: str,
    ) -> None:
        self.specs = [Spec(i, frontends, log_level) for i in range(1, count)]
        self.registry = registry
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.restarts = 0
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values() if p.returncode is None]

    async def start(self) -> dict[str, int]:
        ready = [asyncio.get_running_loop().create_future() for _ in self.specs]
        self._tasks = [
            asyncio.create_task(self._keep(spec, up), name=f"worker-{spec.index}")
            for spec, up in zip(self.specs, ready, strict=True)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*ready), _READY_TIMEOUT)
        except TimeoutError:
            raise OSError(f"a worker did not listen within {_READY_TIMEOUT:.0f} s") from None
        log.info("%d worker processes serve STOMP and AMQP beside this one", len(self.specs))
        return {}

    async def _keep(self, spec: Spec, ready: asyncio.Future[None]) -> None:
        """Run worker ``spec.index`` until the stop, starting it again when it dies."""
        loop = asyncio.get_running_loop()
        delay = _BACKOFF[0]
        while not self._stopping:
            started = loop.time()
            try:
                code = await self._run(spec, ready)
            except Exception as exc:  # (spawning failed)
                code = None
                log.exception("worker %d could not start", spec.index)
                if not ready.done():
                    ready.set_exception(OSError(f"worker {spec.index} could not start: {exc}"))
            if self._stopping:
                return
            if not ready.done():
                ready.set_exception(
                    OSError(f"worker {spec.index} exited with {code} before it listened")
                )
                return
            self.registry.snapshots.pop(spec.index, None)
            if loop.time() - started >= _STEADY:
                delay = _BACKOFF[0]
            log.error(
                "worker %d exited with %s; its clients reconnect to the other processes; "
                "starting it again in %.0f s",
                spec.index,
                code,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF[1])
            self.restarts += 1

    async def _run(self, spec: Spec, ready: asyncio.Future[None]) -> int | None:
        """Start worker ``spec`` and read what it says until it exits; its exit code."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "polymq_cli.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # (a session of its own: a terminal's Ctrl-C reaches the first process alone,
            # which stops the workers in its order, listeners first)
            start_new_session=True,
        )
        self.processes[spec.index] = process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(spec_record(spec))  # (the pipe stays open: its end stops it)
        await process.stdin.drain()
        try:
            while (got := await read_report(process.stdout)) is not None:
                kind, value = got
                if kind == "ready" and not ready.done():
                    ready.set_result(None)
                elif kind == "metrics":
                    self.registry.snapshots[spec.index] = families_from_json(value)
        except ValueError as exc:  # (a bug: a worker writes nothing else there)
            log.error("worker %d wrote what is not a report (%s); killed", spec.index, exc)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        return await process.wait()

    async def lame_duck(self) -> None:
        self._stopping = True
        for process in self.processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)

    async def stop(self) -> None:
        await self.lame_duck()
        for process in self.processes.values():
            try:
                await asyncio.wait_for(process.wait(), _STOP_TIMEOUT)
            except TimeoutError:
                log.error("worker %d did not stop in time; killed", process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.registry.snapshots.clear()
