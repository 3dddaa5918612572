"""Exchange-to-exchange bindings (``exchange.bind`` / ``exchange.unbind``, RabbitMQ's
extension): a message that reaches exchange S also reaches every exchange D bound to S with a
binding that matches it by S's rules, and so on from D (each exchange once, cycles included).

The frontend resolves them at publish time (:func:`reached`, then :func:`destinations`):
the message goes to the core topic of each exchange it reaches (``topic/amqp.<X>.<key>``),
so each one's queues and subscribers get it, but each queue once, as in RabbitMQ: an
exchange whose matching queue bindings (their records) name a queue the message already
reaches sends it straight to its other queues instead of its topic. A headers exchange
sends it to its matching queues (its bindings are matched here in any case). The records
are key/value entries beside the queue bindings (see ``topology.py``)::

    amqp/xs/<vhost>/<source>/<destination>/<digest>     by source ...
    amqp/xd/<vhost>/<destination>/<source>/<digest>     ... and by destination

Not as in RabbitMQ: an exchange whose topic is skipped that way does not reach its live
topic subscribers (STOMP ``/exchange/X/...``; AMQP consumers use queues); queue bindings
made in the core without an AMQP record are not seen; and a message published to S by
another protocol (STOMP ``/exchange/S/...``) reaches S's own queues and subscribers only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .exchanges import ExchangeType, headers_match

__all__ = [
    "MAX_EXCHANGES",
    "ExchangeBinding",
    "Missing",
    "binding_digest",
    "destinations",
    "matches",
    "reached",
]

MAX_EXCHANGES: Final = 64  # exchanges one publish may reach through bindings


@dataclass(frozen=True)
class ExchangeBinding:
    source: str
    destination: str
    routing_key: str
    arguments: dict[str, Any]  # tagged

    @property
    def digest(self) -> str:
        return binding_digest(self.routing_key, self.arguments)


def binding_digest(routing_key: str, arguments: dict[str, Any]) -> str:
    """What tells apart two bindings of the same ends (in their record's key)."""
    raw = json.dumps(
        [routing_key, arguments], separators=(",", ":"), ensure_ascii=False, sort_keys=True
    )
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


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
        t = topic(x.name) if x.kind is not ExchangeType.HEADERS else None
        if t is not None and not queues & taken:
            out.append(t)
        else:
            for name in sorted(queues - taken):
                dest = queue(name)
                if dest is not None:
                    out.append(dest)
        taken |= queues
    return out
