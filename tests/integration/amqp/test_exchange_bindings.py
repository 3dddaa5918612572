"""Exchange-to-exchange bindings (``exchange.bind`` / ``exchange.unbind``, issue 16 point 10)
with pika and aio-pika, each test against polymq and RabbitMQ: a message that reaches an
exchange reaches the exchanges bound to it by that exchange's rules, ``amq.*`` sources too,
through chains and cycles once each, each queue once; unbind and exchange.delete end the
route."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from .helpers import QUIET, WAIT, Target, unique

pytestmark = pytest.mark.timeout(90)


def drain(ch: BlockingChannel, queue: str, n: int) -> list[tuple[bytes, str, str]]:
    """``n`` messages of ``queue`` (body, exchange, routing key), then none for QUIET."""
    got: list[tuple[bytes, str, str]] = []
    deadline = time.monotonic() + WAIT
    while len(got) < n:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            assert time.monotonic() < deadline, f"{queue}: got only {got}"
            time.sleep(0.02)
            continue
        got.append((body, method.exchange, method.routing_key))
    time.sleep(QUIET)
    assert ch.basic_get(queue, auto_ack=True)[0] is None, f"{queue}: more than {got}"
    return got


def closed_with(fn: object) -> int:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        fn()  # type: ignore[operator]
    return int(info.value.reply_code)


@pytest.fixture
def ch(target: Target) -> BlockingChannel:
    conn = target.pika()
    yield conn.channel()
    conn.close()


def test_amq_topic_as_source_routes_by_its_patterns(ch: BlockingChannel) -> None:
    dest, q = unique("fan"), unique("q")
    ch.exchange_declare(dest, "fanout", auto_delete=True)
    ch.queue_declare(q, exclusive=True)
    ch.queue_bind(q, dest)
    ch.exchange_bind(dest, "amq.topic", routing_key="orders.*.eu")
    ch.confirm_delivery()
    for key in ("orders.new.eu", "orders.new.us", "orders.eu", "orders.old.eu"):
        ch.basic_publish("amq.topic", key, key.encode())
    # shown with the exchange and key it was published with
    assert drain(ch, q, 2) == [
        (b"orders.new.eu", "amq.topic", "orders.new.eu"),
        (b"orders.old.eu", "amq.topic", "orders.old.eu"),
    ]
    ch.exchange_unbind(dest, "amq.topic", routing_key="orders.*.eu")
    ch.basic_publish("amq.topic", "orders.new.eu", b"after unbind")
    drain(ch, q, 0)


def test_chains_and_cycles_deliver_once_to_each_queue(ch: BlockingChannel) -> None:
    a, b, c = unique("a"), unique("b"), unique("c")
    ch.exchange_declare(a, "direct", auto_delete=True)
    ch.exchange_declare(b, "topic", auto_delete=True)
    ch.exchange_declare(c, "fanout", auto_delete=True, internal=True)  # reached by bindings only
    qa, qc = unique("qa"), unique("qc")
    for q, ex, key in ((qa, a, "k.x"), (qc, c, "")):
        ch.queue_declare(q, exclusive=True)
        ch.queue_bind(q, ex, key)
    ch.exchange_bind(b, a, "k.x")  # a -> b (direct: the key itself)
    ch.exchange_bind(c, b, "k.#")  # b -> c
    ch.exchange_bind(a, c)  # c -> a: a cycle
    ch.confirm_delivery()
    ch.basic_publish(a, "k.x", b"one")
    ch.basic_publish(a, "k.y", b"nowhere")  # a's bindings want k.x only
    ch.basic_publish(b, "k.z", b"two")  # b -> c -> a (a's queue wants k.x: not this)
    assert drain(ch, qa, 1) == [(b"one", a, "k.x")]
    assert drain(ch, qc, 2) == [(b"one", a, "k.x"), (b"two", b, "k.z")]
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(a, "k.y", b"mandatory", mandatory=True)
    assert closed_with(lambda: ch.basic_publish(c, "", b"internal")) == 403


def test_a_queue_bound_to_several_reached_exchanges_gets_a_message_once(
    ch: BlockingChannel,
) -> None:
    a, b, c = unique("a"), unique("b"), unique("c")
    for ex, kind in ((a, "topic"), (b, "fanout"), (c, "direct")):
        ch.exchange_declare(ex, kind, auto_delete=True)
    both, only_b, only_c = unique("both"), unique("onlyb"), unique("onlyc")
    for q in (both, only_b, only_c):
        ch.queue_declare(q, exclusive=True)
    ch.queue_bind(both, a, "k.*")
    ch.queue_bind(both, b)
    ch.queue_bind(both, c, "k.x")
    ch.queue_bind(only_b, b)
    ch.queue_bind(only_c, c, "k.x")
    ch.exchange_bind(b, a, "k.#")
    ch.exchange_bind(c, b)
    ch.confirm_delivery()
    ch.basic_publish(a, "k.x", b"m")
    assert drain(ch, both, 1) == [(b"m", a, "k.x")]  # once, though three exchanges route it
    assert drain(ch, only_b, 1) == [(b"m", a, "k.x")]
    assert drain(ch, only_c, 1) == [(b"m", a, "k.x")]


def test_headers_source_and_deleting_a_destination(ch: BlockingChannel) -> None:
    dest, q = unique("dst"), unique("q")
    ch.exchange_declare(dest, "fanout")
    ch.queue_declare(q, exclusive=True)
    ch.queue_bind(q, dest)
    ch.exchange_bind(dest, "amq.headers", arguments={"x-match": "any", "kind": "a"})
    ch.confirm_delivery()
    ch.basic_publish("amq.headers", "", b"yes", pika.BasicProperties(headers={"kind": "a"}))
    ch.basic_publish("amq.headers", "", b"no", pika.BasicProperties(headers={"kind": "b"}))
    assert [m[0] for m in drain(ch, q, 1)] == [b"yes"]
    ch.exchange_delete(dest)  # its binding from amq.headers goes with it
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(
            "amq.headers", "", b"x", pika.BasicProperties(headers={"kind": "a"}), mandatory=True
        )


def test_refusals(target: Target) -> None:
    conn = target.pika()
    try:
        ch = conn.channel()
        real = unique("real")
        ch.exchange_declare(real, "fanout", auto_delete=True)
        assert closed_with(lambda: ch.exchange_bind(unique("absent"), real)) == 404
        ch = conn.channel()
        assert closed_with(lambda: ch.exchange_bind(real, unique("absent"))) == 404
        ch = conn.channel()
        assert closed_with(lambda: ch.exchange_bind(real, "")) == 403
        ch = conn.channel()
        ch.exchange_unbind(real, "amq.fanout")  # no such binding: fine
        ch.exchange_bind(real, "amq.fanout")
        ch.exchange_bind(real, "amq.fanout")  # twice is once
        ch.exchange_unbind(real, "amq.fanout")
    finally:
        conn.close()


def test_aio_pika_exchange_bind(target: Target) -> None:
    async def run() -> list[bytes]:
        conn = await aio_pika.connect(target.url(), timeout=10)
        async with conn:
            ch = await conn.channel()
            source = await ch.declare_exchange(unique("src"), "topic", auto_delete=True)
            dest = await ch.declare_exchange(unique("dst"), "direct", auto_delete=True)
            q = await ch.declare_queue(exclusive=True)
            await q.bind(dest, "logs.error")
            await dest.bind(source, "logs.#")
            for key in ("logs.error", "logs.info", "other.error"):
                await source.publish(aio_pika.Message(key.encode()), key, mandatory=False)
            await dest.unbind(source, "logs.#")  # its last binding: the source is deleted
            with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
                await source.publish(aio_pika.Message(b"after"), "logs.error", mandatory=False)
            ch = await conn.channel()  # (the 404 closed the other)
            q = await ch.get_queue(q.name)
            got = []
            async with q.iterator() as it:
                async for message in it:
                    got.append(message.body)
                    await message.ack()
                    break
            await asyncio.sleep(QUIET)
            assert await q.get(fail=False) is None
            return got

    assert asyncio.run(asyncio.wait_for(run(), 30)) == [b"logs.error"]
