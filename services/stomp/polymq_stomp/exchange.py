"""``/exchange/<E>[/<key>]``: RabbitMQ's destinations for any exchange, in AMQP's topics.

The AMQP frontend routes a publish to exchange ``E`` with key ``K`` through the core topic
``topic/amqp.<E>.<K>`` of the vhost (:meth:`polymq.names.VhostNames.publish_topic`), and a
queue bound to ``E`` gets it through a core binding on that namespace
(:mod:`polymq.exchanges`). STOMP does the same, so that both see one exchange:

============  ===========================================  ===================================
type          SUBSCRIBE ``/exchange/E/K`` listens to        SEND ``/exchange/E/K`` publishes to
============  ===========================================  ===================================
fanout        ``topic/amqp.<E>.#`` (``K`` ignored)          ``topic/amqp.<E>.<K>``
direct        ``topic/amqp.<E>.<K>``                         ``topic/amqp.<E>.<K>``
topic         ``topic/amqp.<E>.<K as a pattern>``           ``topic/amqp.<E>.<K>``
headers       refused (bindings are matched by the AMQP     refused
              frontend; not mapped for STOMP yet)
============  ===========================================  ===================================

``amq.topic`` and ``amq.direct`` keep the mapping of ``destinations.py``. The type of an
exchange is built in (``amq.fanout``, ``amq.headers``, ``amq.match``) or read from its AMQP
record in the core's key/value store; an exchange that is neither is ERROR ``not_found``
with RabbitMQ's ``NOT_FOUND - no exchange '<E>' in vhost '<vhost>'``. A MESSAGE frame of such
a subscription names the exchange and key its message was published with
(``/exchange/<E>/<K>``), as RabbitMQ does. Messages reach what is bound to ``E`` itself (not
the exchanges bound to it: see the AMQP frontend's ``e2e.py``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from polymq.errors import NotFound
from polymq.exchanges import BUILTIN, ExchangeType, binding_pattern, record_key
from polymq.names import UnmappableName, VhostNames
from polymq.types import Kind

from .destinations import ExchangeRef, Target
from .refusal import Refused

if TYPE_CHECKING:
    from .session import Session

__all__ = ["resolve", "shown"]


async def _kind(session: Session, names: VhostNames, name: str) -> ExchangeType:
    kind = BUILTIN.get(name)
    if kind is not None:
        return kind
    key = record_key(names, name)
    try:
        raw = await session.hub.link.call(lambda c: c.kv_get(key))
        kind = ExchangeType(json.loads(raw)["type"])
    except (NotFound, ValueError, KeyError, TypeError):
        raise Refused(
            "destination",
            "not_found",
            f"NOT_FOUND - no exchange '{name[:200]}' in vhost '{names.vhost[:200]}'",
        ) from None
    return kind


async def resolve(session: Session, ref: ExchangeRef, *, subscribe: bool) -> Target:
    """The topic (SEND) or topic pattern (SUBSCRIBE) behind ``ref``, or Refused."""
    names = VhostNames(session.vhost)
    kind = await _kind(session, names, ref.name)
    if kind is ExchangeType.HEADERS:
        raise Refused(
            "destination",
            "Invalid destination",
            f"{ref.stomp[:200]!r}: headers exchanges are not mapped for STOMP yet",
        )
    try:
        if subscribe:
            pattern = binding_pattern(kind, ref.key)
            assert pattern is not None  # (headers exchanges only have none)
            core: str | None = names.binding_topic(ref.name, pattern)
        else:
            core = names.publish_topic(ref.name, ref.key)
    except UnmappableName as exc:
        core = None
        why = str(exc)
    else:
        why = "the exchange and key are too long for the core's names"
    if core is None:
        raise Refused("destination", "Invalid destination", f"{ref.stomp[:200]!r}: {why}")
    return Target(core, Kind.TOPIC, ref.stomp, vhost_prefix=session.vhost_prefix, exchange=ref.name)


def shown(names: VhostNames, topic: str) -> str | None:
    """``/exchange/<E>/<K>`` for a message of core topic ``topic`` (None if not an
    exchange's)."""
    route = names.route_of(topic)
    if route is None:
        return None
    exchange, key = route
    return f"/exchange/{exchange}/{key}"
