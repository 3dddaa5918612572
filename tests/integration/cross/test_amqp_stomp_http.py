"""Across protocols, against one broker (``polymq run`` with the AMQP frontend): what AMQP
publishes, STOMP and HTTP receive with body, content type, priority and headers intact, and
the reverse; exchanges are reachable from the other protocols through the ``amqp.`` topics."""

from __future__ import annotations

import base64
import time
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from ..amqp.helpers import WAIT, Broker, unique
from ..stomp.helpers import Clients, StompClient
from .helpers import BINARY, body_of, post, pull

pytestmark = pytest.mark.timeout(60)


def get(channel: BlockingChannel, q: str) -> tuple[Any, Any, bytes]:
    deadline = time.monotonic() + WAIT
    while True:
        method, props, body = channel.basic_get(q, auto_ack=True)
        if method is not None:
            return method, props, body
        assert time.monotonic() < deadline, "no message"
        time.sleep(0.05)


AMQP_PROPS = pika.BasicProperties(
    content_type="application/json",
    headers={"x-trace": "abc", "x-count": 42, "x-flag": True},
    priority=7,
    delivery_mode=2,
    correlation_id="corr-1",
    reply_to="answers",
)


def declared_and_followed(channel: BlockingChannel, make: Clients) -> tuple[str, StompClient]:
    """A queue declared over AMQP, and a STOMP client subscribed to it."""
    q = unique("q")
    channel.queue_declare(q)
    consumer = make()
    consumer.subscribe(f"/queue/{q}")
    return q, consumer


# ---- AMQP -> STOMP ----------------------------------------------------------------------------
def test_amqp_publish_is_received_over_stomp(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients
) -> None:
    q, consumer = declared_and_followed(channel, stomp_client)
    channel.basic_publish("", q, b'{"order": 1}', AMQP_PROPS)
    [msg] = consumer.listener.wait_messages(1)
    h = msg.headers
    assert msg.body == '{"order": 1}'
    assert (h["content-type"], h["priority"], h["persistent"]) == ("application/json", "7", "true")
    assert (h["x-trace"], h["x-count"], h["x-flag"]) == ("abc", "42", "true")
    assert h["correlation-id"] == "corr-1"
    assert h["reply-to"] == "/queue/answers"
    assert h["destination"] == f"/queue/{q}"
    assert not [k for k in h if k.startswith("x-amqp-")]  # the AMQP frontend's bookkeeping


def test_amqp_exchange_publish_reaches_stomp_topic_subscribers(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients
) -> None:
    ex = unique("logs")
    channel.exchange_declare(ex, "topic")
    consumer = stomp_client()
    consumer.subscribe(f"/topic/amqp.{ex}.#")
    channel.basic_publish(ex, "app.error", b"boom", pika.BasicProperties(priority=3))
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == "boom"
    assert msg.headers["destination"] == f"/topic/amqp.{ex}.app.error"
    assert msg.headers["priority"] == "3"


# ---- STOMP -> AMQP ----------------------------------------------------------------------------
def test_stomp_send_is_received_over_amqp(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients
) -> None:
    q = unique("q")
    channel.queue_declare(q)
    stomp_client().send_receipted(
        f"/queue/{q}",
        "a,b\n1,2\n",
        **{"content-type": "text/csv", "x-trace": "xyz", "correlation-id": "c-2"},
        priority="8",
        persistent="true",
    )
    method, props, body = get(channel, q)
    assert body == b"a,b\n1,2\n"
    assert (method.exchange, method.routing_key) == ("", q)
    assert (props.content_type, props.priority, props.delivery_mode) == ("text/csv", 8, 2)
    assert props.correlation_id == "c-2"
    assert props.headers == {"x-trace": "xyz"}


def test_stomp_topic_send_reaches_a_bound_amqp_queue(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients
) -> None:
    ex, q = unique("ex"), unique("q")
    channel.exchange_declare(ex, "direct")
    channel.queue_declare(q)
    channel.queue_bind(q, ex, "orders.new")
    stomp_client().send_receipted(f"/topic/amqp.{ex}.orders.new", "via stomp")
    method, _props, body = get(channel, q)
    assert (body, method.exchange, method.routing_key) == (b"via stomp", ex, "orders.new")


