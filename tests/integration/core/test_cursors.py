"""Cursor subscriptions: kept by the core, polled with a cursor from any connection."""

from __future__ import annotations

import asyncio
import time

import pytest

from polymq import BadRequest, Client, CursorPage, Gone, Message, NotFound

from ...procs import PolymqProcess
from .helpers import connect, uid


@pytest.fixture(scope="module")
def core(module_core: PolymqProcess) -> PolymqProcess:
    """One core for the module's tests: each uses destinations of its own; a test that kills
    its core takes ``fresh_core``."""
    return module_core


def _bodies(page: CursorPage) -> list[bytes]:
    return [m.body for m in page.messages]


async def test_topic_cursor_confirms_by_cursor_from_any_connection(core: PolymqProcess) -> None:
    a = await connect(core.ports["core"])
    b = await connect(core.ports["core"])
    try:
        t = f"topic/{uid()}"
        sub = await a.cursor_open(t)
        await a.publish(t, [Message(str(i).encode()) for i in range(5)])
        r = await a.cursor_poll(sub.id, sub.cursor, max=3)
        assert _bodies(r) == [b"0", b"1", b"2"] and r.cursor == 3
        # The answer "was lost": the same cursor again gives the same messages...
        again = await b.cursor_poll(sub.id, sub.cursor, max=3)
        assert _bodies(again) == [b"0", b"1", b"2"]
        # ...and presenting cursor 3, from another connection, confirms them.
        r = await b.cursor_poll(sub.id, 3, max=10)
        assert _bodies(r) == [b"3", b"4"] and r.cursor == 5
        with pytest.raises(Gone):
            await a.cursor_poll(sub.id, 2)  # confirmed and dropped
        assert (await a.cursor_poll(sub.id, 5)).messages == []
    finally:
        await a.close()
        await b.close()


async def test_topic_cursor_overflow_drops_the_oldest(client: Client) -> None:
    t = f"topic/{uid()}"
    sub = await client.cursor_open(t, buffer=3)
    await client.publish(t, [Message(str(i).encode()) for i in range(5)])
    with pytest.raises(Gone):
        await client.cursor_poll(sub.id, 0)
    r = await client.cursor_poll(sub.id, None)
    assert _bodies(r) == [b"2", b"3", b"4"] and r.cursor == 5


async def test_stream_cursor_reads_from_its_offset(client: Client) -> None:
    s = f"stream/{uid()}"
    await client.publish(s, [Message(str(i).encode()) for i in range(3)])
    sub = await client.cursor_open(s, offset="first")
    r = await client.cursor_poll(sub.id, sub.cursor)
    assert _bodies(r) == [b"0", b"1", b"2"] and r.cursor == 3
    nxt = await client.cursor_open(s)  # "next": only what comes later
    await client.publish(s, b"3")
    assert _bodies(await client.cursor_poll(nxt.id, nxt.cursor)) == [b"3"]


async def test_queue_cursor_leases_and_redelivers(client: Client) -> None:
    q = f"queue/{uid()}"
    sub = await client.cursor_open(q, visibility=0.5)
    await client.publish(q, [Message(b"a"), Message(b"b")])
    r = await client.cursor_poll(sub.id, None, max=10)
    assert _bodies(r) == [b"a", b"b"] and all(r.receipts)
    await client.settle([r.receipts[0]])  # a acked; b's lease runs out
    await asyncio.sleep(0.8)
    r = await client.cursor_poll(sub.id, None, max=10)
    assert _bodies(r) == [b"b"] and r.messages[0].delivery_count == 2


