"""Message headers that a frontend keeps for itself, and what other protocols' clients see.

A frontend may carry in a message's headers what only it needs to deliver the message again
in its own protocol (the AMQP frontend: the exchange and routing key a message was published
with, and the AMQP types of its headers). These bookkeeping headers are one frontend's
business: every other frontend leaves them out of what it shows (STOMP MESSAGE frames, the
HTTP, long-poll, SSE and Avro frontends' JSON), with :func:`public_headers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["AMQP_EXCHANGE", "AMQP_ROUTING_KEY", "AMQP_TYPED", "BOOKKEEPING", "public_headers"]

AMQP_EXCHANGE: Final = "x-amqp-exchange"
AMQP_ROUTING_KEY: Final = "x-amqp-routing-key"
AMQP_TYPED: Final = "x-amqp-typed"
BOOKKEEPING: Final = frozenset({AMQP_EXCHANGE, AMQP_ROUTING_KEY, AMQP_TYPED})


def public_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` without the bookkeeping ones (``headers`` itself when it has none)."""
    if BOOKKEEPING.isdisjoint(headers):
        return headers
    return {k: v for k, v in headers.items() if k not in BOOKKEEPING}
