"""The prefetch window of an SSE stream over a queue: how many leases it delivered that
nobody has settled yet. Flow control only, never correctness: the core holds the leases.

A lease leaves its window when it is acked or nacked through this process, or when its
lease time has passed (the client may have settled it through another process, and if not
the core hands it out again anyway). A stream whose window is full waits instead of leasing
more, so one browser does not drain a queue that others consume too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

__all__ = ["Window", "Windows"]


class Window:
    def __init__(self, owner: Windows, limit: int, lease_time: float) -> None:
        self.owner = owner
        self.limit = limit
        self.lease_time = lease_time
        self.deadlines: dict[str, float] = {}  # receipt -> when its lease is over
        self.changed = asyncio.Event()

    def add(self, receipts: Iterable[str]) -> None:
        until = time.monotonic() + self.lease_time
        for r in receipts:
            self.deadlines[r] = until
            self.owner.owner[r] = self

    def discard(self, receipt: str) -> None:
        if self.deadlines.pop(receipt, None) is not None:
            self.changed.set()

    def _expire(self) -> float | None:
        """Drop leases whose time is over; the soonest deadline left, if any."""
        now = time.monotonic()
        over = [r for r, t in self.deadlines.items() if t <= now]
        for r in over:
            del self.deadlines[r]
            self.owner.owner.pop(r, None)
        return min(self.deadlines.values(), default=None)

    async def room(self, timeout: float) -> int:
        """How many more leases fit, waiting up to ``timeout`` for one to (0 if none did, or
        the service is stopping)."""
        deadline = time.monotonic() + timeout
        while not self.owner.stopping:
            soonest = self._expire()
            free = self.limit - len(self.deadlines)
            now = time.monotonic()
            if free > 0 or now >= deadline:
                return max(free, 0)
            self.changed.clear()
            until = deadline if soonest is None else min(deadline, soonest)
            try:
                await asyncio.wait_for(self.changed.wait(), max(until - now, 0.0))
            except TimeoutError:
                pass
        return 0

    def close(self) -> None:
        for r in self.deadlines:
            self.owner.owner.pop(r, None)
        self.deadlines.clear()
        self.owner.windows.discard(self)


class Windows:
    """Every open window of this process, by receipt (for acks arriving on any request)."""

    def __init__(self) -> None:
        self.owner: dict[str, Window] = {}
        self.windows: set[Window] = set()
        self.stopping = False

    def open(self, limit: int, lease_time: float) -> Window:
        window = Window(self, limit, lease_time)
        self.windows.add(window)
        return window

    def stop(self) -> None:
        """The service is stopping: streams waiting for room stop waiting."""
        self.stopping = True
        for window in self.windows:
            window.changed.set()

    def settled(self, receipts: Iterable[str]) -> None:
        for r in receipts:
            window = self.owner.pop(r, None)
            if window is not None:
                window.discard(r)
