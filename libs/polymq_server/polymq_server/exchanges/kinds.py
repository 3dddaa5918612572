"""Exchange types, and how each routes: a core binding pattern, or (headers) a match here.

================  ===========================================  ============================
type              queue.bind(Q, E, K) in the core               basic.publish(E, K) goes to
================  ===========================================  ============================
``direct``        ``topic/amqp.<E>.<K, every word escaped>``    ``topic/amqp.<E>.<K>``
``topic``         ``topic/amqp.<E>.<K, * and # kept>``          ``topic/amqp.<E>.<K>``
``fanout``        ``topic/amqp.<E>.#`` (K is ignored)           ``topic/amqp.<E>.<K>``
``headers``       nothing: bindings live in the key/value       ``queue/<Q>`` for every
                  store, matched by the frontend                matching binding
(default) ``""``  cannot be bound                               ``queue/<K>``, if Q exists
================  ===========================================  ============================

``amq.topic`` routes like any topic exchange, in the vhost's plain topics rather than
``amqp.amq:2Etopic.…`` (``topic/<K>``: see :mod:`polymq_server.names`), the topics every other
protocol names ``K``.

Shared by the AMQP frontend and the STOMP one (its ``/exchange/<E>/<K>`` destinations publish
and subscribe in the same topics). An exchange declared over AMQP is a JSON record (its
``type`` among others) under :func:`record_key` in the core's key/value store.

The core's topic patterns have AMQP's semantics (``*`` one word, ``#`` zero or more), and an
escaped word never contains ``*`` or ``#``, so a direct exchange's key ``a.#`` is literal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

from ..names import VhostNames, escape_key, escape_pattern, escape_word

__all__ = [
    "BUILTIN",
    "ExchangeType",
    "binding_pattern",
    "headers_match",
    "record_key",
    "valid_match_mode",
]


class ExchangeType(enum.Enum):
    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"


BUILTIN: Final[dict[str, ExchangeType]] = {
    "amq.direct": ExchangeType.DIRECT,
    "amq.fanout": ExchangeType.FANOUT,
    "amq.topic": ExchangeType.TOPIC,
    "amq.headers": ExchangeType.HEADERS,
    "amq.match": ExchangeType.HEADERS,
}


def record_key(names: VhostNames, exchange: str) -> str:
    """The key/value key of the record of ``exchange`` (declared over AMQP) in a vhost."""
    return f"amqp/x/{names.key}/{escape_word(exchange)}"


def binding_pattern(kind: ExchangeType, routing_key: str) -> str | None:
    """The core pattern (after ``amqp.<E>.``) of a binding; None for headers exchanges."""
    if kind is ExchangeType.FANOUT:
        return "#"
    if kind is ExchangeType.TOPIC:
        return escape_pattern(routing_key)
    if kind is ExchangeType.DIRECT:
        return escape_key(routing_key)
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bytes | bytearray) and isinstance(b, str):
        return bytes(a) == b.encode()
    if isinstance(b, bytes | bytearray) and isinstance(a, str):
        return bytes(b) == a.encode()
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """RabbitMQ's headers exchange: ``x-match`` ``all`` (the default) or ``any`` (and
    ``all-with-x`` / ``any-with-x``, which also compare ``x-`` arguments). A binding value
    of void (None) asks for the header's presence only."""
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes | bytearray):
        mode = bytes(mode).decode("utf-8", "replace")
    with_x = mode in ("all-with-x", "any-with-x")
    want_all = mode in ("all", "all-with-x")
    headers = headers or {}
    for key, want in arguments.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        ok = key in headers and (want is None or _same(want, headers[key]))
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    return want_all


def valid_match_mode(arguments: Mapping[str, Any]) -> bool:
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes | bytearray):
        mode = bytes(mode).decode("utf-8", "replace")
    return mode in ("all", "any", "all-with-x", "any-with-x")
