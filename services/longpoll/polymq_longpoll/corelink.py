"""The long-polling frontend's connection to the core: :class:`polymq.corelink.CoreLink`
(one shared client, reconnected with backoff; requests fail fast with ``Unavailable`` (503)
while it is away), plus what only this frontend needs:

- its metrics and a warning when a limit of this frontend is above the core's;
- :meth:`CoreLink.poll`, one cursor poll that answers empty at once when the service stops,
  and waits past the core's own cap on ``wait`` by polling again;
- leases nobody will see (the request went away while the core was answering, or the answer
  could not be written) go back to their queue at once instead of when their lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from polymq import Client
from polymq.corelink import CORE_TIMEOUT
from polymq.corelink import CoreLink as _CoreLink

from .config import LongpollSettings
from .metrics import LongpollMetrics

__all__ = ["CORE_TIMEOUT", "CoreLink"]

log = logging.getLogger(__name__)

_CORE_MAX_WAIT = 60.0  # the core's cap on one poll's wait, unless it says otherwise


class CoreLink(_CoreLink):
    def __init__(self, settings: LongpollSettings, metrics: LongpollMetrics) -> None:
        super().__init__(
            settings.core_host,
            settings.core_port,
            service="longpoll",
            user=settings.core_user,
            password=settings.core_password,
            token=settings.core_token,
        )
        self.settings = settings
        self.metrics = metrics

    def attached(self, client: Client) -> None:
        s = self.settings
        for ours, theirs_name in (
            ("longpoll_max_poll", "max_pull"),
            ("longpoll_max_body", "max_body"),
        ):
            theirs = client.limits.get(theirs_name)
            if isinstance(theirs, int | float) and getattr(s, ours) > theirs:
                log.warning(
                    "longpoll: POLYMQ_%s=%s is above the core's %s=%s: the core's limit rules",
                    ours.upper(),
                    getattr(s, ours),
                    theirs_name,
                    theirs,
                )
        super().attached(client)
        self.metrics.core_connected.set(1)
        self.metrics.core_connects.inc()

    def detached(self, client: Client, reason: str) -> None:
        self.metrics.core_connected.set(0)
        super().detached(client, reason)

    async def stop(self) -> None:
        await super().stop()
        self.metrics.core_connected.set(0)

    def core_max_wait(self) -> float:
        client = self.client
        cap = client.limits.get("max_wait") if client is not None else None
        return float(cap) if isinstance(cap, int | float) and cap > 0 else _CORE_MAX_WAIT

    async def poll(
        self,
        sub_id: str,
        cursor: int | None,
        max_: int,
        wait: float,
        max_step: float = _CORE_MAX_WAIT,
    ) -> dict[str, Any]:
        """Messages after ``cursor``, waiting up to ``wait`` seconds for the first; an empty
        answer (the same cursor) at the deadline or as soon as the service stops. One wait
        at the core lasts at most ``max_step`` (and the core's own cap): a longer ``wait``
        polls again."""
        deadline = time.monotonic() + wait
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            step = min(remaining, self.core_max_wait(), max_step)
            result = await self._poll_once(sub_id, cursor, max_, step)
            if result["messages"] or step >= remaining or self.stopping.is_set():
                return result

    async def _poll_once(
        self, sub_id: str, cursor: int | None, max_: int, wait: float
    ) -> dict[str, Any]:
        client = self.get()
        task = asyncio.ensure_future(client.cursor_poll(sub_id, cursor, max=max_, wait=wait))
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait(
                {task, stopping}, timeout=wait + CORE_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            if not task.done():  # we gave up: whatever it leases later goes back at once
                task.add_done_callback(lambda t: self._requeue_result(client, t))
        if task in done:
            result: dict[str, Any] = await self.guard(client, task)
            return result
        if self.stopping.is_set():
            return {"cursor": cursor, "messages": [], "receipts": []}
        raise TimeoutError

    def _requeue_result(self, client: Client, task: asyncio.Future[dict[str, Any]]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        self.requeue([r for r in task.result()["receipts"] if r], client)

    def requeue(self, receipts: list[str], client: Client | None = None) -> None:
        """Give leases back to their queue (nobody will see them), without waiting."""
        client = client if client is not None else self.client
        if not receipts or client is None or client.closed:
            return
        log.info(
            "longpoll: requeueing %d message(s) leased for a request that went away",
            len(receipts),
        )
        self.spawn(client.settle(receipts, "nack"), "requeueing abandoned leases")

    def settle_soon(self, receipts: list[str], action: str) -> None:
        """Settle without waiting (auto-ack after an answer was written)."""
        client = self.client
        if receipts and client is not None and not client.closed:
            self.spawn(client.settle(receipts, action), f"{action} of written leases")
