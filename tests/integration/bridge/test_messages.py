"""Messages cross the bridge both ways with their properties; a stream link resumes after
its last confirmed entry; the metrics and readiness endpoints say what happened."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any

import aio_pika
import pytest

from polymq import Client, Message

from ...procs import PolymqProcess
from ...rabbit import RabbitNode
from .conftest import unique

pytestmark = pytest.mark.timeout(60)


async def rabbit_queue(url: str, name: str, exchange: str = "", key: str = "") -> None:
    """Declare a durable RabbitMQ queue (bound to ``exchange`` with ``key`` if given)."""
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue(name, durable=True)
        if exchange:
            ex = await ch.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT, durable=True)
            await q.bind(ex, key)


async def rabbit_take(url: str, name: str, n: int, within: float = 15.0) -> list[Any]:
    """``n`` messages from a RabbitMQ queue (acknowledged), or fail saying how many came."""
    got: list[aio_pika.abc.AbstractIncomingMessage] = []
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel()
        q = await ch.get_queue(name)
        deadline = time.monotonic() + within
        while len(got) < n:
            m = await q.get(fail=False)
            if m is None:
                assert time.monotonic() < deadline, f"got {len(got)} of {n} from {name}"
                await asyncio.sleep(0.02)
                continue
            await m.ack()
            got.append(m)
    return got


async def polymq_take(port: int, dest: str, n: int, within: float = 15.0) -> list[Message]:
    async with await Client.connect("127.0.0.1", port) as c:
        out: list[Message] = []
        async with await c.subscribe(dest, ack_mode="client-individual", prefetch=500) as sub:
            try:
                while len(out) < n:
                    d = await sub.get(within)
                    d.ack()
                    out.append(d.message)
            except TimeoutError:
                raise AssertionError(f"got {len(out)} of {n} from {dest}") from None
        return out


async def test_polymq_to_rabbitmq_carries_properties(
    bridge_factory: Any, rabbit: RabbitNode, core: PolymqProcess
) -> None:
    src, rq, ex = unique("out"), unique("rq"), unique("ex")
    await rabbit_queue(rabbit.url, rq, ex, "k1")
    bridge = bridge_factory(
        [
            {
                "name": "out",
                "direction": "polymq-to-rabbitmq",
                "source": f"queue/{src}",
                "exchange": ex,
                "routing_key": "k1",
            }
        ]
    )
    bridge.wait_ready()
    expires = time.time() + 600
    async with await Client.connect("127.0.0.1", core.ports["core"]) as c:
        await c.publish(
            f"queue/{src}",
            Message(
                b'{"a": 1}',
                content_type="application/json",
                headers={"x-trace": "abc", "amqp-message-id": "m-1", "type": "order.new"},
                priority=7,
                persistent=True,
                expires=expires,
                correlation_id="corr-1",
                reply_to="queue/replies",
            ),
        )
        plain = Message(b"plain")
        await c.publish(f"queue/{src}", plain)
    got = await rabbit_take(rabbit.url, rq, 2)
    m, p = got
    assert m.body == b'{"a": 1}'
    assert m.content_type == "application/json"
    assert m.headers == {"x-trace": "abc"}
    assert m.priority == 7
    assert m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert m.correlation_id == "corr-1"
    assert m.reply_to == "queue/replies"
    assert m.message_id == "m-1"
    assert m.type == "order.new"
    assert m.expiration is not None and 590 < m.expiration <= 600
    assert isinstance(m.timestamp, dt.datetime)
    assert abs(m.timestamp.timestamp() - time.time()) < 60  # polymq's publish time
    # a message from polymq without an AMQP message id carries polymq's own id
    assert p.body == b"plain"
    assert p.delivery_mode == aio_pika.DeliveryMode.NOT_PERSISTENT
    assert p.message_id and p.message_id.count(".") == 2
    assert p.expiration is None
    labels = {"link": "out", "direction": "to_rabbitmq"}
    bridge.wait_metric("polymq_bridge_messages_total", 2, **labels)
    assert bridge.metric("polymq_bridge_messages_total", **labels) == 2
    assert bridge.stop() == 0, bridge.log()


async def test_rabbitmq_to_polymq_carries_properties(
    bridge_factory: Any, rabbit: RabbitNode, core: PolymqProcess
) -> None:
    rq, dest = unique("in"), unique("in")
    await rabbit_queue(rabbit.url, rq)
    bridge = bridge_factory(
        [
            {
                "name": "in",
                "direction": "rabbitmq-to-polymq",
                "queue": rq,
                "destination": f"queue/{dest}",
            }
        ]
    )
    bridge.wait_ready()
    conn = await aio_pika.connect(rabbit.url)
    async with conn:
        ch = await conn.channel()
        await ch.default_exchange.publish(
            aio_pika.Message(
                b"\x00\x01binary",
                content_type="application/x-thing",
                content_encoding="gzip",
                headers={"s": "text", "n": 42, "f": True, "nested": {"a": [1, "b"]}},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                priority=3,
                correlation_id="c-9",
                reply_to="reply.queue",
                expiration=120,
                message_id="rabbit-7",
                timestamp=dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC),
                type="evt",
                app_id="shop",
            ),
            routing_key=rq,
        )
        await ch.default_exchange.publish(
            aio_pika.Message(b"transient", priority=200), routing_key=rq
        )
    got = {m.body: m for m in await polymq_take(core.ports["core"], f"queue/{dest}", 2)}
    a, b = got[b"\x00\x01binary"], got[b"transient"]
    assert a.body == b"\x00\x01binary"
    assert a.content_type == "application/x-thing"
    assert a.persistent is True
    assert a.priority == 3
    assert a.correlation_id == "c-9"
    assert a.reply_to == "reply.queue"
    assert a.expires is not None and 100 < a.expires - time.time() <= 120
    assert a.headers == {
        "s": "text",
        "n": "42",
        "f": "true",
        "nested": json.dumps({"a": [1, "b"]}, separators=(",", ":")),
        "amqp-message-id": "rabbit-7",
        "amqp-timestamp": str(int(dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC).timestamp())),
        "content-encoding": "gzip",
        "type": "evt",
        "app-id": "shop",
    }
    assert b.body == b"transient"
    assert b.persistent is False
    assert b.priority == 9  # AMQP allows 0..255, polymq 0..9
    assert b.expires is None
    labels = {"link": "in", "direction": "to_polymq"}
    bridge.wait_metric("polymq_bridge_messages_total", 2, **labels)
    assert bridge.metric("polymq_bridge_messages_total", **labels) == 2
    assert bridge.stop() == 0, bridge.log()


async def test_round_trip_rabbitmq_polymq_rabbitmq(bridge_factory: Any, rabbit: RabbitNode) -> None:
    """RabbitMQ -> polymq -> RabbitMQ: what a RabbitMQ consumer sees is what was published."""
    q1, mid, q2 = unique("rt1"), unique("rtmid"), unique("rt2")
    await rabbit_queue(rabbit.url, q1)
    await rabbit_queue(rabbit.url, q2)
    bridge = bridge_factory(
        [
            {
                "name": "in",
                "direction": "rabbitmq-to-polymq",
                "queue": q1,
                "destination": f"queue/{mid}",
            },
            {
                "name": "out",
                "direction": "polymq-to-rabbitmq",
                "source": f"queue/{mid}",
                "routing_key": q2,
            },
        ]
    )
    bridge.wait_ready()
    sent = aio_pika.Message(
        b"round",
        content_type="text/plain",
        content_encoding="utf-8",
        headers={"h": "v"},
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=5,
        correlation_id="c",
        reply_to="r",
        message_id="id-1",
        timestamp=dt.datetime(2023, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        type="t",
        app_id="a",
    )
    conn = await aio_pika.connect(rabbit.url)
    async with conn:
        ch = await conn.channel()
        await ch.default_exchange.publish(sent, routing_key=q1)
    (got,) = await rabbit_take(rabbit.url, q2, 1)
    for attr in (
        "body", "content_type", "content_encoding", "headers", "delivery_mode", "priority",
        "correlation_id", "reply_to", "message_id", "timestamp", "type", "app_id",
    ):  # fmt: skip
        assert getattr(got, attr) == getattr(sent, attr), attr
    assert bridge.stop() == 0, bridge.log()


async def test_stream_link_resumes_after_its_last_confirmed_entry(
    bridge_factory: Any, rabbit: RabbitNode, core: PolymqProcess
) -> None:
    stream, rq = unique("st"), unique("strq")
    await rabbit_queue(rabbit.url, rq)
    link = {
        "name": "st",
        "direction": "polymq-to-rabbitmq",
        "source": f"stream/{stream}",
        "offset": "first",
        "routing_key": rq,
        "prefetch": 50,
    }
    async with await Client.connect("127.0.0.1", core.ports["core"]) as c:
        await c.publish(
            f"stream/{stream}", [Message(b"%d" % i, persistent=True) for i in range(300)]
        )
        bridge = bridge_factory([link])
        got = await rabbit_take(rabbit.url, rq, 300)
        assert [m.body for m in got] == [b"%d" % i for i in range(300)]
        assert bridge.stop() == 0, bridge.log()
        assert await c.kv_get("polymq-bridge/st/offset") == b"300"
        # appended while no bridge runs: a new bridge sends these, not the first 300 again
        await c.publish(
            f"stream/{stream}", [Message(b"%d" % i, persistent=True) for i in range(300, 400)]
        )
        bridge2 = bridge_factory([link])
        got = await rabbit_take(rabbit.url, rq, 100)
        assert [m.body for m in got] == [b"%d" % i for i in range(300, 400)]
        await asyncio.sleep(0.5)
        assert await rabbit_take(rabbit.url, rq, 0) == []
        deadline = time.monotonic() + 5
        while bridge2.metric("polymq_bridge_stream_offset", link="st") != 400:
            assert time.monotonic() < deadline, bridge2.metrics()
            await asyncio.sleep(0.1)
        assert bridge2.metric("polymq_bridge_lag_messages", link="st") == 0
        assert bridge2.stop() == 0, bridge2.log()


async def test_metrics_and_readiness(bridge_factory: Any, rabbit: RabbitNode) -> None:
    rq = unique("mr")
    bridge = bridge_factory(
        [
            {
                "name": "missing",
                "direction": "rabbitmq-to-polymq",
                "queue": rq,
                "destination": "queue/whatever",
            },
        ]
    )
    # the RabbitMQ queue does not exist: the link cannot run, and /readyz says so
    await asyncio.sleep(1.0)
    status, body = bridge.get("/readyz")
    assert status == 503
    doc = json.loads(body)
    assert "missing" in doc["problems"][0]
    (link,) = doc["links"]
    assert link["running"] is False and rq in link["last_error"]
    assert bridge.get("/healthz")[0] == 200
    m = bridge.metrics()
    assert m['polymq_bridge_connected{side="rabbitmq"}'] == 1
    assert m['polymq_bridge_connected{side="core"}'] == 1
    assert m['polymq_bridge_link_up{link="missing"}'] == 0
    assert m['polymq_bridge_errors_total{link="missing",reason="source_failed"}'] >= 1
    # once the queue exists the link starts on its next attempt
    await rabbit_queue(rabbit.url, rq)
    bridge.wait_ready()
    assert bridge.metric("polymq_bridge_link_up", link="missing") == 1
    assert bridge.stop() == 0, bridge.log()


async def test_unroutable_messages_wait_in_polymq_until_rabbitmq_can_route_them(
    bridge_factory: Any, rabbit: RabbitNode, core: PolymqProcess
) -> None:
    src, ex, rq = unique("ur"), unique("urex"), unique("urq")
    conn = await aio_pika.connect(rabbit.url)
    async with conn:
        ch = await conn.channel()
        await ch.declare_exchange(ex, aio_pika.ExchangeType.DIRECT, durable=True)
    bridge = bridge_factory(
        [{"name": "ur", "direction": "polymq-to-rabbitmq", "source": f"queue/{src}",
          "exchange": ex, "routing_key": "k"}]
    )  # fmt: skip
    bridge.wait_ready()
    async with await Client.connect("127.0.0.1", core.ports["core"]) as c:
        await c.publish(f"queue/{src}", [Message(b"%d" % i, persistent=True) for i in range(5)])
        # nothing is bound to the exchange: RabbitMQ returns them, the bridge keeps them
        await asyncio.to_thread(
            bridge.wait_metric, "polymq_bridge_errors_total", 1, link="ur", reason="unroutable"
        )
        await asyncio.sleep(0.3)
        stats = await c.stats(f"queue/{src}")
        assert stats.messages + stats.in_flight == 5
        deadline = time.monotonic() + 10
        while "could not route" not in json.loads(bridge.get("/links")[1])["links"][0].get(
            "last_error", ""
        ):
            assert time.monotonic() < deadline, bridge.get("/links")
            await asyncio.sleep(0.05)
        await rabbit_queue(rabbit.url, rq, ex, "k")  # a binding appears: they go through
        got = await rabbit_take(rabbit.url, rq, 5)
        assert sorted(m.body for m in got) == [b"%d" % i for i in range(5)]
    assert bridge.stop() == 0, bridge.log()


async def test_unroutable_messages_rejected_go_to_the_dead_letter_queue(
    bridge_factory: Any, rabbit: RabbitNode, core: PolymqProcess
) -> None:
    src, dlq, ex = unique("rj"), unique("rjdl"), unique("rjex")
    conn = await aio_pika.connect(rabbit.url)
    async with conn:
        ch = await conn.channel()
        await ch.declare_exchange(ex, aio_pika.ExchangeType.DIRECT, durable=True)
    async with await Client.connect("127.0.0.1", core.ports["core"]) as c:
        await c.declare(f"queue/{src}", dead_letter=f"queue/{dlq}")
        bridge = bridge_factory(
            [{"name": "rj", "direction": "polymq-to-rabbitmq", "source": f"queue/{src}",
              "exchange": ex, "routing_key": "k", "on_unroutable": "reject"}]
        )  # fmt: skip
        await c.publish(f"queue/{src}", Message(b"nowhere", persistent=True))
        (dead,) = await polymq_take(core.ports["core"], f"queue/{dlq}", 1)
        assert dead.body == b"nowhere"
        assert bridge.metric("polymq_bridge_errors_total", link="rj", reason="unroutable") == 1
        assert bridge.metric("polymq_bridge_link_up", link="rj") == 1  # it keeps running
    assert bridge.stop() == 0, bridge.log()
