"""``/exchange/<E>[/<key>]``: RabbitMQ's destinations for any exchange, routed as AMQP routes.

The AMQP frontend routes a publish to exchange ``E`` with key ``K`` through the core topic
``topic/amqp.<E>.<K>`` of the vhost (:meth:`polymq_server.names.VhostNames.publish_topic`), and a
queue bound to ``E`` gets it through a core binding on that namespace
(:mod:`polymq_server.exchanges.kinds`), or, for a headers exchange and through exchange-to-exchange
bindings, straight from the binding records (:mod:`polymq_server.exchanges.resolution`). STOMP
routes with the
same code and records, so that both see one exchange:

============  ===========================================  ===================================
type          SUBSCRIBE ``/exchange/E/K`` listens to        SEND ``/exchange/E/K`` goes to
============  ===========================================  ===================================
fanout        ``topic/amqp.<E>.#`` (``K`` ignored)          where an AMQP basic.publish to
direct        ``topic/amqp.<E>.<K>``                         ``E`` with routing key ``K`` and
topic         ``topic/amqp.<E>.<K as a pattern>``           the SEND's headers as AMQP
headers       ``topic/amqp.<E>.#``: RabbitMQ binds the      (longstr) headers goes: ``E``'s
              subscription's queue with no arguments,       topic, or the matching queues of
              which match every message (``K`` ignored)     ``E`` and of the exchanges bound
                                                            to it, each queue once
============  ===========================================  ===================================

``amq.topic`` keeps the mapping of ``destinations.py``. The type of an exchange is built in
(``amq.direct``, ``amq.fanout``, ``amq.headers``, ``amq.match``) or read from its AMQP record
(:class:`polymq_server.exchanges.records.Records`, cached for two seconds: a binding made
over AMQP routes STOMP's SENDs within that time); an exchange that is neither is ERROR ``not_found``
with RabbitMQ's ``NOT_FOUND - no exchange '<E>' in vhost '<vhost>'``, an internal one
``access_refused``. A SEND that goes anywhere but ``E``'s own topic carries the exchange and
key in the AMQP frontend's bookkeeping headers, so that an AMQP consumer is told them.

A MESSAGE frame of an ``/exchange/`` subscription names the exchange and key its message was
published with, as RabbitMQ's ``format_destination`` does: ``/exchange/<E>/<K>``,
``/exchange/<E>`` for an empty key, ``/topic/<K>`` for ``amq.topic``, ``/queue/<K>`` for
the default exchange.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from polymq.types import Kind, Message
from polymq_server.exchanges.kinds import binding_pattern
from polymq_server.exchanges.records import ExchangeRecord
from polymq_server.exchanges.resolution import Missing, route_later, route_now
from polymq_server.messages.headers import AMQP_EXCHANGE, AMQP_ROUTING_KEY
from polymq_server.names import SHARED_TOPIC_EXCHANGE, UnmappableName, VhostNames

from .destinations import ExchangeRef, Target
from .refusal import Refused

if TYPE_CHECKING:
    from .parts import PartSession

__all__ = ["resolve", "routes_later", "routes_now", "shown"]


async def _record(session: PartSession, names: VhostNames, name: str) -> ExchangeRecord:
    rec = await session.hub.records.exchange(names, name)
    if rec is None:
        raise Refused(
            "destination",
            "not_found",
            f"NOT_FOUND - no exchange '{name[:200]}' in vhost '{names.vhost[:200]}'",
        )
    return rec


async def resolve(session: PartSession, ref: ExchangeRef, *, subscribe: bool) -> Target:
    """The topic pattern (SUBSCRIBE) behind ``ref``, or (SEND) the target whose messages
    are routed by :func:`routes_now`; Refused if there is no such exchange."""
    names = VhostNames(session.vhost)
    rec = await _record(session, names, ref.name)
    try:
        if subscribe:
            pattern = binding_pattern(rec.kind, ref.key)
            core: str | None = names.binding_topic(ref.name, pattern or "#")
        else:
            core = names.publish_topic(ref.name, ref.key)
    except UnmappableName as exc:
        core = None
        why = str(exc)
    else:
        why = "the exchange and key are too long for the core's names"
    if core is None:
        raise Refused("destination", "Invalid destination", f"{ref.stomp[:200]!r}: {why}")
    return Target(
        core,
        Kind.TOPIC,
        ref.stomp,
        vhost_prefix=session.vhost_prefix,
        exchange=ref.name,
        routing_key=None if subscribe else ref.key,
    )


def _check(names: VhostNames, rec: ExchangeRecord) -> None:
    if rec.internal:
        raise Refused(
            "destination",
            "access_refused",
            f"ACCESS_REFUSED - cannot publish to internal exchange '{rec.name[:200]}' in "
            f"vhost '{names.vhost[:200]}'",
        )


def _mark(target: Target, cores: list[str], message: Message) -> list[str]:
    """``cores``; a message that goes elsewhere than its exchange's topic is told its
    exchange and key (the AMQP frontend's bookkeeping headers)."""
    if cores != [target.core]:
        message.headers[AMQP_EXCHANGE] = target.exchange or ""
        message.headers[AMQP_ROUTING_KEY] = target.routing_key or ""
    return cores


def routes_now(session: PartSession, target: Target, message: Message) -> list[str] | None:
    """The core destinations of a SEND to an exchange's ``target``, from cached records;
    None when one must be read first (:func:`routes_later`)."""
    names = VhostNames(session.vhost)
    assert target.exchange is not None and target.routing_key is not None
    records = session.hub.records
    rec = records.cached_exchange(names, target.exchange)
    if rec is None:
        return None
    _check(names, rec)
    try:
        cores = route_now(records, names, rec, target.routing_key, _headers(message))
    except Missing:
        return None
    return _mark(target, cores, message)


async def routes_later(session: PartSession, target: Target, message: Message) -> list[str]:
    """:func:`routes_now`, reading the records it needs."""
    names = VhostNames(session.vhost)
    assert target.exchange is not None and target.routing_key is not None
    rec = await _record(session, names, target.exchange)
    _check(names, rec)
    records = session.hub.records
    cores = await route_later(records, names, rec, target.routing_key, _headers(message))
    return _mark(target, cores, message)


def _headers(message: Message) -> Mapping[str, str]:
    """What a headers exchange matches: the SEND's headers, which RabbitMQ makes AMQP
    longstr headers (strings here, as binding arguments are)."""
    return message.headers


def shown(names: VhostNames, message: Message) -> str | None:
    """The destination RabbitMQ names in a MESSAGE frame of an exchange's ``message``
    (None if it is not an exchange's)."""
    exchange = message.headers.get(AMQP_EXCHANGE)
    if exchange is not None:
        key = message.headers.get(AMQP_ROUTING_KEY, "")
    else:
        route = names.route_of(message.destination)
        if route is None:
            return None
        exchange, key = route
    if not exchange:
        return f"/queue/{key}"
    if exchange == SHARED_TOPIC_EXCHANGE:
        return f"/topic/{key}"
    return f"/exchange/{exchange}/{key}" if key else f"/exchange/{exchange}"
