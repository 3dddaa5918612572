"""A consumer that stops reading is cut off by the core, the queue does not wait for it, and
no message is lost: what it never got goes to the others."""

from __future__ import annotations

import asyncio
import struct
import time
import urllib.request

import pytest

from polymq import Message

from ...procs import PolymqProcess
from .helpers import DELIVER, GOODBYE, OK, RawConn, collect, connect, eventually, uid

N = 200_000
BATCH = 1000


@pytest.mark.timeout(150)
async def test_slow_consumer_is_cut_and_the_fast_one_gets_everything_else(
    core: PolymqProcess,
) -> None:
    q = f"queue/{uid()}"
    port = core.ports["core"]
    admin = await connect(port)
    fast = await connect(port)
    producer = await connect(port)

    # The slow one: a raw socket with a small receive window that reads nothing after its Ok.
    slow = await RawConn.open(port, rcvbuf=4096)
    await slow.handshake([14, 2, 1, q, {"ack_mode": "auto", "buffer_messages": 100}])
    await slow.until(lambda r: r.of(OK))
    # The fast one shares this loop with the producer and may lag behind it for a moment on
    # a busy box: it gets room for that, so only the slow one is at risk.
    fsub = await fast.subscribe(q, ack_mode="auto", buffer_messages=10_000_000)
    assert (await admin.stats(q)).subscribers == 2

    fast_got: list[int] = []
    fast_times: list[float] = []

    async def consume_fast() -> None:
        async for d in fsub:
            fast_got.append(struct.unpack(">I", d.message.body)[0])
            if len(fast_got) % 1000 == 0:
                fast_times.append(time.monotonic())

    async def produce() -> None:
        for start in range(0, N, BATCH):
            await producer.publish(
                q, [Message(struct.pack(">I", i)) for i in range(start, start + BATCH)]
            )
            # stay within reach of the fast consumer
            await eventually(lambda s=start: s - len(fast_got) <= 60_000, within=60, interval=0.005)

    async def one_subscriber_left() -> bool:
        return (await admin.stats(q)).subscribers == 1

    consumer = asyncio.ensure_future(consume_fast())
    cut = asyncio.ensure_future(eventually(one_subscriber_left, within=120, interval=0.05))
    t0 = time.monotonic()
    await produce()
    await asyncio.wait_for(cut, 60)  # the core cut the slow one off, and only it
    t_cut = time.monotonic()

    # What was the slow socket sent? Read it all now, up to the core's close.
    r = await slow.read_to_eof(30)
    slow.close()
    slow_got = [struct.unpack(">I", m[0])[0] for op in r.of(DELIVER) for m in op[3]]
    goodbyes = r.of(GOODBYE)

    # The fast one finishes everything else: its rate did not collapse after the cut.
    await eventually(lambda: len(fast_got) + len(slow_got) >= N, within=60, interval=0.05)
    t_end = time.monotonic()
    await asyncio.sleep(0.3)  # and nothing arrives twice
    consumer.cancel()
    print(
        f"slow got {len(slow_got)} (+{r.truncated} bytes of a cut frame), fast {len(fast_got)};"
        f" cut seen at {t_cut - t0:.1f}s, all received at {t_end - t0:.1f}s; goodbye {goodbyes}"
    )
    assert len(slow_got) > 100, "the slow consumer never got going: not a test of the cut"
    assert len(fast_got) > N // 2
    # nothing lost, nothing twice: every message went to exactly one of them
    assert sorted(fast_got + slow_got) == list(range(N))
    assert r.truncated == 0, "the slow consumer was sent a frame it could not finish reading"
    assert [op[1] for op in goodbyes] == ["slow-consumer"]
    assert r.ops[-1][0] == GOODBYE  # said last, before the close
    st = await admin.stats(q)
    assert (st.messages, st.in_flight, st.subscribers) == (0, 0, 1)
    assert not fast.closed
    for c in (admin, fast, producer):
        await c.close()