# ---- HTTP -> AMQP -----------------------------------------------------------------------------
def test_http_post_is_received_over_amqp(broker: Broker, channel: BlockingChannel) -> None:
    q = unique("q")
    channel.queue_declare(q, durable=True)
    post(
        broker,
        f"queue/{q}/messages",
        {
            "body": '{"order": 42}',
            "content_type": "application/json",
            "priority": 6,
            "persistent": True,
            "headers": {"x-tenant": "t1", "x-colon": "a:b"},
            "correlation_id": "corr-3",
            "reply_to": "queue/replies",
            "ttl": 60,
        },
    )
    method, props, body = get(channel, q)
    assert body == b'{"order": 42}'
    assert (method.exchange, method.routing_key) == ("", q)
    assert (props.content_type, props.priority, props.delivery_mode) == ("application/json", 6, 2)
    assert props.headers == {"x-tenant": "t1", "x-colon": "a:b"}
    assert (props.correlation_id, props.reply_to) == ("corr-3", "replies")
    assert 50_000 < int(props.expiration) <= 60_000
    assert abs(props.timestamp - time.time()) < 30


def test_http_binary_body_to_amqp(broker: Broker, channel: BlockingChannel) -> None:
    q = unique("q")
    channel.queue_declare(q)
    post(
        broker,
        f"queue/{q}/messages",
        {"body": base64.b64encode(BINARY).decode(), "encoding": "base64"},
    )
    _method, props, body = get(channel, q)
    assert body == BINARY
    assert props.content_type == "application/octet-stream"


def test_http_topic_post_is_routed_by_an_amqp_fanout_exchange(
    broker: Broker, channel: BlockingChannel
) -> None:
    ex, q = unique("fan"), unique("q")
    channel.exchange_declare(ex, "fanout")
    channel.queue_declare(q)
    channel.queue_bind(q, ex)
    post(broker, f"topic/amqp.{ex}.anything/messages", {"body": "fanned", "priority": 2})
    method, props, body = get(channel, q)
    assert (body, method.exchange, method.routing_key, props.priority) == (
        b"fanned",
        ex,
        "anything",
        2,
    )


# ---- AMQP -> HTTP -----------------------------------------------------------------------------
def test_amqp_publish_is_pulled_over_http(broker: Broker, channel: BlockingChannel) -> None:
    q = unique("q")
    channel.queue_declare(q)
    channel.basic_publish("", q, BINARY, AMQP_PROPS)
    [m] = pull(broker, q)
    assert body_of(m) == BINARY
    assert (m["content_type"], m["priority"], m["persistent"]) == ("application/json", 7, True)
    assert m["correlation_id"] == "corr-1"
    assert m["reply_to"] == "queue/answers"
    h = m["headers"]
    assert (h["x-trace"], h["x-count"], h["x-flag"]) == ("abc", "42", "true")
    assert not [k for k in h if k.startswith("x-amqp-")]  # the AMQP frontend's bookkeeping


# ---- AMQP properties <-> STOMP and HTTP headers (README: "AMQP properties elsewhere") ---------
PROPERTY_HEADERS = {
    "content-encoding": "gzip",
    "amqp-message-id": "m-1",
    "amqp-type": "order.created",
    "amqp-app-id": "shop",
    "amqp-timestamp": "1700000000",
}


def test_amqp_properties_are_stomp_and_http_headers(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients
) -> None:
    q, consumer = declared_and_followed(channel, stomp_client)
    props = pika.BasicProperties(
        content_encoding="gzip",
        message_id="m-1",
        type="order.created",
        app_id="shop",
        timestamp=1_700_000_000,
        headers={"x-n": 7},
    )
    channel.basic_publish("", q, b"one", props)
    [msg] = consumer.listener.wait_messages(1)
    assert {k: msg.headers.get(k) for k in PROPERTY_HEADERS} == PROPERTY_HEADERS
    assert msg.headers["x-n"] == "7"
    consumer.close()
    channel.basic_publish("", q, b"two", props)
    [m] = pull(broker, q)
    assert body_of(m) == b"two"
    assert {k: m["headers"].get(k) for k in PROPERTY_HEADERS} == PROPERTY_HEADERS
    assert m["headers"]["x-n"] == "7"
    for shown in (msg.headers, m["headers"]):
        assert not [k for k in shown if k.startswith("x-amqp-")]


def test_stomp_and_http_headers_are_amqp_properties(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients
) -> None:
    q = unique("q")
    channel.queue_declare(q)
    spoofed = {**PROPERTY_HEADERS, "x-amqp-exchange": "fake", "x-amqp-routing-key": "fake"}
    stomp_client().send_receipted(f"/queue/{q}", "from stomp", **spoofed)
    post(broker, f"queue/{q}/messages", {"body": "from http", "headers": spoofed})
    for body in (b"from stomp", b"from http"):
        method, props, got = get(channel, q)
        assert (got, method.exchange, method.routing_key) == (body, "", q)
        assert (props.content_encoding, props.message_id, props.type) == (
            "gzip",
            "m-1",
            "order.created",
        )
        assert (props.app_id, props.timestamp) == ("shop", 1_700_000_000)
        assert not props.headers
