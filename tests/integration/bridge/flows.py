"""Paced producers and draining consumers on both sides, for the bridge's fault tests.

Producers retry what was not confirmed when their broker goes away (so a source may hold a
message twice, never lose one); consumers count distinct ids, and how many copies came.
"""

from __future__ import annotations

import asyncio
import collections
import time

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from polymq import Client, Message


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(n)]


async def produce_polymq(
    port: int,
    dest: str,
    keys: list[str],
    *,
    batch: int = 20,
    pause: float = 0.04,
    hold: asyncio.Event | None = None,
) -> int:
    """Persistent messages with ``id`` headers, ``batch`` per publish; a batch without its
    receipt (the core went away) is published again after reconnecting. With ``hold``, the
    producer stops halfway until it is set (so a fault made meanwhile is mid-stream).
    Returns retries: batches published again, and connections found closed by the core
    (while the producer waits on ``hold``, the core's restart closes its connection)."""
    retries = 0
    i = 0
    client: Client | None = None
    try:
        while i < len(keys):
            if hold is not None and i >= len(keys) // 2:
                await hold.wait()
            try:
                if client is not None and client.closed:  # the core went away meanwhile
                    retries += 1
                    await client.close()
                    client = None
                if client is None:
                    client = await Client.connect("127.0.0.1", port, timeout=2)
                chunk = keys[i : i + batch]
                msgs = [Message(k.encode(), headers={"id": k}, persistent=True) for k in chunk]
                await asyncio.wait_for(client.publish(dest, msgs), 10)
                i += len(chunk)
                await asyncio.sleep(pause)
            except Exception:  # the core went away (or did not answer): retry the batch
                retries += 1
                if client is not None:
                    await client.close()
                    client = None
                await asyncio.sleep(0.2)
    finally:
        if client is not None:
            await client.close()
    return retries


async def produce_rabbit(
    url: str, queue: str, keys: list[str], *, batch: int = 20, pause: float = 0.04
) -> int:
    """Persistent messages with ``message_id`` set, published with confirms; a batch not
    confirmed (RabbitMQ went away) is published again after reconnecting. Returns retries."""
    retries = 0
    i = 0
    conn: aio_pika.abc.AbstractConnection | None = None
    try:
        while i < len(keys):
            try:
                if conn is None or conn.is_closed:
                    conn = await aio_pika.connect(url, timeout=2)
                    ch = await conn.channel(publisher_confirms=True)
                chunk = keys[i : i + batch]
                await asyncio.wait_for(
                    asyncio.gather(
                        *(
                            ch.default_exchange.publish(
                                aio_pika.Message(
                                    k.encode(),
                                    message_id=k,
                                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                ),
                                routing_key=queue,
                            )
                            for k in chunk
                        )
                    ),
                    10,
                )
                i += len(chunk)
                await asyncio.sleep(pause)
            except Exception:
                retries += 1
                if conn is not None:
                    try:
                        await asyncio.wait_for(conn.close(), 2)
                    except Exception:
                        pass
                    conn = None
                await asyncio.sleep(0.2)
    finally:
        if conn is not None and not conn.is_closed:
            await conn.close()
    return retries


async def drain_rabbit(
    url: str, queue: str, expected: set[str], within: float = 60.0, quiet: float = 0.5
) -> collections.Counter[str]:
    """Consume until every expected id came (then ``quiet`` more seconds for stragglers)."""
    seen: collections.Counter[str] = collections.Counter()
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=500)
        q = await ch.get_queue(queue)
        done = asyncio.Event()

        async def on_message(m: AbstractIncomingMessage) -> None:
            seen[m.body.decode()] += 1
            await m.ack()
            if expected <= seen.keys():
                done.set()

        tag = await q.consume(on_message)
        try:
            await asyncio.wait_for(done.wait(), within)
        except TimeoutError:
            pass
        await asyncio.sleep(quiet)
        await q.cancel(tag)
    return seen


async def drain_polymq(
    port: int, dest: str, expected: set[str], within: float = 60.0, quiet: float = 0.5
) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + within
    async with await Client.connect("127.0.0.1", port) as c:
        async with await c.subscribe(dest, ack_mode="client-individual", prefetch=1000) as sub:
            while True:
                wait = quiet if expected <= seen.keys() else deadline - time.monotonic()
                if wait <= 0:
                    break
                try:
                    d = await sub.get(wait)
                except TimeoutError:
                    break
                seen[d.message.headers.get("amqp-message-id") or d.message.body.decode()] += 1
                d.ack()
    return seen


def report(name: str, expected: set[str], seen: collections.Counter[str]) -> str:
    missing = sorted(expected - seen.keys())
    dups = sum(n - 1 for n in seen.values() if n > 1)
    line = (
        f"{name}: {len(expected)} sent, {len(seen.keys() & expected)} distinct arrived, "
        f"{len(missing)} missing, {dups} duplicates"
    )
    print(line)
    assert not missing, f"{line}; first missing: {missing[:10]}"
    assert not (seen.keys() - expected), f"{name}: unexpected ids {sorted(seen)[:5]}"
    return line
