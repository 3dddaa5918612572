"""What every service process of ``polymq run`` shares (the first and its workers,
:mod:`polymq_cli.serve_cmd` and :mod:`polymq_cli.worker`): the :class:`Service` shape, the
stop of a process's services (:func:`stop_services`) and the collector's tuning
(:func:`tune_gc`)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence
from typing import Final, Protocol

__all__ = ["STOP_TIMEOUT", "Service", "stop_services", "tune_gc"]

log = logging.getLogger("polymq")

STOP_TIMEOUT: Final = 12.0  # seconds a frontend may take to stop


class Service(Protocol):
    async def start(self) -> dict[str, int]: ...
    async def lame_duck(self) -> None: ...  # stop accepting (a stop's first step, on all)
    async def stop(self) -> None: ...


async def stop_services(
    services: Sequence[Service], limit: Callable[[Service], float] = lambda _: STOP_TIMEOUT
) -> None:
    """Lame duck first, every listener at once: no new connection anywhere while the
    services stop one by one, the last started first (each then tells its clients to go
    elsewhere), each within ``limit(service)`` seconds (past it, logged with where every
    task waits, and gone on without it)."""
    for svc in services:
        try:
            await asyncio.wait_for(svc.lame_duck(), STOP_TIMEOUT)
        except Exception:
            log.exception("error while %s stopped accepting", type(svc).__name__)
    for svc in reversed(services):
        seconds = limit(svc)
        try:
            await asyncio.wait_for(svc.stop(), seconds)
        except TimeoutError:
            log.error(
                "%s did not stop within %.0f s; going on without it. Tasks:\n%s",
                type(svc).__name__,
                seconds,
                _task_dump(),
            )
        except Exception:
            log.exception("error while stopping %s", type(svc).__name__)


def _task_dump() -> str:
    """Where each task of the loop waits (a line of its innermost frame each)."""
    lines = []
    for task in asyncio.all_tasks():
        frames = task.get_stack(limit=None)
        where = (
            f"{frames[-1].f_code.co_filename}:{frames[-1].f_lineno} {frames[-1].f_code.co_name}"
            if frames
            else "(not started)"
        )
        lines.append(f"  {task.get_name()}: {task.get_coro()!r} at {where}")
    return "\n".join(sorted(lines)[:200])


def tune_gc() -> None:
    """Keep the cyclic garbage collector off the message path. A broker holds many long-lived
    objects (queued messages, subscriptions): with the default thresholds every full
    collection walks all of them, which was ~half the CPU per record of Avro ingest into a
    growing stream (bench `avro`: 4.4 of 9.2 us/record). Objects made at start-up are moved
    out of the collector's view, and collections run less often; reference counting still
    frees everything without cycles at once."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)
