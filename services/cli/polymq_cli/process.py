"""What every service process of ``polymq run`` shares (the first and its workers,
:mod:`polymq_cli.serve_cmd` and :mod:`polymq_cli.worker`): the :class:`Service` shape and
the collector's tuning (:func:`tune_gc`)."""

from __future__ import annotations

import gc
from typing import Protocol

__all__ = ["Service", "tune_gc"]


class Service(Protocol):
    async def start(self) -> dict[str, int]: ...
    async def lame_duck(self) -> None: ...  # stop accepting (a stop's first step, on all)
    async def stop(self) -> None: ...


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
