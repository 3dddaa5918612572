"""Exchanges, queues and bindings: records in the core's key/value store, cached here.

The frontend keeps no state of its own: what AMQP declares that the core has no word for
(an exchange and its type, a queue's AMQP arguments and exclusive owner, the bindings of a
headers exchange) is a JSON record under ``amqp/``::

    amqp/x/<vhost>/<exchange>                       an exchange
    amqp/q/<vhost>/<queue>                          a queue (its core queue is declared too)
    amqp/b/<vhost>/<queue>/<exchange>/<digest>      a binding, listed by queue ...
    amqp/e/<vhost>/<exchange>/<queue>/<digest>      ... and by exchange
    amqp/xs/..., amqp/xd/...                        exchange-to-exchange bindings
    amqp/i/<instance>                               a frontend instance's heartbeat

(each part escaped into one segment, see :mod:`polymq_server.names`; the digest covers the
routing key and arguments). Bindings of direct, topic and fanout exchanges are also core bindings
(``client.bind``), which route in the core; those of headers exchanges are matched by
:mod:`polymq_server.exchanges.resolution` when a message is published.
Several AMQP bindings that make the same core pattern share one core binding, removed with
the last of them.

Reading and caching them is :class:`polymq_server.exchanges.records.Records`' (the STOMP frontend
routes
through exchanges with the same records); :class:`Topology` adds the writes, the queues and
the instance heartbeats. Records are cached for ``cache_ttl`` seconds; this instance's own
changes update its cache at once, another instance's are seen within that time. An
exclusive queue names its owner (``<instance>/<connection>``); an owner whose instance
stopped beating is gone, and its queue can be taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

from polymq.answers import QueueStats
from polymq.errors import NotFound, PolymqError
from polymq_server.exchanges.kinds import binding_pattern
from polymq_server.exchanges.records import (
    BY_DESTINATION,
    BY_EXCHANGE,
    BY_QUEUE,
    BY_SOURCE,
    BindingRecord,
    ExchangeBinding,
    ExchangeRecord,
    Records,
    plain_args,
    tagged_args,
)
from polymq_server.link.corelink import CoreLink
from polymq_server.names import VhostNames, escape_word

__all__ = [
    "BindingRecord",
    "ExchangeRecord",
    "QueueRecord",
    "Topology",
    "plain_args",
    "tagged_args",
]

log = logging.getLogger(__name__)

_BEAT: Final = 10.0  # seconds between instance heartbeats
_DEAD_AFTER: Final = 45.0  # an instance silent this long is gone


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()


@dataclass(frozen=True)
class QueueRecord:
    name: str
    core: str  # the core destination
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict[str, Any]  # tagged
    owner: str | None = None  # "<instance>/<connection>" of an exclusive queue
    expires: bool = False  # the core deletes it when idle (x-expires, or exclusive)


class Topology(Records):
    """The records of every vhost, through the frontend's core link: read and cached as
    :class:`~polymq_server.exchanges.records.Records`, written here."""

    def __init__(
        self,
        link: CoreLink,
        instance: str,
        *,
        cache_ttl: float = 2.0,
        local_owner: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__(link, cache_ttl=cache_ttl)
        self.instance = instance
        self.local_owner = local_owner or (lambda owner: False)  # is this local one alive?
        self._task: asyncio.Task[None] | None = None

    # ---- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._beat(), name="polymq-amqp-instance-beat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.link.connected:
            with contextlib.suppress(PolymqError, TimeoutError):
                await asyncio.wait_for(self._delete(f"amqp/i/{self.instance}"), 2.0)

    async def _beat(self) -> None:
        key = f"amqp/i/{self.instance}"
        while True:
            if self.link.connected:
                try:
                    await self._put(key, {"t": time.time()})
                except (PolymqError, TimeoutError) as exc:
                    log.debug("amqp: instance heartbeat failed: %s", exc)
            await asyncio.sleep(_BEAT)

    async def owner_alive(self, owner: str) -> bool:
        instance, _, _conn = owner.partition("/")
        if instance == self.instance:
            return self.local_owner(owner)
        beat = await self._get(f"amqp/i/{instance}")
        if not isinstance(beat, dict):
            return False
        t = beat.get("t")
        return isinstance(t, int | float) and time.time() - t < _DEAD_AFTER

    # ---- key/value -----------------------------------------------------------------------
    async def _put(self, key: str, value: Any) -> None:
        data = _dumps(value)
        await self.link.call(lambda c: c.kv_put(key, data))

    async def _delete(self, key: str) -> None:
        with contextlib.suppress(NotFound):
            await self.link.call(lambda c: c.kv_delete(key))

    # ---- exchanges ---------------------------------------------------------------------
    async def put_exchange(self, names: VhostNames, rec: ExchangeRecord) -> None:
        key = self.exchange_key(names, rec.name)
        await self._put(key, asdict(rec))
        self._remember(key, rec)

    async def delete_exchange(self, names: VhostNames, name: str) -> None:
        """Delete an exchange and every binding it has (to queues and other exchanges, as
        source or destination)."""
        for binding in await self.exchange_bindings(names, name):
            await self.remove_binding(names, binding, check_auto_delete=False)
        for e2e in [*await self.bindings_from(names, name), *await self.bindings_to(names, name)]:
            await self.remove_exchange_binding(names, e2e)
        key = self.exchange_key(names, name)
        self._forget(key)
        await self._delete(key)

    # ---- queues ------------------------------------------------------------------------
    @staticmethod
    def queue_key(names: VhostNames, name: str) -> str:
        return f"amqp/q/{names.key}/{escape_word(name)}"

    def cached_queue(self, names: VhostNames, name: str) -> QueueRecord | None:
        rec = self._cached(self.queue_key(names, name))
        return rec if isinstance(rec, QueueRecord) else None

    async def queue(self, names: VhostNames, name: str) -> QueueRecord | None:
        """The record of queue ``name``; None if absent (a stale exclusive queue, whose
        owner is gone, is deleted on the way)."""
        rec = self.cached_queue(names, name)
        if rec is not None:
            return rec
        key = self.queue_key(names, name)
        rec = await self.read(key, QueueRecord)
        if rec is None:
            return None
        if rec.exclusive and rec.owner and not await self.owner_alive(rec.owner):
            log.info("amqp: exclusive queue %r of a connection that is gone: deleting", name)
            await self.delete_queue(names, rec)
            return None
        if rec.expires and await self.core_has(rec.core) is None:
            log.info("amqp: queue %r expired at the core: forgetting it", name)
            await self.delete_queue(names, rec)
            return None
        self._remember(key, rec)
        return rec

    def known_queue(self, names: VhostNames, name: str) -> bool | None:
        """True if queue ``name`` is known (cached) to exist; None if that needs a look."""
        if self.cached_queue(names, name) is not None:
            return True
        if self._cached("exists:" + names.queue(name)) is True:
            return True
        return None

    async def queue_exists(self, names: VhostNames, name: str) -> bool:
        """Does queue ``name`` exist: declared over AMQP, or known to the core?"""
        if await self.queue(names, name) is not None:
            return True
        core = names.queue(name)
        if await self.core_has(core) is not None:
            self._remember("exists:" + core, True)
            return True
        return False

    async def core_has(self, core: str) -> QueueStats | None:
        """The core's stats of a queue (``queue/<name>``), None if it has no such queue."""
        try:
            stats = await self.link.call(lambda c: c.stats(core))
        except NotFound:
            return None
        return stats if isinstance(stats, QueueStats) else None

    async def put_queue(self, names: VhostNames, rec: QueueRecord) -> None:
        key = self.queue_key(names, rec.name)
        await self._put(key, asdict(rec))
        self._remember(key, rec)

    async def delete_queue(self, names: VhostNames, rec: QueueRecord) -> None:
        """Delete a queue at the core, its bindings, and its record (in that order)."""
        with contextlib.suppress(NotFound):
            await self.link.call(lambda c: c.delete(rec.core))
        self._forget("exists:" + rec.core)
        for binding in await self.queue_bindings(names, rec.name):
            await self.remove_binding(names, binding, core=False)
        key = self.queue_key(names, rec.name)
        self._forget(key)
        await self._delete(key)

    # ---- bindings ----------------------------------------------------------------------
    @staticmethod
    def _binding_keys(names: VhostNames, b: BindingRecord) -> tuple[str, str]:
        v, q, e = names.key, escape_word(b.queue), escape_word(b.exchange)
        return f"amqp/b/{v}/{q}/{e}/{b.digest}", f"amqp/e/{v}/{e}/{q}/{b.digest}"

    # ---- exchange-to-exchange bindings (see polymq_server.exchanges.resolution)
    # ---------------------------
    def _e2e_keys(self, names: VhostNames, b: ExchangeBinding) -> tuple[str, str]:
        src, dst = escape_word(b.source), escape_word(b.destination)
        return (
            f"{self.prefix(BY_SOURCE, names, b.source)}{dst}/{b.digest}",
            f"{self.prefix(BY_DESTINATION, names, b.destination)}{src}/{b.digest}",
        )

    async def add_exchange_binding(self, names: VhostNames, b: ExchangeBinding) -> None:
        value = asdict(b)
        for key in self._e2e_keys(names, b):
            await self._put(key, value)
        self._forget(self.prefix(BY_SOURCE, names, b.source))
        self._forget(self.prefix(BY_DESTINATION, names, b.destination))

    async def remove_exchange_binding(self, names: VhostNames, b: ExchangeBinding) -> None:
        for key in self._e2e_keys(names, b):
            await self._delete(key)
        self._forget(self.prefix(BY_SOURCE, names, b.source))
        self._forget(self.prefix(BY_DESTINATION, names, b.destination))

    def _touch(self, names: VhostNames, b: BindingRecord) -> None:
        self._forget(self.prefix(BY_QUEUE, names, b.queue))
        self._forget(self.prefix(BY_EXCHANGE, names, b.exchange))

    def make_binding(
        self,
        names: VhostNames,
        exchange: ExchangeRecord,
        queue: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> BindingRecord:
        pattern = binding_pattern(exchange.kind, routing_key)
        topic = names.binding_topic(exchange.name, pattern) if pattern is not None else None
        return BindingRecord(exchange.name, queue, routing_key, tagged_args(arguments), topic)

    async def add_binding(self, names: VhostNames, core_queue: str, b: BindingRecord) -> None:
        pattern = b.pattern
        if pattern is not None:
            await self.link.call(lambda c: c.bind(pattern, core_queue))
        by_queue, by_exchange = self._binding_keys(names, b)
        value = asdict(b)
        await self._put(by_queue, value)
        await self._put(by_exchange, value)
        self._touch(names, b)

    async def remove_binding(
        self,
        names: VhostNames,
        b: BindingRecord,
        *,
        core: bool = True,
        check_auto_delete: bool = True,
    ) -> None:
        """Remove one binding; its core binding goes with the last binding that made it."""
        by_queue, by_exchange = self._binding_keys(names, b)
        await self._delete(by_queue)
        await self._delete(by_exchange)
        self._touch(names, b)
        pattern = b.pattern
        if core and pattern is not None:
            rest = await self.queue_bindings(names, b.queue)
            if not any(o.pattern == pattern for o in rest):
                core_queue = names.queue(b.queue)
                with contextlib.suppress(NotFound):
                    await self.link.call(lambda c: c.unbind(pattern, core_queue))
        if check_auto_delete:
            await self.auto_delete(names, b.exchange)

    async def auto_delete(self, names: VhostNames, exchange: str) -> None:
        """Delete an auto-delete exchange that is the source of no binding any more."""
        ex = await self.exchange(names, exchange)
        if ex is None or not ex.auto_delete or ex.builtin:
            return
        if await self.exchange_bindings(names, exchange) or await self.bindings_from(
            names, exchange
        ):
            return
        log.debug("amqp: auto-delete exchange %r has no bindings left", exchange)
        await self.delete_exchange(names, exchange)
