"""The same broker through aio-pika (aiormq underneath), the way asyncio programs use it."""

from __future__ import annotations

import asyncio
import datetime

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from .helpers import WAIT, Broker, unique

pytestmark = pytest.mark.timeout(60)


async def test_topic_exchange_consume_and_ack(aconn: AbstractConnection) -> None:
    ch = await aconn.channel()  # publisher confirms are on by default in aio-pika
    await ch.set_qos(prefetch_count=5)
    ex = await ch.declare_exchange(unique("logs"), aio_pika.ExchangeType.TOPIC)
    q = await ch.declare_queue(unique("q"), durable=True)
    await q.bind(ex, "app.*.error")
    for key in ("app.web.error", "app.web.info", "app.db.error"):
        await ex.publish(
            aio_pika.Message(
                key.encode(),
                content_type="text/plain",
                headers={"ratio": 0.5, "n": 3, "when": datetime.datetime(2024, 5, 6)},
                priority=2,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=key,
        )
    got: list[AbstractIncomingMessage] = []
    async with q.iterator() as it:
        async for message in it:
            got.append(message)
            await message.ack()
            if len(got) == 2:
                break
    assert [m.body for m in got] == [b"app.web.error", b"app.db.error"]
    m = got[0]
    assert (m.exchange, m.routing_key, m.content_type, m.priority) == (
        ex.name,
        "app.web.error",
        "text/plain",
        2,
    )
    assert m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert m.headers["ratio"] == 0.5 and m.headers["n"] == 3
    assert m.headers["when"].replace(tzinfo=None) == datetime.datetime(2024, 5, 6)


async def test_nack_requeue_and_get(aconn: AbstractConnection) -> None:
    ch = await aconn.channel()
    q = await ch.declare_queue(unique("q"))
    await ch.default_exchange.publish(aio_pika.Message(b"again"), routing_key=q.name)
    first = await q.get(timeout=WAIT)
    assert first is not None and not first.redelivered
    await first.nack(requeue=True)
    second = await q.get(timeout=WAIT)
    assert second is not None and second.redelivered and second.body == b"again"
    await second.ack()
    assert await q.get(fail=False) is None


async def test_mandatory_return_fails_the_publish(aconn: AbstractConnection) -> None:
    ch = await aconn.channel(on_return_raises=True)
    ex = await ch.declare_exchange(unique("direct"), aio_pika.ExchangeType.DIRECT)
    with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
        await ex.publish(aio_pika.Message(b"x"), routing_key="nobody", mandatory=True)
    assert info.value.frame.reply_code == 312


async def test_reject_publish_queue_nacks(aconn: AbstractConnection) -> None:
    ch = await aconn.channel()
    q = await ch.declare_queue(
        unique("full"), arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    await ch.default_exchange.publish(aio_pika.Message(b"1"), routing_key=q.name)
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await ch.default_exchange.publish(aio_pika.Message(b"2"), routing_key=q.name)


async def test_transactions(aconn: AbstractConnection) -> None:
    ch = await aconn.channel(publisher_confirms=False)
    q = await ch.declare_queue(unique("q"))
    async with ch.transaction():
        await ch.default_exchange.publish(aio_pika.Message(b"in tx"), routing_key=q.name)
    tx = ch.transaction()
    await tx.select()
    await ch.default_exchange.publish(aio_pika.Message(b"rolled back"), routing_key=q.name)
    await tx.rollback()
    m = await q.get(timeout=WAIT)
    assert m is not None and m.body == b"in tx"
    await m.ack()
    assert await q.get(fail=False) is None


async def test_exclusive_queue_with_many_publishers(aconn: AbstractConnection) -> None:
    ch = await aconn.channel()
    q = await ch.declare_queue(exclusive=True)
    assert q.name.startswith("amq.gen-")
    n = 300
    await asyncio.gather(
        *(
            ch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=q.name)
            for i in range(n)
        )
    )
    seen = []
    async with q.iterator(no_ack=True) as it:
        async for message in it:
            seen.append(int(message.body))
            if len(seen) == n:
                break
    assert seen == list(range(n))


async def test_robust_connection_survives_a_closed_channel(broker: Broker) -> None:
    conn = await aio_pika.connect_robust(broker.amqp_url(), timeout=WAIT)
    try:
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue(unique("absent"), passive=True)
        ch2 = await conn.channel()
        q = await ch2.declare_queue(unique("q"))
        await ch2.default_exchange.publish(aio_pika.Message(b"ok"), routing_key=q.name)
        m = await q.get(timeout=WAIT)
        assert m is not None and m.body == b"ok"
        await m.ack()
    finally:
        await conn.close()
