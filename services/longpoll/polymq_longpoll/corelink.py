"""The long-polling frontend's connection to the core: :class:`polymq_server.link.corelink.CoreLink`
(one shared client, reconnected with backoff; requests fail fast with ``Unavailable`` (503)
while it is away), as every frontend has it (:class:`polymq_server.web.app.FrontendLink`: its
metrics
and a warning when a limit of this frontend is above the core's), plus what only this
frontend needs:

- :meth:`LongpollLink.poll`, one cursor poll that answers empty at once when the service stops,
  and waits past the core's own cap on ``wait`` by polling again;
- leases nobody will see (the request went away while the core was answering, or the answer
  could not be written) go back to their queue at once instead of when their lease expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable

from polymq import Client, CursorPage, Outcome
from polymq_server.link.corelink import CORE_TIMEOUT
from polymq_server.web.app import FrontendLink

from .config import LongpollSettings
from .metrics import LongpollMetrics

__all__ = ["CORE_TIMEOUT", "LongpollLink"]

log = logging.getLogger(__name__)

_CORE_MAX_WAIT = 60.0  # the core's cap on one poll's wait, unless it says otherwise


class LongpollLink(FrontendLink[LongpollSettings]):
    limits = (("longpoll_max_poll", "max_pull"), ("longpoll_max_body", "max_body"))

    def __init__(self, settings: LongpollSettings, metrics: LongpollMetrics) -> None:
        super().__init__(settings, metrics, service="longpoll")

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
    ) -> CursorPage:
        """Messages after ``cursor``, waiting up to ``wait`` seconds for the first; an empty
        answer (the same cursor) at the deadline or as soon as the service stops. One wait
        at the core lasts at most ``max_step`` (and the core's own cap): a longer ``wait``
        polls again."""
        deadline = time.monotonic() + wait
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            step = min(remaining, self.core_max_wait(), max_step)
            result = await self._poll_once(sub_id, cursor, max_, step)
            if result.messages or step >= remaining or self.stopping.is_set():
                return result

    def _poll_once(
        self, sub_id: str, cursor: int | None, max_: int, wait: float
    ) -> Awaitable[CursorPage]:
        # (no coroutine of its own: one frame fewer held by each of 10,000 waiting polls)
        client = self.get()
        return self.waiting(
            client,
            client.cursor_poll(sub_id, cursor, max=max_, wait=wait),
            wait,
            lambda page: self.requeue(page.leased, client),
            CursorPage(cursor, [], []),
        )

    def requeue(self, receipts: list[str], client: Client | None = None) -> None:
        """Give leases back to their queue (nobody will see them), without waiting."""
        client = client if client is not None else self.client
        if not receipts or client is None or client.closed:
            return
        log.info(
            "longpoll: requeueing %d message(s) leased for a request that went away",
            len(receipts),
        )
        self.spawn(client.settle(receipts, Outcome.REQUEUE), "requeueing abandoned leases")

    def settle_soon(self, receipts: list[str], outcome: Outcome) -> None:
        """Settle without waiting (auto-ack after an answer was written)."""
        client = self.client
        if receipts and client is not None and not client.closed:
            self.spawn(client.settle(receipts, outcome), f"{outcome.value} of written leases")
