"""Direct reply-to (``amq.rabbitmq.reply-to``, issue 16 point 12) as pika's and aio-pika's
RPC examples use it, each test against polymq and RabbitMQ: the requester consumes from the
pseudo-queue in no-ack mode and names it as reply_to; the responder answers to the default
exchange with the reply_to it got, and the reply reaches the requester's consumer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aio_pika
import pika
import pytest

from .helpers import WAIT, Target, unique

pytestmark = pytest.mark.timeout(90)

PSEUDO = "amq.rabbitmq.reply-to"


def test_pika_rpc_through_direct_reply_to(target: Target) -> None:
    server, client = target.pika(), target.pika()
    try:
        sch = server.channel()
        rpc = unique("rpc")
        sch.queue_declare(rpc, auto_delete=True)
        cch = client.channel()
        replies: list[tuple[str, str, bytes, str | None]] = []

        def on_reply(ch, method, props, body):  # type: ignore[no-untyped-def]
            replies.append((method.exchange, method.routing_key, body, props.correlation_id))

        cch.basic_consume(PSEUDO, on_reply, auto_ack=True)
        for i in range(3):
            props = pika.BasicProperties(reply_to=PSEUDO, correlation_id=f"c{i}")
            cch.basic_publish("", rpc, f"ping {i}".encode(), props)

        # the responder: what pika's example server does with each request
        seen_reply_to = set()
        for i in range(3):
            deadline = time.monotonic() + WAIT
            while True:
                method, props, body = sch.basic_get(rpc, auto_ack=True)
                if method is not None:
                    break
                assert time.monotonic() < deadline, "no request"
                time.sleep(0.02)
            assert body == f"ping {i}".encode()
            assert props.reply_to.startswith(PSEUDO + ".")  # the channel's own name
            seen_reply_to.add(props.reply_to)
            answer = pika.BasicProperties(correlation_id=props.correlation_id)
            sch.basic_publish("", props.reply_to, body.replace(b"ping", b"pong"), answer)

        assert len(seen_reply_to) == 1  # one name per channel
        (name,) = seen_reply_to
        deadline = time.monotonic() + WAIT
        while len(replies) < 3:
            assert time.monotonic() < deadline, f"replies: {replies}"
            client.process_data_events(time_limit=0.1)
        assert replies == [("", name, f"pong {i}".encode(), f"c{i}") for i in range(3)]
    finally:
        server.close()
        client.close()


def closed_with(fn: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        fn()
    return info.value.reply_code, info.value.reply_text


def test_direct_reply_to_refusals(target: Target) -> None:
    conn = target.pika()
    try:
        ch = conn.channel()
        # the pseudo-queue is there to a passive declare
        assert ch.queue_declare(PSEUDO, passive=True).method.queue == PSEUDO
        # a reply consumer cannot acknowledge
        code, text = closed_with(lambda: ch.basic_consume(PSEUDO, lambda *a: None))
        assert (code, "reply consumer cannot acknowledge" in text) == (406, True)

        # a request naming amq.rabbitmq.reply-to needs a reply consumer on its channel
        ch = conn.channel()
        ch.basic_publish("", unique("nobody"), b"x", pika.BasicProperties(reply_to=PSEUDO))
        code, text = closed_with(lambda: ch.queue_declare(unique("after")))
        assert (code, "fast reply consumer does not exist" in text) == (406, True)

        # one reply consumer per channel
        ch = conn.channel()
        ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=True)
        code, _ = closed_with(lambda: ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=True))
        assert code == 406

        # a channel can consume again once it cancelled its reply consumer
        ch = conn.channel()
        tag = ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=True)
        ch.basic_cancel(tag)
        ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=True)
    finally:
        conn.close()


def test_aio_pika_rpc_through_direct_reply_to(target: Target) -> None:
    async def run() -> list[tuple[bytes, str | None]]:
        server = await aio_pika.connect(target.url(), timeout=10)
        client = await aio_pika.connect(target.url(), timeout=10)
        async with server, client:
            sch = await server.channel()
            requests = await sch.declare_queue(unique("rpc"), auto_delete=True)

            async def respond(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    assert message.reply_to is not None
                    await sch.default_exchange.publish(
                        aio_pika.Message(
                            message.body.upper(), correlation_id=message.correlation_id
                        ),
                        routing_key=message.reply_to,
                    )

            await requests.consume(respond)

            cch = await client.channel()
            callback = await cch.get_queue(PSEUDO)  # a passive declare
            got: list[tuple[bytes, str | None]] = []
            done = asyncio.get_running_loop().create_future()

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                got.append((message.body, message.correlation_id))
                if len(got) == 2 and not done.done():
                    done.set_result(None)

            await callback.consume(on_reply, no_ack=True)
            for i, body in enumerate((b"hello", b"world")):
                await cch.default_exchange.publish(
                    aio_pika.Message(body, correlation_id=str(i), reply_to=PSEUDO),
                    routing_key=requests.name,
                )
            await asyncio.wait_for(done, WAIT)
            return got

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [(b"HELLO", "0"), (b"WORLD", "1")]


def test_a_reply_to_a_requester_that_is_gone_is_dropped(target: Target) -> None:
    requester, responder = target.pika(), target.pika()
    try:
        ch = requester.channel()
        ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=True)
        rpc = unique("rpc")
        rch = responder.channel()
        rch.queue_declare(rpc, auto_delete=False)
        ch.basic_publish("", rpc, b"q", pika.BasicProperties(reply_to=PSEUDO))
        deadline = time.monotonic() + WAIT
        while True:
            method, props, _ = rch.basic_get(rpc, auto_ack=True)
            if method is not None:
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
        requester.close()
        rch.confirm_delivery()
        rch.basic_publish("", props.reply_to, b"late")  # dropped; the channel stays open
        with pytest.raises(pika.exceptions.UnroutableError):
            rch.basic_publish("", props.reply_to, b"late", mandatory=True)
        rch.queue_delete(rpc)
    finally:
        if requester.is_open:
            requester.close()
        responder.close()
