"""Where a publish to an exchange goes: the core destinations of the exchanges it reaches.

Shared by the AMQP frontend (basic.publish) and the STOMP one (SEND to ``/exchange/E/K``),
so that a message sent to exchange ``E`` with key ``K`` by either reaches the same queues.
The records it needs (exchanges, their queue bindings, exchange-to-exchange bindings) are
read from the core's key/value store and cached by
:class:`~polymq_server.exchanges.records.Records`:
:func:`route_now` routes from what is cached (raising :class:`Missing` for what is not),
:func:`route_later` reads what it misses first.

**Exchange-to-exchange bindings** (``exchange.bind`` / ``exchange.unbind``, RabbitMQ's
extension): a message that reaches exchange S also reaches every exchange D bound to S with a
binding that matches it by S's rules, and so on from D (each exchange once, cycles included).
They are resolved at publish time (:func:`reached`, then :func:`destinations`): the message
goes to the core topic of each exchange it reaches (``topic/amqp.<X>.<key>``), so each one's
queues and subscribers get it, but each queue once, as in RabbitMQ: an exchange whose
matching queue bindings (their records) name a queue the message already reaches sends it
straight to its other queues instead of its topic.

**Headers exchanges** have no core bindings: a message goes to each queue whose binding
record matches its headers (:func:`polymq_server.exchanges.kinds.headers_match`), and to the
exchange's
topic, which only subscribers listen to (a STOMP ``SUBSCRIBE /exchange/<E>``, which RabbitMQ
serves by a queue bound with no arguments: one that matches every message).

Not as in RabbitMQ: an exchange whose topic is skipped as above does not reach its live
topic subscribers (STOMP ``/exchange/X/...``; AMQP consumers use queues); and queue bindings
made in the core without an AMQP record are not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Final

from ..names import UnmappableName, VhostNames
from .kinds import ExchangeType, headers_match
from .records import ExchangeBinding, ExchangeRecord, Records, plain_args

__all__ = [
    "MAX_EXCHANGES",
    "Missing",
    "destinations",
    "matches",
    "reached",
    "route_later",
    "route_now",
    "topic_matches",
]

MAX_EXCHANGES: Final = 64  # exchanges one publish may reach through bindings


class Missing(Exception):
    """A record that is not cached: ``what`` (``"exchange"``, ``"sources"`` for the
    bindings from an exchange, ``"bindings"`` for a headers exchange's queue bindings) of
    exchange ``name``."""

    def __init__(self, what: str, name: str) -> None:
        super().__init__(what, name)
        self.what = what
        self.name = name


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: words split on ``.``, ``*`` one word, ``#`` zero or more."""
    return _match(pattern.split("."), key.split("."))


def _match(pat: list[str], words: list[str]) -> bool:
    if not pat:
        return not words
    head = pat[0]
    if head == "#":
        rest = pat[1:]
        return any(_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    if head == "*" or head == words[0]:
        return _match(pat[1:], words[1:])
    return False


def matches(
    kind: ExchangeType,
    binding_key: str,
    arguments: Mapping[str, Any],
    routing_key: str,
    headers: Mapping[str, Any] | None,
) -> bool:
    """Does a binding of an exchange of type ``kind`` take this message?"""
    if kind is ExchangeType.FANOUT:
        return True
    if kind is ExchangeType.DIRECT:
        return binding_key == routing_key
    if kind is ExchangeType.TOPIC:
        return topic_matches(binding_key, routing_key)
    return headers_match(arguments, headers)


def reached(
    source: Any,
    routing_key: str,
    headers: Mapping[str, Any] | None,
    exchange: Callable[[str], Any],
    sources: Callable[[str], list[ExchangeBinding] | None],
    plain: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[Any]:
    """The exchange records a message published to ``source`` reaches, ``source`` first.
    ``exchange(name)`` gives a cached record (None: there is none), ``sources(name)`` the
    cached bindings from an exchange (None: not cached); raises :class:`Missing` for what
    is not cached."""
    out = [source]
    seen = {source.name}
    i = 0
    while i < len(out):
        rec = out[i]
        i += 1
        bindings = sources(rec.name)
        if bindings is None:
            raise Missing("sources", rec.name)
        for b in bindings:
            if b.destination in seen:
                continue
            if not matches(rec.kind, b.routing_key, plain(b.arguments), routing_key, headers):
                continue
            dest = exchange(b.destination)
            if dest is None:
                raise Missing("exchange", b.destination)
            if dest is False:  # gone (deleted meanwhile): nothing there
                continue
            seen.add(dest.name)
            out.append(dest)
            if len(out) >= MAX_EXCHANGES:
                return out
    return out


def destinations(
    reached: list[Any],
    routing_key: str,
    headers: Mapping[str, Any] | None,
    bindings: Callable[[str], list[Any] | None],
    topic: Callable[[str], str | None],
    queue: Callable[[str], str | None],
    plain: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[str]:
    """The core destinations of a message that reaches the exchanges ``reached`` (records,
    the one published to first): ``topic(exchange)`` is an exchange's topic for the key,
    ``queue(name)`` a queue's core name (None: unmappable), ``bindings(exchange)`` the
    cached records of its queue bindings (None: not cached, :class:`Missing`)."""
    if len(reached) == 1 and reached[0].kind is not ExchangeType.HEADERS:
        t = topic(reached[0].name)  # the common case: no records to read
        return [t] if t is not None else []
    out: list[str] = []
    taken: set[str] = set()  # queues the message reaches so far
    for x in reached:
        records = bindings(x.name)
        if records is None:
            raise Missing("bindings", x.name)
        queues = {
            b.queue
            for b in records
            if matches(x.kind, b.routing_key, plain(b.arguments), routing_key, headers)
        }
        t = topic(x.name)
        # a headers exchange's topic has subscribers only; another's reaches its queues too
        by_topic = t is not None and x.kind is not ExchangeType.HEADERS and not queues & taken
        if t is not None and (by_topic or x.kind is ExchangeType.HEADERS):
            out.append(t)
        if not by_topic:
            out += [d for d in map(queue, sorted(queues - taken)) if d is not None]
        taken |= queues
    return out


def route_now(
    records: Records,
    names: VhostNames,
    rec: ExchangeRecord,
    routing_key: str,
    headers: Mapping[str, Any] | None,
    known: Mapping[str, ExchangeRecord | None] | None = None,
) -> list[str]:
    """The destinations of a publish to ``rec`` (internal or not: the caller's to refuse);
    ``known``: exchanges read since (None: there is none). :class:`Missing` names a record
    that is not cached."""

    def exchange(name: str) -> ExchangeRecord | bool | None:
        found = records.cached_exchange(names, name)
        if found is not None:
            return found
        if known is not None and name in known:
            return known[name] or False
        return None

    def queue(name: str) -> str | None:
        try:
            return names.queue(name)
        except UnmappableName:
            return None

    return destinations(
        reached(
            rec,
            routing_key,
            headers,
            exchange,
            partial(records.cached_bindings_from, names),
            plain_args,
        ),
        routing_key,
        headers,
        partial(records.cached_exchange_bindings, names),
        lambda name: names.publish_topic(name, routing_key),
        queue,
        plain_args,
    )


async def route_later(
    records: Records,
    names: VhostNames,
    rec: ExchangeRecord,
    routing_key: str,
    headers: Mapping[str, Any] | None,
) -> list[str]:
    """:func:`route_now`, reading each record it misses until it has them all."""
    known: dict[str, ExchangeRecord | None] = {}
    for _ in range(4 * MAX_EXCHANGES):
        try:
            return route_now(records, names, rec, routing_key, headers, known)
        except Missing as missing:  # read it, then route again
            if missing.what == "exchange":
                known[missing.name] = await records.exchange(names, missing.name)
            elif missing.what == "sources":
                await records.bindings_from(names, missing.name)
            else:
                await records.exchange_bindings(names, missing.name)
    return route_now(records, names, rec, routing_key, headers, known)  # (Missing: a bug)
