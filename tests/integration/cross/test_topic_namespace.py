"""One topic namespace across protocols (issue 16, point 14): AMQP's ``amq.topic`` with key
``K``, STOMP's ``/topic/K`` and ``/exchange/amq.topic/K``, the HTTP and long-poll frontends'
``topic/K`` and the native client's ``topic/K`` are one topic. A message published on any of
them reaches a subscriber on each, exact and pattern subscriptions alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from pika.adapters.blocking_connection import BlockingChannel

from polymq import Client

from ..amqp.helpers import WAIT, Broker, unique
from ..stomp.helpers import Clients, nothing_more
from .helpers import post

pytestmark = pytest.mark.timeout(90)

PUBLISHERS = ("amqp", "stomp", "stomp-exchange", "http", "longpoll", "native")


def amqp_get(channel: BlockingChannel, q: str) -> tuple[str, str, bytes]:
    deadline = time.monotonic() + WAIT
    while True:
        method, _props, body = channel.basic_get(q, auto_ack=True)
        if method is not None:
            return method.exchange, method.routing_key, body
        assert time.monotonic() < deadline, f"nothing in {q}"
        time.sleep(0.05)


def longpoll_open(broker: Broker, destination: str) -> tuple[str, str]:
    url = f"{broker.url('longpoll')}/v1/subscriptions"
    r = requests.post(url, json={"destination": destination}, timeout=WAIT)
    assert r.status_code == 201, r.text
    sub = r.json()
    return sub["id"], sub["cursor"]


def longpoll_messages(broker: Broker, sub: tuple[str, str]) -> list[dict[str, Any]]:
    r = requests.get(
        f"{broker.url('longpoll')}/v1/subscriptions/{sub[0]}/poll",
        params={"cursor": sub[1], "wait": 5},
        timeout=WAIT + 5,
    )
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


@pytest.mark.parametrize("source", PUBLISHERS)
def test_a_topic_publish_reaches_every_protocol(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients, source: str
) -> None:
    base = unique("ns")
    key = f"{base}.news.eu"
    body = f"from {source}"

    # AMQP: an exact binding and a pattern binding on amq.topic
    exact_q, pattern_q = unique("exact"), unique("pattern")
    for q, binding in ((exact_q, key), (pattern_q, f"{base}.#")):
        channel.queue_declare(q, exclusive=True)
        channel.queue_bind(q, "amq.topic", binding)
    # STOMP: a pattern on /topic/, an exact /exchange/amq.topic/ subscription
    stomp_pattern, stomp_exact = stomp_client(), stomp_client()
    stomp_pattern.subscribe(f"/topic/{base}.*.eu")
    stomp_exact.subscribe(f"/exchange/amq.topic/{key}")
    # long polling (the HTTP frontends' way to follow a topic)
    lp = longpoll_open(broker, f"topic/{base}.#")
    time.sleep(0.2)  # (SUBSCRIBE has no receipt here: let the subscriptions reach the core)

    publish: dict[str, Callable[[], None]] = {
        "amqp": lambda: channel.basic_publish("amq.topic", key, body.encode()),
        "stomp": lambda: stomp_client().send_receipted(f"/topic/{key}", body),
        "stomp-exchange": lambda: stomp_client().send_receipted(f"/exchange/amq.topic/{key}", body),
        "http": lambda: post(broker, f"topic/{key}/messages", {"body": body}) and None,
        "longpoll": lambda: requests.post(
            f"{broker.url('longpoll')}/v1/topic/{key}/messages", json={"body": body}, timeout=WAIT
        ).raise_for_status(),
    }

    async def native() -> list[bytes]:
        async with await Client.connect("127.0.0.1", broker.ports["core"]) as client:
            exact = await client.subscribe(f"topic/{key}")
            pattern = await client.subscribe(f"topic/{base}.#")
            if source == "native":
                await client.publish(f"topic/{key}", body.encode())
            else:
                await asyncio.to_thread(publish[source])
            got = [(await exact.get(WAIT)).message, (await pattern.get(WAIT)).message]
            assert all(m.destination == f"topic/{key}" for m in got)
            return [m.body for m in got]

    assert asyncio.run(native()) == [body.encode(), body.encode()]
    for q in (exact_q, pattern_q):
        assert amqp_get(channel, q) == ("amq.topic", key, body.encode())
        assert channel.basic_get(q, auto_ack=True)[0] is None
    for consumer in (stomp_pattern, stomp_exact):
        [msg] = consumer.listener.wait_messages(1)
        assert (msg.body, msg.headers["destination"]) == (body, f"/topic/{key}")
        assert not [k for k in msg.headers if k.startswith("x-amqp-")]
        nothing_more(consumer.listener, 1)
    [m] = longpoll_messages(broker, lp)
    assert (m["body"], m["destination"], m["headers"]) == (body, f"topic/{key}", {})


def test_other_exchanges_keep_their_own_topics(
    broker: Broker, channel: BlockingChannel, stomp_client: Clients
) -> None:
    """Only amq.topic is shared: another topic exchange's key K is not /topic/K."""
    ex, base = unique("ex"), unique("own")
    channel.exchange_declare(ex, "topic")
    consumer = stomp_client()
    consumer.subscribe(f"/topic/{base}.#")
    own = stomp_client()
    own.subscribe(f"/exchange/{ex}/{base}.#")
    time.sleep(0.2)
    channel.basic_publish(ex, f"{base}.k", b"to ex")
    channel.basic_publish("amq.topic", f"{base}.k", b"to amq.topic")
    [msg] = own.listener.wait_messages(1)
    assert msg.body == "to ex"
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == "to amq.topic"
    nothing_more(consumer.listener, 1)
    nothing_more(own.listener, 1)
