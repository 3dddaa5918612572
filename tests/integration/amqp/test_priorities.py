"""Message priorities as RabbitMQ has them (issue 16, point 9), with pika and aio-pika, each
test against polymq and RabbitMQ: a queue declared without ``x-max-priority`` is strictly
FIFO whatever the messages' priorities; with it, priorities 0..max order the queue (a higher
one counts as max); the ``priority`` property reaches the consumer exactly as published.

Not the same: polymq's queues have the levels 0..9, so under an ``x-max-priority`` above 9
the priorities 9..max count as one level (RabbitMQ would order them too)."""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest

from .helpers import Target, unique

pytestmark = pytest.mark.timeout(90)

# (body, priority) in publish order; None: no priority property
SENT = [(b"a", 0), (b"b", 5), (b"c", 9), (b"d", None), (b"e", 3), (b"f", 200), (b"g", 1)]


def publish_and_get(target: Target, arguments: dict[str, int] | None) -> list[tuple[bytes, int]]:
    conn = target.pika()
    try:
        ch = conn.channel()
        q = unique("prio")
        ch.queue_declare(q, arguments=arguments)
        ch.confirm_delivery()
        for body, priority in SENT:
            ch.basic_publish("", q, body, pika.BasicProperties(priority=priority))
        got = []
        while True:
            method, props, body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            got.append((body, props.priority))
        ch.queue_delete(q)
        return got
    finally:
        conn.close()


def test_a_queue_without_max_priority_is_fifo(target: Target) -> None:
    assert publish_and_get(target, None) == SENT  # in order, each priority as published


def test_a_priority_queue_orders_by_priorities_up_to_its_max(target: Target) -> None:
    got = publish_and_get(target, {"x-max-priority": 5})
    # 5, 9 and 200 all count as 5 (in publish order), then 3 and 1; no priority counts as 0
    assert got == [
        (b"b", 5),
        (b"c", 9),
        (b"f", 200),
        (b"e", 3),
        (b"g", 1),
        (b"a", 0),
        (b"d", None),
    ]


def test_an_aio_pika_consumer_sees_each_priority_as_published(target: Target) -> None:
    async def run() -> list[tuple[bytes, int | None]]:
        conn = await aio_pika.connect(target.url(), timeout=10)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(unique("prio"), auto_delete=True)
            for body, priority in SENT:
                await ch.default_exchange.publish(
                    aio_pika.Message(body, priority=priority), routing_key=q.name
                )
            got: list[tuple[bytes, int | None]] = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append((message.body, message.priority))
                    if len(got) == len(SENT):
                        break
            return got

    # a consumer of a FIFO queue gets them in order, each priority as it was sent: 0 is 0
    # (aio-pika sends priority 0 where it is given none)
    sent = [(body, 0 if priority is None else priority) for body, priority in SENT]
    assert asyncio.run(asyncio.wait_for(run(), 30)) == sent