@pytest.mark.timeout(120)
async def test_slow_topic_subscribers_are_cut_or_dropped_by_their_policy(
    core: PolymqProcess,
) -> None:
    name = uid()
    t = f"topic/{name}"
    n = 100_000
    port = core.ports["core"]
    admin = await connect(port)
    fast = await connect(port)
    cut = await RawConn.open(port, rcvbuf=4096)
    await cut.handshake([14, 2, 1, t, {"buffer_messages": 100, "slow_policy": "disconnect"}])
    await cut.until(lambda r: r.of(OK))
    dropper = await RawConn.open(port, rcvbuf=4096)
    await dropper.handshake([14, 2, 1, t, {"buffer_messages": 100, "slow_policy": "drop"}])
    await dropper.until(lambda r: r.of(OK))
    fsub = await fast.subscribe(t, buffer_messages=10_000_000)
    assert (await admin.stats(t)).subscribers == 3

    fast_got: list[int] = []

    async def consume_fast() -> None:
        async for d in fsub:
            fast_got.append(struct.unpack(">I", d.message.body)[0])

    consumer = asyncio.ensure_future(consume_fast())
    for start in range(0, n, BATCH):
        await admin.publish(t, [Message(struct.pack(">I", i)) for i in range(start, start + BATCH)])
        await eventually(lambda s=start: s - len(fast_got) <= 30_000, within=60, interval=0.005)
    await eventually(lambda: len(fast_got) >= n, within=60)
    consumer.cancel()
    assert fast_got == list(range(n))  # the fast one lost nothing, in order

    r = await cut.read_to_eof(30)  # cut off, told why, last
    cut.close()
    assert [op[1] for op in r.of(GOODBYE)] == ["slow-consumer"]
    assert r.ops[-1][0] == GOODBYE
    got_cut = [struct.unpack(">I", m[0])[0] for op in r.of(DELIVER) for m in op[3]]
    assert 0 < len(got_cut) < n and got_cut == list(range(len(got_cut)))
    metrics = await asyncio.to_thread(_get, f"{core.url('admin')}/metrics")
    assert 'polymq_slow_consumers_total{policy="disconnect"} 1.0' in metrics  # one cut, once

    assert (await admin.stats(t)).subscribers == 2  # the dropping one is still subscribed
    await dropper.drain(quiet=0.5)  # it reads again: what it was sent, while it was slow
    await admin.publish(t, struct.pack(">I", n))  # and news reach it again
    got: list[int] = []

    def has_last(rd: object) -> bool:
        got[:] = [struct.unpack(">I", m[0])[0] for op in dropper.reader.of(DELIVER) for m in op[3]]
        return bool(got) and got[-1] == n

    await dropper.until(has_last, within=30)
    dropper.close()
    assert not dropper.reader.of(GOODBYE)
    assert len(got) < n and got == sorted(got)  # some dropped, the rest in order
    for c in (admin, fast):
        await c.close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


@pytest.mark.timeout(90)
async def test_cutting_a_slow_consumer_loses_no_persistent_message_across_a_crash(
    core: PolymqProcess,
) -> None:
    q = f"queue/{uid()}"
    n = 5000
    pad = b"p" * 1020  # ~1 KiB messages: the socket buffers fill after a few thousand
    port = core.ports["core"]
    async with await connect(port) as producer:
        await producer.declare(q, durable=True)
        slow = await RawConn.open(port, rcvbuf=4096)
        await slow.handshake([14, 2, 1, q, {"buffer_messages": 100}])
        await slow.until(lambda r: r.of(OK))
        for start in range(0, n, 500):
            await producer.publish(
                q,
                [
                    Message(struct.pack(">I", i) + pad, persistent=True)
                    for i in range(start, start + 500)
                ],
            )

        async def no_subscriber() -> bool:
            return (await producer.stats(q)).subscribers == 0

        await eventually(no_subscriber, within=30)
        r = await slow.read_to_eof(30)
        slow.close()
        slow_got = [struct.unpack(">I", m[0][:4])[0] for op in r.of(DELIVER) for m in op[3]]
        assert 0 < len(slow_got) < n
        assert (await producer.stats(q)).messages == n - len(slow_got)
        await asyncio.sleep(0.5)  # let the store catch up with what the slow one was sent
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        left = (await c.stats(q)).messages
        sub = await c.subscribe(q)
        after = [struct.unpack(">I", d.message.body[:4])[0] for d in await collect(sub, left)]
    assert sorted(slow_got + after) == list(range(n))  # each exactly once, none lost
