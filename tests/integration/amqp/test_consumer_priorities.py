"""Consumer priorities (``x-priority`` in basic.consume, issue 16 point 13) with pika and
aio-pika (with update-secret, the point's other half), each test against polymq and
RabbitMQ: a queue's messages go to its consumers of the highest priority while they have
room in their prefetch window; lower ones get what they cannot take."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest

from .helpers import QUIET, WAIT, Target, unique

pytestmark = pytest.mark.timeout(90)


def test_the_highest_priority_with_room_gets_the_messages(target: Target) -> None:
    conn = target.pika()
    try:
        q = unique("cprio")
        setup = conn.channel()
        setup.queue_declare(q, auto_delete=True)
        got: dict[str, list[bytes]] = {"high": [], "low": [], "default": []}
        channels = {}
        for name, prefetch, args in (
            ("low", 100, {"x-priority": -5}),
            ("high", 2, {"x-priority": 10}),
            ("default", 100, None),
        ):
            ch = conn.channel()
            ch.basic_qos(prefetch_count=prefetch)

            def on_message(_ch, method, _props, body, name=name):  # type: ignore[no-untyped-def]
                got[name].append(body)

            ch.basic_consume(q, on_message, arguments=args)
            channels[name] = ch

        def publish(bodies: range) -> None:
            for i in bodies:
                setup.basic_publish("", q, str(i).encode())

        def settle(total: int) -> None:
            deadline = time.monotonic() + WAIT
            while sum(map(len, got.values())) < total:
                assert time.monotonic() < deadline, got
                conn.process_data_events(time_limit=0.05)
            conn.process_data_events(time_limit=QUIET)  # and nothing more

        publish(range(6))
        settle(6)
        # high takes 2 (its window), then the default priority 0 gets the rest; -5 nothing
        assert got == {"high": [b"0", b"1"], "default": [b"2", b"3", b"4", b"5"], "low": []}
        channels["high"].basic_ack(0, multiple=True)  # room at the top again
        conn.process_data_events(time_limit=0.2)
        publish(range(6, 8))
        settle(8)
        assert got["high"] == [b"0", b"1", b"6", b"7"] and got["low"] == []
    finally:
        conn.close()


def test_x_priority_must_be_an_integer(target: Target) -> None:
    conn = target.pika()
    try:
        ch = conn.channel()
        q = unique("cprio")
        ch.queue_declare(q, auto_delete=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_consume(q, lambda *a: None, arguments={"x-priority": "high"})
        assert info.value.reply_code == 406
    finally:
        conn.close()


def test_aio_pika_consumer_priorities_and_update_secret(target: Target) -> None:
    async def run() -> dict[str, list[bytes]]:
        conn = await aio_pika.connect(target.url(), timeout=10)
        async with conn:
            got: dict[str, list[bytes]] = {"high": [], "low": []}
            setup = await conn.channel()
            q = await setup.declare_queue(unique("cprio"), exclusive=True)
            for name, priority in (("low", 1), ("high", 7)):
                ch = await conn.channel()
                await ch.set_qos(prefetch_count=2)
                queue = await ch.get_queue(q.name)

                async def on_message(
                    message: aio_pika.abc.AbstractIncomingMessage, name: str = name
                ) -> None:
                    got[name].append(message.body)  # never acked: the windows stay full

                await queue.consume(on_message, arguments={"x-priority": priority})
            await conn.update_secret("guest", reason="token refresh")
            for i in range(5):
                await setup.default_exchange.publish(aio_pika.Message(str(i).encode()), q.name)
            deadline = asyncio.get_running_loop().time() + WAIT
            while sum(map(len, got.values())) < 4:
                assert asyncio.get_running_loop().time() < deadline, got
                await asyncio.sleep(0.02)
            await asyncio.sleep(QUIET)
            return got

    # high's window (2) first, then low's (2); the fifth waits for an ack
    assert asyncio.run(asyncio.wait_for(run(), 60)) == {"high": [b"0", b"1"], "low": [b"2", b"3"]}