async def test_a_waiting_poll_returns_when_a_message_comes(core: PolymqProcess) -> None:
    a = await connect(core.ports["core"])
    b = await connect(core.ports["core"])
    try:
        for dest in (f"topic/{uid()}", f"stream/{uid()}", f"queue/{uid()}"):
            sub = await a.cursor_open(dest)
            t0 = time.monotonic()
            poll = asyncio.ensure_future(a.cursor_poll(sub.id, sub.cursor, wait=10))
            await asyncio.sleep(0.2)
            await b.publish(dest, b"now")
            r = await asyncio.wait_for(poll, 5)
            assert _bodies(r) == [b"now"], dest
            assert time.monotonic() - t0 < 5
            t0 = time.monotonic()
            empty = await a.cursor_poll(sub.id, r.cursor, wait=0.3)
            assert empty.messages == [] and time.monotonic() - t0 >= 0.25
    finally:
        await a.close()
        await b.close()


async def test_idle_past_ttl_or_closed_is_not_found(client: Client) -> None:
    idle = await client.cursor_open(f"topic/{uid()}", ttl=1)
    closed = await client.cursor_open(f"topic/{uid()}")
    await client.cursor_close(closed.id)
    with pytest.raises(NotFound):
        await client.cursor_poll(closed.id, None)
    await asyncio.sleep(2.5)
    with pytest.raises(NotFound):
        await client.cursor_poll(idle.id, None)
    with pytest.raises(NotFound):
        await client.cursor_poll("no-such-id", None)


async def test_bad_cursor_arguments(client: Client) -> None:
    sub = await client.cursor_open(f"topic/{uid()}")
    for kwargs in ({"max": 0}, {"wait": 1000}):
        with pytest.raises(BadRequest):
            await client.cursor_poll(sub.id, None, **kwargs)
    with pytest.raises(BadRequest):
        await client.cursor_poll(sub.id, 99)  # ahead of the subscription
    with pytest.raises(BadRequest):
        await client.cursor_open(f"channel/{uid()}")
    with pytest.raises(BadRequest):
        await client.cursor_open(f"topic/{uid()}", ttl=0)


async def test_a_waiting_poll_keeps_its_subscription_alive(client: Client) -> None:
    for dest in (f"topic/{uid()}", f"queue/{uid()}"):
        sub = await client.cursor_open(dest, ttl=1)
        r = await client.cursor_poll(sub.id, sub.cursor, wait=3)  # longer than the ttl
        assert r.messages == []
        await client.publish(dest, b"still here")
        r = await client.cursor_poll(sub.id, r.cursor)
        assert [m.body for m in r.messages] == [b"still here"], dest


async def test_queue_and_stream_cursors_survive_kill_9_closed_and_idle_ones_do_not(
    fresh_core: PolymqProcess,
) -> None:
    """A queue's or stream's cursor subscription is stored with its destination once it is
    opened; closing it or its idle ttl removes it from the store too."""
    core = fresh_core
    s, q = f"stream/{uid()}", f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.publish(s, [Message(str(i).encode(), persistent=True) for i in range(3)])
        on_stream = await c.cursor_open(s, offset="first")
        r = await c.cursor_poll(on_stream.id, on_stream.cursor)
        assert _bodies(r) == [b"0", b"1", b"2"]
        await c.publish(s, Message(b"3", persistent=True))
        on_queue = await c.cursor_open(q, visibility=30)
        await c.publish(q, [Message(b"a", persistent=True), Message(b"b", persistent=True)])
        closed = await c.cursor_open(s)
        await c.cursor_close(closed.id)
        idle = await c.cursor_open(q, ttl=1)
        await asyncio.sleep(2.5)  # idle past its ttl: removed (and from the store)
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        assert _bodies(await c.cursor_poll(on_stream.id, r.cursor)) == [b"3"]
        from_start = await c.cursor_poll(on_stream.id, None)
        assert _bodies(from_start) == [b"0", b"1", b"2", b"3"]
        leased = await c.cursor_poll(on_queue.id, None, max=10)
        assert _bodies(leased) == [b"a", b"b"] and all(leased.receipts)
        for gone in (closed, idle):
            with pytest.raises(NotFound):
                await c.cursor_poll(gone.id, None)
        await c.cursor_close(on_stream.id)
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        with pytest.raises(NotFound):
            await c.cursor_poll(on_stream.id, None)
        assert _bodies(await c.cursor_poll(on_queue.id, None, max=10)) == [b"a", b"b"]
