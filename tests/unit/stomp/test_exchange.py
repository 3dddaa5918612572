"""How MESSAGE frames of ``/exchange/`` subscriptions name their messages
(``polymq_stomp.exchange.shown``): as RabbitMQ's ``format_destination``."""

from __future__ import annotations

import pytest

from polymq.types import Message
from polymq_server.messages.headers import AMQP_EXCHANGE, AMQP_ROUTING_KEY
from polymq_server.names import VhostNames
from polymq_stomp.exchange import shown

NAMES = VhostNames("/")


def _message(destination: str, **route: str) -> Message:
    headers = {}
    if "exchange" in route:
        headers[AMQP_EXCHANGE] = route["exchange"]
        headers[AMQP_ROUTING_KEY] = route.get("key", "")
    return Message(b"", headers=headers, destination=destination)


@pytest.mark.parametrize(
    ("message", "named"),
    [
        # published by STOMP to the exchange's own topic: the topic says where
        (_message(NAMES.publish_topic("orders", "eu.new") or ""), "/exchange/orders/eu.new"),
        (_message(NAMES.publish_topic("orders", "") or ""), "/exchange/orders"),
        # published over AMQP, or routed further than its topic: the bookkeeping says where
        (_message(NAMES.publish_topic("fan", "k") or "", exchange="src", key="k"),
         "/exchange/src/k"),
        (_message(NAMES.publish_topic("fan", "") or "", exchange="hdr"), "/exchange/hdr"),
        (_message("topic/x", exchange="amq.topic", key="a.b"), "/topic/a.b"),
        (_message("topic/x", exchange="", key="q"), "/queue/q"),
        (_message("queue/q"), None),
    ],
)  # fmt: skip
def test_shown_as_rabbitmq_names_it(message: Message, named: str | None) -> None:
    assert shown(NAMES, message) == named
