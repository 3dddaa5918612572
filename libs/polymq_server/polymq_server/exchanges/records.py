"""The records of AMQP's exchanges and bindings in the core's key/value store, read and cached.

What AMQP declares that the core has no word for (an exchange and its type, the bindings of
a headers exchange, exchange-to-exchange bindings) is a JSON record under ``amqp/``::

    amqp/x/<vhost>/<exchange>                       an exchange
    amqp/b/<vhost>/<queue>/<exchange>/<digest>      a queue binding, listed by queue ...
    amqp/e/<vhost>/<exchange>/<queue>/<digest>      ... and by exchange
    amqp/xs/<vhost>/<source>/<destination>/<digest> an exchange binding, by source ...
    amqp/xd/<vhost>/<destination>/<source>/<digest> ... and by destination

(each part escaped into one segment, see :mod:`polymq_server.names`; the digest covers the routing
key and the arguments, kept tagged: :mod:`polymq_server.messages.tagged`). The AMQP frontend writes
them
(its ``topology.py`` adds queues, writes and deletes); every frontend that publishes to an
exchange reads them here to route as AMQP does (:mod:`polymq_server.exchanges.resolution`): the
STOMP
frontend's ``/exchange/`` destinations.

:class:`Records` caches what it read for ``cache_ttl`` seconds: what this process changes is
in its cache at once, what another process changed is seen within that time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from polymq.errors import NotFound

from ..link.corelink import CoreLink
from ..messages.tagged import from_tagged, to_tagged
from ..names import VhostNames, escape_word
from .kinds import BUILTIN, ExchangeType, record_key

__all__ = [
    "BY_DESTINATION",
    "BY_EXCHANGE",
    "BY_QUEUE",
    "BY_SOURCE",
    "BindingRecord",
    "ExchangeBinding",
    "ExchangeRecord",
    "Records",
    "binding_digest",
    "plain_args",
    "tagged_args",
]

log = logging.getLogger(__name__)

_B = TypeVar("_B")

BY_QUEUE: Final = "b"  # the tables of records (see above)
BY_EXCHANGE: Final = "e"
BY_SOURCE: Final = "xs"
BY_DESTINATION: Final = "xd"


def tagged_args(args: dict[str, Any] | None) -> dict[str, Any]:
    return {str(k): to_tagged(v) for k, v in (args or {}).items()}


def plain_args(tagged: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tagged.items():
        with contextlib.suppress(ValueError, TypeError):
            out[k] = from_tagged(v)
    return out


def binding_digest(routing_key: str, arguments: dict[str, Any]) -> str:
    """What tells apart two bindings of the same ends (in their record's key)."""
    raw = json.dumps(
        [routing_key, arguments], separators=(",", ":"), ensure_ascii=False, sort_keys=True
    )
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExchangeRecord:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)  # tagged
    builtin: bool = False

    @property
    def kind(self) -> ExchangeType:
        return ExchangeType(self.type)


class _Binding:
    """A binding's routing key and arguments, and the digest they make."""

    routing_key: str
    arguments: dict[str, Any]  # tagged

    @property
    def digest(self) -> str:
        return binding_digest(self.routing_key, self.arguments)


@dataclass(frozen=True)
class BindingRecord(_Binding):
    exchange: str
    queue: str
    routing_key: str
    arguments: dict[str, Any]  # tagged
    pattern: str | None  # the core binding (topic/...), None for headers exchanges


@dataclass(frozen=True)
class ExchangeBinding(_Binding):
    source: str
    destination: str
    routing_key: str
    arguments: dict[str, Any]  # tagged


