"""The HTTP frontend's connection to the core: :class:`polymq.corelink.CoreLink` (one shared
client, reconnected with backoff; requests fail fast with ``Unavailable`` (503) while it is
away), plus what only HTTP needs:

- its metrics (``polymq_http_core_connected``, ``polymq_http_core_connects``) and a warning
  when a limit of this frontend is above the core's;
- long polls: a pull whose HTTP request went away (client gone, deadline, shutdown) hands
  back any messages leased for it after it gave up: they are requeued at once instead of
  staying invisible until their visibility timeout.

Publishes hold ``budget`` (half the core's frame limit) while they are in flight, so requests
coalesced into one frame can never make a frame the core would refuse.
"""

from __future__ import annotations

import asyncio
import logging

from polymq import Client, Lease
from polymq.corelink import CORE_TIMEOUT, ByteBudget
from polymq.corelink import CoreLink as _CoreLink

from .config import HttpSettings
from .metrics import HttpMetrics

__all__ = ["CORE_TIMEOUT", "ByteBudget", "CoreLink"]

log = logging.getLogger(__name__)


class CoreLink(_CoreLink):
    def __init__(self, settings: HttpSettings, metrics: HttpMetrics) -> None:
        super().__init__(
            settings.core_host,
            settings.core_port,
            service="http",
            user=settings.core_user,
            password=settings.core_password,
            token=settings.core_token,
        )
        self.settings = settings
        self.metrics = metrics

    def attached(self, client: Client) -> None:
        limits = client.limits
        s = self.settings
        for name in ("max_body", "max_pull", "max_wait"):
            theirs = limits.get(name)
            if isinstance(theirs, int | float) and getattr(s, name) > theirs:
                log.warning(
                    "http: POLYMQ_%s=%s is above the core's %s: the core's limit rules",
                    name.upper(),
                    getattr(s, name),
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

    async def pull(
        self, destination: str, max_: int, wait: float, visibility: float
    ) -> list[Lease]:
        """Pull (long-polling up to ``wait``); an empty list if the service is stopping."""
        client = self.get()
        task = asyncio.ensure_future(
            client.pull(destination, max_, wait=wait, visibility=visibility)
        )
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
            return await self.guard(client, task)
        if self.stopping.is_set():
            return []
        raise TimeoutError

    def _requeue_result(self, client: Client, task: asyncio.Future[list[Lease]]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        self.requeue(task.result(), client)

    def requeue(self, leases: list[Lease], client: Client | None = None) -> None:
        """Give leases back to their queue (nobody will see them), without waiting."""
        client = client if client is not None else self.client
        if not leases or client is None or client.closed:
            return
        receipts = [lease.receipt for lease in leases]
        log.info(
            "http: requeueing %d message(s) leased for a request that went away", len(receipts)
        )
        self.spawn(client.settle(receipts, "requeue"), "requeueing abandoned leases")
