"""The client's heartbeat (:mod:`polymq.heartbeat`), against fake cores served in this
process (:mod:`.fakecores`): a core that keeps the connection open and says nothing (as one
stopped with ``SIGSTOP``) is pinged, then taken as lost: with failover the client moves to
the next address and what was pending is answered there; without, the client is closed
with code ``heartbeat``. A core that answers pings, or that says ``Ok`` for request 0 while
it does not read, is kept."""

from __future__ import annotations

import asyncio

import pytest

from polymq import Client, ConnectionClosed, Reconnected
from polymq.events import Event, Ok, Ping, Publish

from .fakecores import HOST, A, B, Cores, address, answer_all, until

BEAT = 0.2  # seconds of heartbeat: small, so that the tests are quick


async def test_a_frozen_core_is_left_for_the_next_address(cores: Cores) -> None:
    events: list[Reconnected] = []
    client = await Client.connect(
        [address(A), address(B)], heartbeat=BEAT, on_reconnect=events.append
    )
    try:
        a = cores.last(A)
        a.frozen = True
        publishing = asyncio.ensure_future(client.publish("queue/q", b"x"))
        published = await asyncio.wait_for(publishing, 10)  # answered by B
        assert published.count == 1
        assert a.of(Ping), "no ping went to the silent core"
        assert a.of(Publish)  # (it went there first: the core took it and said nothing)
        [event] = events
        assert (event.previous, event.address) == (address(A), address(B))
        assert "heartbeat" in event.reason and event.resent == 1
        assert str(client.address) == address(B) and not client.closed
    finally:
        await client.close()


async def test_without_failover_a_frozen_core_closes_the_client(cores: Cores) -> None:
    client = await Client.connect(HOST, A, heartbeat=BEAT)
    assert client.reconnect_timeout is None
    cores.last(A).frozen = True
    publishing = asyncio.ensure_future(client.publish("queue/q", b"x"))
    with pytest.raises(ConnectionClosed, match=r"sent nothing for 0\.2 s after a ping") as info:
        await asyncio.wait_for(publishing, 10)
    assert info.value.code == "heartbeat"
    assert client.closed and not cores.made[B]


async def test_a_core_that_answers_pings_is_kept(cores: Cores) -> None:
    client = await Client.connect([address(A), address(B)], heartbeat=BEAT / 4)
    try:
        heartbeat = client.heartbeat
        assert heartbeat is not None
        a = cores.last(A)
        await until(lambda: len(a.of(Ping)) >= 10, "ten pings answered", within=30)
        assert client.reconnects == 0 and not cores.made[B] and not client.closed
        assert heartbeat.pings >= 10
    finally:
        await client.close()


async def test_a_word_for_no_request_counts_as_the_core_alive(cores: Cores) -> None:
    """A core that does not read the connection (a resource alarm holds the publisher)
    answers no ping, but says ``Ok`` for request 0 now and then: the client stays, and
    that ``Ok`` answers nothing it waits for."""

    def nothing(ev: Event) -> object:
        return None

    cores.answers[A] = nothing
    client = await Client.connect([address(A), address(B)], heartbeat=BEAT / 4)
    a = cores.last(A)
    stop = asyncio.Event()

    async def say_words() -> None:
        while not stop.is_set():
            a.send(Ok(0, None))
            await asyncio.sleep(BEAT / 16)

    words = asyncio.ensure_future(say_words())
    try:
        waiting = asyncio.ensure_future(client.publish("queue/q", b"held"))
        await until(lambda: len(a.of(Publish)) == 1, "the publish reaches A")
        await asyncio.sleep(BEAT * 2)  # (eight heartbeat intervals)
        assert client.reconnects == 0 and not cores.made[B]
        assert not waiting.done()  # the Ok for request 0 answered nothing
        stop.set()
        await words
        cores.answers[A] = answer_all
        waiting.cancel()
    finally:
        stop.set()
        await client.close()


async def test_the_defaults_and_bad_values(cores: Cores) -> None:
    with pytest.raises(ValueError, match="heartbeat must be a positive"):
        await Client.connect(HOST, A, heartbeat=0)
    async with await Client.connect([address(A), address(B)]) as failing_over:
        assert failing_over.heartbeat is not None and failing_over.heartbeat.interval == 5.0
    async with await Client.connect(HOST, A) as alone:
        assert alone.heartbeat is not None and alone.heartbeat.interval == 30.0
    async with await Client.connect(HOST, A, heartbeat=None) as unwatched:
        assert unwatched.heartbeat is None
