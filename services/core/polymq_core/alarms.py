"""The core's resource alarms (:mod:`polymq_server.alarms`): a memory high watermark and a disk
free limit, measured every 0.2 s, and memory also after every MiB read from the connections
(a fast producer adds a hundred MB a second and more: 0.2 s of it passes any mark).

- **memory**: this process's resident memory against ``memory_high_watermark`` — a fraction
  (at most 1) of the memory it may use (the cgroup v2 ``memory.max`` when one is set, else
  the machine's), or a number of bytes (above 1). RabbitMQ's default fraction, 0.4. The
  mark is what the memory is to stay under, so the alarm rises before it: at
  ``1 - memory_headroom`` of it (0.9), leaving room for what was read, decoded and queued
  when it rose; and it clears under ``memory_low_watermark`` of it (0.85), so that a held
  producer, let go, does not run straight back into it (each clearing lets a burst in).
  Past the low watermark the memory is under :attr:`ResourceMonitor.pressure`: paging
  queues squeeze their window (polymq_core.destinations.paging).
- **disk**: the free bytes of the file system of the data directory against
  ``disk_free_limit`` (RabbitMQ's default, 50 MB).

A change is logged (a warning when an alarm goes on), shown by the gauge
``polymq_resource_alarm{resource}`` and announced on ``system.alarms`` (also every
:data:`polymq_server.alarms.EVERY` seconds, for frontends that connect later). While an alarm is
on, the core stops reading the wire connections of native publishers (frontends hold their
own; polymq's own links are never held, so consumers drain); they read again once it clears.
The limits may be changed by a reload (``polymq cluster reload --limit``), and an alarm
clears by itself once the resource is back under its limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Gauge

from polymq.types import Message
from polymq_server import alarms
from polymq_server.names import core_headers
from polymq_server.resources import give_back_memory

from .destinations.paging import Pressure

if TYPE_CHECKING:
    from .config import CoreSettings

__all__ = ["ResourceMonitor", "memory_limit", "resident_bytes"]

log = logging.getLogger(__name__)

_CGROUP_MAX = Path("/sys/fs/cgroup/memory.max")


def memory_limit() -> int:
    """The memory this process may use: its cgroup's ``memory.max`` if set, else the RAM."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        raw = _CGROUP_MAX.read_text().strip()
    except OSError:
        return total
    return min(int(raw), total) if raw.isdigit() else total


def resident_bytes() -> int:
    """This process's resident set size (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


_EVERY = 0.2  # seconds between two measures
_READ_EVERY = 1 << 20  # bytes read from connections between two measures of the memory


class MonitorHost(Protocol):
    """What the monitor needs of the broker: its settings (a reload replaces them), the
    hook that holds or lets go the native publishers, and a topic publish for
    ``system.alarms``."""

    settings: CoreSettings

    def alarms_changed(self) -> None: ...
    def publish_topic(self, name: str, msgs: list[Message]) -> object: ...


class ResourceMonitor:
    def __init__(self, host: MonitorHost, registry: CollectorRegistry) -> None:
        self.host = host
        self.alarms: frozenset[str] = frozenset()
        self.detail: dict[str, Any] = {}
        self._ram = memory_limit()
        self._unmeasured = 0  # bytes read from connections since memory was last measured
        # past the low watermark: paging queues keep a smaller window
        # (polymq_core.destinations.paging)
        self.pressure = Pressure()
        self._task: asyncio.Task[None] | None = None
        self._gauge = Gauge(
            "polymq_resource_alarm",
            "1 while the resource's alarm is on (publishers are held), else 0",
            ["resource"],
            registry=registry,
        )
        for resource in alarms.RESOURCES:
            self._gauge.labels(resource).set(0)

    def start(self) -> None:
        self.check()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="alarms")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def limits(self) -> tuple[int, int]:
        """(memory high watermark in bytes, disk free limit in bytes), from the settings."""
        s = self.host.settings
        mark = s.memory_high_watermark
        return (int(mark * self._ram) if mark <= 1 else int(mark)), int(s.disk_free_limit)

    def memory_marks(self) -> tuple[int, int, int]:
        """(the high watermark, the use the memory alarm rises at, the use under which it
        clears), in bytes."""
        s = self.host.settings
        mark = self.limits()[0]
        return mark, int(mark * (1 - s.memory_headroom)), int(mark * s.memory_low_watermark)

    def read(self, nbytes: int) -> None:
        """A connection read ``nbytes``: past :data:`_READ_EVERY` since the last measure,
        memory is measured now (a read of /proc, no trim), and the alarm rises at once if it
        is due, before what was read is decoded and queued."""
        self._unmeasured += nbytes
        if self._unmeasured < _READ_EVERY:
            return
        self._unmeasured = 0
        used = resident_bytes()
        _mark, rises, clears = self.memory_marks()
        self.pressure.on = used >= clears
        if "memory" not in self.alarms and used >= rises and self.check():
            self.announce()

    def check(self) -> bool:
        """Measure; set or clear the alarms. Whether they changed."""
        mark, rises, clears = self.memory_marks()
        disk_limit = self.limits()[1]
        self._unmeasured = 0
        held = "memory" in self.alarms
        used = resident_bytes()
        if held and used >= clears:
            give_back_memory()  # (what consumers freed meanwhile, before judging again)
            used = resident_bytes()
        try:
            free = shutil.disk_usage(self.host.settings.data_dir).free
        except OSError:
            free = -1  # unknown: no disk alarm on a guess
        now = set()
        if used and used >= (clears if held else rises):
            now.add("memory")
        self.pressure.on = bool(used) and used >= clears
        if free >= 0 and free < disk_limit:
            now.add("disk")
        self.detail = {
            "memory": {
                "used": used,
                "limit": mark,
                "rises_at": rises,
                "clears_at": clears,
                "pressure": self.pressure.on,
            },
            "disk": {"free": free, "limit": disk_limit},
        }
        changed = frozenset(now) != self.alarms
        if changed:
            for resource in alarms.RESOURCES:
                on, was = resource in now, resource in self.alarms
                if on and not was:
                    log.warning(
                        "%s alarm on (%s): publishers are held until it clears",
                        resource,
                        self.numbers(resource, on),
                    )
                elif was and not on:
                    log.info("%s alarm cleared (%s)", resource, self.numbers(resource, on))
                self._gauge.labels(resource).set(1 if on else 0)
            self.alarms = frozenset(now)
            self.host.alarms_changed()
        return changed

    def numbers(self, resource: str, on: bool) -> str:
        """What was measured of ``resource`` against its limit (for the mark it just rose
        at if ``on``, else the one it clears under), as the log and the console say it."""
        d = self.detail[resource]
        if resource == "memory":
            mark = d["limit"]
            at, verb = (d["rises_at"], "rises at") if on else (d["clears_at"], "clears under")
            return (
                f"{d['used'] / 2**20:.0f} MiB used; it {verb} {at / 2**20:.0f} MiB, "
                f"{at / mark:.0%} of the high watermark {mark / 2**20:.0f} MiB"
            )
        return f"{d['free'] / 2**20:.0f} MiB free, limit {d['limit'] / 2**20:.0f} MiB"

    def announce(self) -> None:
        body = alarms.encode(self.alarms, self.detail)
        message = Message(body=body, content_type="application/json", headers=core_headers())
        self.host.publish_topic(alarms.TOPIC, [message])

    async def _run(self) -> None:
        last = 0.0
        while True:
            changed = self.check()
            now = time.monotonic()
            if changed or now - last >= alarms.EVERY:
                self.announce()
                last = now
            await asyncio.sleep(_EVERY)
