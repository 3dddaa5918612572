"""The Avro frontend's connection to the core: :class:`polymq_server.link.corelink.CoreLink` (one
shared
client, reconnected with backoff; requests fail fast with ``Unavailable`` (503) while it is
away, and publishes hold its ``budget``), as every frontend has it
(:class:`polymq_server.web.app.FrontendLink`: its metrics and a warning when a limit of this
frontend is
above the core's), plus what only this frontend needs:

- waiting reads (a queue pull, a stream read through a cursor opened for one request) that
  answer empty as soon as the service stops; messages leased for a request that went away
  go back to their queue at once instead of when their lease expires;
- :meth:`AvroLink.fetch`, the schema cache's loader (a key of the core's key/value store);
  the cache is the base link's ``schemas`` (shared with ``polymq_server.messages.avroview``), sized
  by
  ``POLYMQ_AVRO_SCHEMA_CACHE``.
"""

from __future__ import annotations

import asyncio
import logging

from polymq import Client, CursorPage, Lease, Outcome
from polymq_server.link.corelink import CORE_TIMEOUT
from polymq_server.messages.avro import SchemaCache
from polymq_server.web.app import FrontendLink

from .config import AvroSettings
from .metrics import AvroMetrics

__all__ = ["CORE_TIMEOUT", "AvroLink"]

log = logging.getLogger(__name__)

_CURSOR_TTL = 60.0  # seconds a read's cursor outlives a read that could not close it


class AvroLink(FrontendLink[AvroSettings]):
    limits = (("avro_max_pull", "max_pull"), ("avro_max_wait", "max_wait"))

    def __init__(self, settings: AvroSettings, metrics: AvroMetrics) -> None:
        super().__init__(settings, metrics, service="avro")
        # the base link's shared cache (``schemas``), sized by this frontend's setting
        self._schemas = SchemaCache(self.fetch, settings.avro_schema_cache)

    def limit(self, name: str) -> int | None:
        """One of the core's limits (``max_frame``, ``max_body``...), if connected and said."""
        client = self.client
        value = client.limits.get(name) if client is not None else None
        return value if isinstance(value, int) and value > 0 else None

    async def fetch(self, key: str) -> bytes:
        """A value of the core's key/value store (NotFound if absent)."""
        return await self.call(lambda c: c.kv_get(key))

    # ---- waiting reads ---------------------------------------------------------------------
    async def pull(
        self, destination: str, max_: int, wait: float, visibility: float
    ) -> list[Lease]:
        """Lease up to ``max_`` messages, waiting up to ``wait`` for the first."""
        client = self.get()
        return await self.waiting(
            client,
            client.pull(destination, max_, wait=wait, visibility=visibility),
            wait,
            lambda leases: self.requeue(leases, client),
            [],
        )

    async def read_stream(
        self, destination: str, offset: str | int, max_: int, wait: float
    ) -> CursorPage:
        """Up to ``max_`` entries of a stream from ``offset``, through a cursor opened for
        this read and closed after it: its ``cursor`` is the last seq read."""
        client = self.get()
        opened = await self.guard(
            client,
            asyncio.wait_for(
                client.cursor_open(destination, offset=offset, ttl=wait + _CURSOR_TTL),
                CORE_TIMEOUT,
            ),
        )
        sub_id = opened.id
        empty = CursorPage(opened.cursor, [], [])
        try:
            return await self.waiting(
                client,
                client.cursor_poll(sub_id, None, max=max_, wait=wait),
                wait,
                lambda _: None,
                empty,
            )
        finally:
            if not client.closed:  # else the core forgets it with the connection's ttl
                self.spawn(client.cursor_close(sub_id), "closing a read's cursor")

    def requeue(self, leases: list[Lease], client: Client | None = None) -> None:
        """Give leases back to their queue at once, without waiting."""
        client = client if client is not None else self.client
        if not leases or client is None or client.closed:
            return
        receipts = [lease.receipt for lease in leases]
        self.spawn(client.settle(receipts, Outcome.REQUEUE), "requeueing leases nobody will see")
