"""The HTTP frontend's connection to the core: :class:`polymq_server.link.corelink.CoreLink` (one
shared
client, reconnected with backoff; requests fail fast with ``Unavailable`` (503) while it is
away), as every frontend has it (:class:`polymq_server.web.app.FrontendLink`: its metrics,
``polymq_http_core_connected`` and ``polymq_http_core_connects``, and a warning when a limit
of this frontend is above the core's), plus what only HTTP needs:

- long polls: a pull whose HTTP request went away (client gone, deadline, shutdown) hands
  back any messages leased for it after it gave up: they are requeued at once instead of
  staying invisible until their visibility timeout.

Publishes hold ``budget`` (half the core's frame limit) while they are in flight, so requests
coalesced into one frame can never make a frame the core would refuse.
"""

from __future__ import annotations

import logging

from polymq import Client, Lease, Outcome
from polymq_server.link.corelink import CORE_TIMEOUT, ByteBudget
from polymq_server.web.app import FrontendLink

from .config import HttpSettings
from .metrics import HttpMetrics

__all__ = ["CORE_TIMEOUT", "ByteBudget", "HttpLink"]

log = logging.getLogger(__name__)


class HttpLink(FrontendLink[HttpSettings]):
    limits = (("max_body", "max_body"), ("max_pull", "max_pull"), ("max_wait", "max_wait"))

    def __init__(self, settings: HttpSettings, metrics: HttpMetrics) -> None:
        super().__init__(settings, metrics, service="http")

    async def pull(
        self, destination: str, max_: int, wait: float, visibility: float
    ) -> list[Lease]:
        """Pull (long-polling up to ``wait``); an empty list if the service is stopping."""
        client = self.get()
        return await self.waiting(
            client,
            client.pull(destination, max_, wait=wait, visibility=visibility),
            wait,
            lambda leases: self.requeue(leases, client),
            [],
        )

    def requeue(self, leases: list[Lease], client: Client | None = None) -> None:
        """Give leases back to their queue (nobody will see them), without waiting."""
        client = client if client is not None else self.client
        if not leases or client is None or client.closed:
            return
        receipts = [lease.receipt for lease in leases]
        log.info(
            "http: requeueing %d message(s) leased for a request that went away", len(receipts)
        )
        self.spawn(client.settle(receipts, Outcome.REQUEUE), "requeueing abandoned leases")