class Records:
    """The exchange and binding records of every vhost, read through a core link."""

    def __init__(self, link: CoreLink, *, cache_ttl: float = 2.0) -> None:
        self.link = link
        self.cache_ttl = cache_ttl
        self._cache: dict[str, tuple[float, Any]] = {}

    # ---- key/value -----------------------------------------------------------------------
    async def _get(self, key: str) -> Any:
        try:
            raw = await self.link.call(lambda c: c.kv_get(key))
        except NotFound:
            return None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            log.warning("records: unreadable record %s", key)
            return None

    async def _list(self, prefix: str) -> list[str]:
        keys: list[str] = await self.link.call(lambda c: c.kv_list(prefix))
        return keys

    async def read(self, key: str, make: Callable[..., _B]) -> _B | None:
        """The record under ``key`` made by ``make`` from its fields; None if there is none
        or it is unreadable (logged)."""
        raw = await self._get(key)
        if not isinstance(raw, dict):
            return None
        try:
            return make(**raw)
        except (TypeError, ValueError):
            log.warning("records: unreadable record %s", key)
            return None

    def _cached(self, key: str) -> Any:
        hit = self._cache.get(key)
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            del self._cache[key]
            return None
        return hit[1]

    def _remember(self, key: str, value: Any) -> None:
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[key] = (time.monotonic() + self.cache_ttl, value)

    def _forget(self, key: str) -> None:
        self._cache.pop(key, None)

    # ---- exchanges ---------------------------------------------------------------------
    @staticmethod
    def exchange_key(names: VhostNames, name: str) -> str:
        return record_key(names, name)

    def cached_exchange(self, names: VhostNames, name: str) -> ExchangeRecord | None:
        kind = BUILTIN.get(name)
        if kind is not None:
            return ExchangeRecord(name, kind.value, builtin=True)
        rec = self._cached(self.exchange_key(names, name))
        return rec if isinstance(rec, ExchangeRecord) else None

    async def exchange(self, names: VhostNames, name: str) -> ExchangeRecord | None:
        rec = self.cached_exchange(names, name)
        if rec is not None:
            return rec
        key = self.exchange_key(names, name)
        rec = await self.read(key, _exchange_record)
        if rec is not None:
            self._remember(key, rec)
        return rec

    # ---- bindings ----------------------------------------------------------------------
    async def _bindings(self, prefix: str, cls: Callable[..., _B]) -> list[_B]:
        cached = self._cached(prefix)
        if isinstance(cached, list):
            return cached
        out: list[_B] = []
        for key in await self._list(prefix):
            rec = await self.read(key, cls)
            if rec is not None:
                out.append(rec)
        self._remember(prefix, out)
        return out

    @staticmethod
    def prefix(table: str, names: VhostNames, name: str) -> str:
        """Where the records of one table (:data:`BY_QUEUE`, :data:`BY_EXCHANGE`,
        :data:`BY_SOURCE`, :data:`BY_DESTINATION`) about ``name`` are listed."""
        return f"amqp/{table}/{names.key}/{escape_word(name)}/"

    def _cached_list(self, prefix: str) -> list[Any] | None:
        cached = self._cached(prefix)
        return cached if isinstance(cached, list) else None

    async def queue_bindings(self, names: VhostNames, queue: str) -> list[BindingRecord]:
        return await self._bindings(self.prefix(BY_QUEUE, names, queue), BindingRecord)

    async def exchange_bindings(self, names: VhostNames, exchange: str) -> list[BindingRecord]:
        return await self._bindings(self.prefix(BY_EXCHANGE, names, exchange), BindingRecord)

    def cached_exchange_bindings(
        self, names: VhostNames, exchange: str
    ) -> list[BindingRecord] | None:
        return self._cached_list(self.prefix(BY_EXCHANGE, names, exchange))

    # ---- exchange-to-exchange bindings -------------------------------------------------
    async def bindings_from(self, names: VhostNames, source: str) -> list[ExchangeBinding]:
        """The exchange-to-exchange bindings whose source is ``source``."""
        return await self._bindings(self.prefix(BY_SOURCE, names, source), ExchangeBinding)

    def cached_bindings_from(self, names: VhostNames, source: str) -> list[ExchangeBinding] | None:
        return self._cached_list(self.prefix(BY_SOURCE, names, source))

    async def bindings_to(self, names: VhostNames, destination: str) -> list[ExchangeBinding]:
        prefix = self.prefix(BY_DESTINATION, names, destination)
        return await self._bindings(prefix, ExchangeBinding)


def _exchange_record(**fields: Any) -> ExchangeRecord:
    rec = ExchangeRecord(**fields)
    ExchangeType(rec.type)  # ValueError: not one
    return rec
