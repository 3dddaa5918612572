"""The client's failover, against fake cores served in this process (:mod:`.fakecores`):
a ``Goodbye`` ``shutdown`` sends the client to the next address, where it subscribes again
(a stream from the entry after the last delivered, or, none delivered, from the seq the
core said it started at), sends the unanswered publish again with the same batch id, answers
what belonged to the lost connection itself, and reports a ``Reconnected``; when no
address takes it within ``reconnect_timeout``, what is pending fails with
``ConnectionClosed``; without failover a Goodbye ends the client, as it always did."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from polymq import Client, ConnectionClosed, Message, Reconnected
from polymq.events import Ack, Deliver, Event, Hello, Ok, Publish, Subscribe, Unsubscribe

from .fakecores import HOST, A, B, Cores, address, answer_but_publishes, until


async def test_a_goodbye_sends_the_client_to_the_next_address_where_it_goes_on(
    cores: Cores,
) -> None:
    cores.answers[A] = answer_but_publishes  # the publish in flight when A goes
    events: list[Reconnected] = []
    client = await Client.connect([address(A), address(B)], on_reconnect=events.append)
    try:
        a = cores.last(A)
        assert client.server == "core-65101" and str(client.address) == address(A)
        reader = await client.subscribe("stream/s", offset="first")
        a.send(Deliver(1, [1, 2], [Message(b"one", seq=1), Message(b"two", seq=2)]))
        first, second = await reader.get(5), await reader.get(5)
        first.ack()
        publishing = asyncio.ensure_future(client.publish("queue/q", b"hello", persistent=True))
        await until(lambda: a.of(Publish) and a.of(Ack), "the publish and the ack reach A")
        [sent] = a.of(Publish)
        assert isinstance(sent, Publish) and sent.batch_id  # a batch id of its own

        a.say_goodbye("shutdown", "node shutting down: reconnect (to another node)")
        published = await asyncio.wait_for(publishing, 5)  # no error: answered by B

        b = cores.last(B)
        assert [type(e) for e in b.got] == [Hello, Subscribe, Publish]
        _, resub, again = b.got
        assert isinstance(resub, Subscribe) and isinstance(again, Publish)
        # the stream read on after the last entry delivered, under the same subscription
        assert (resub.sid, resub.destination, resub.options) == (1, "stream/s", {"offset": 3})
        assert (again.batch_id, again.batch_ttl) == (sent.batch_id, sent.batch_ttl)
        assert again.messages == sent.messages
        assert published.count == 1
        assert client.server == "core-65102" and str(client.address) == address(B)
        [event] = events
        assert (event.previous, event.address) == (address(A), address(B))
        assert (event.resubscribed, event.resent) == (1, 1)
        assert "shutdown" in event.reason and client.reconnects == 1

        # deliveries go on; an ack of one the lost connection delivered is not sent to B
        b.send(Deliver(1, [1], [Message(b"three", seq=3)]))
        third = await reader.get(5)
        assert third.message.body == b"three" and third.tag != 1
        second.ack()
        third.ack()
        await until(lambda: b.of(Ack), "the ack reaches B")
        [ack] = b.of(Ack)
        assert isinstance(ack, Ack) and ack.tags == [1]
    finally:
        await client.close()


async def test_acks_and_unsubscribes_pending_when_the_connection_goes_are_answered(
    cores: Cores,
) -> None:
    """Nothing is left to ack or to leave on the new connection: those are answered at
    once, and the subscription left is not made again."""
    cores.answers[A] = lambda ev: None if isinstance(ev, Ack | Unsubscribe) else True
    client = await Client.connect([address(A), address(B)])
    try:
        a = cores.last(A)
        sub = await client.subscribe("queue/q", ack_mode="client")
        a.send(Deliver(1, [1], [Message(b"x")]))
        d = await sub.get(5)
        acking = asyncio.ensure_future(sub.ack_many([d.tag]))
        leaving = asyncio.ensure_future(sub.unsubscribe())
        await until(lambda: a.of(Ack) and a.of(Unsubscribe), "the ack and unsubscribe reach A")
        a.say_goodbye("shutdown", "bye")
        assert await asyncio.wait_for(acking, 5) == 0
        await asyncio.wait_for(leaving, 5)
        await until(lambda: client.reconnects == 1, "the failover")
        assert [type(e) for e in cores.last(B).got] == [Hello]
    finally:
        await client.close()


async def test_when_no_address_takes_it_in_time_pending_calls_fail(cores: Cores) -> None:
    cores.answers[A] = answer_but_publishes
    client = await Client.connect([address(A), address(B)], reconnect_timeout=0.5)
    sub = await client.subscribe("queue/q")
    publishing = asyncio.ensure_future(client.publish("queue/q", b"x"))
    await until(lambda: cores.last(A).of(Publish), "the publish reaches A")
    cores.refusing |= {A, B}
    cores.last(A).say_goodbye("shutdown", "bye")
    with pytest.raises(ConnectionClosed, match=r"no polymq core took the connection within 0\.5 s"):
        await asyncio.wait_for(publishing, 5)
    with pytest.raises(ConnectionClosed):
        await sub.get(1)
    assert client.closed
    assert len(cores.made[B]) >= 2  # it went round, with back-off, until the time was up


async def test_the_first_address_refusing_the_client_connects_to_the_next(cores: Cores) -> None:
    cores.refusing.add(A)
    async with await Client.connect([address(A), address(B)]) as client:
        assert client.server == "core-65102"
        await client.ping()


async def test_no_address_taking_it_at_connect_is_an_error_naming_each(cores: Cores) -> None:
    cores.refusing |= {A, B}
    with pytest.raises(ConnectionClosed, match=r"65101: .*not now.*; 127\.0\.0\.1:65102: "):
        await Client.connect([address(A), address(B)])


async def test_without_failover_a_goodbye_still_ends_the_client(cores: Cores) -> None:
    cores.answers[A] = answer_but_publishes
    client = await Client.connect(HOST, A)
    assert client.reconnect_timeout is None
    publishing = asyncio.ensure_future(client.publish("queue/q", b"x"))
    await until(lambda: cores.last(A).of(Publish), "the publish reaches A")
    [sent] = cores.last(A).of(Publish)
    assert isinstance(sent, Publish) and sent.batch_id is None  # none added
    cores.last(A).say_goodbye("shutdown", "bye")
    with pytest.raises(ConnectionClosed, match=r"\(shutdown\)"):
        await asyncio.wait_for(publishing, 5)
    assert client.closed and not cores.made[B]


def answer_stream_start(seq: int) -> Callable[[Event], object]:
    """Answers as a core does: a stream's subscribe with the seq it reads first."""

    def answer(ev: Event) -> object:
        if isinstance(ev, Subscribe) and ev.destination.startswith("stream/"):
            return {"sid": ev.sid, "destination": ev.destination, "seq": seq}
        return True

    return answer


async def test_a_stream_given_nothing_yet_goes_on_from_where_the_core_said_it_started(
    cores: Cores,
) -> None:
    """Subscribed at ``next``, answered "seq 7", nothing delivered: after the failover it
    subscribes at 7 (what was appended meanwhile is delivered), not at ``next`` again; the
    new core's answer is taken too (a second failover goes on from there)."""
    cores.answers[A] = answer_stream_start(7)
    cores.answers[B] = answer_stream_start(7)
    client = await Client.connect([address(A), address(B)])
    try:
        sub = await client.subscribe("stream/s", offset="next")
        cores.last(A).say_goodbye("shutdown", "bye")
        await until(lambda: cores.made[B] and cores.last(B).of(Subscribe), "the resubscribe")
        [again] = cores.last(B).of(Subscribe)
        assert isinstance(again, Subscribe)
        assert again.options == {"offset": 7}
        assert sub.options == {"offset": "next"}  # (as subscribed: what the caller asked)
    finally:
        await client.close()


async def test_a_stream_answered_without_a_seq_subscribes_again_as_it_was(
    cores: Cores,
) -> None:
    """An older core does not say where a stream subscription starts: with nothing
    delivered, it is made again at the offset first asked for, as before."""
    client = await Client.connect([address(A), address(B)])
    try:
        await client.subscribe("stream/s", offset="last")
        cores.last(A).say_goodbye("shutdown", "bye")
        await until(lambda: cores.made[B] and cores.last(B).of(Subscribe), "the resubscribe")
        [again] = cores.last(B).of(Subscribe)
        assert isinstance(again, Subscribe) and again.options == {"offset": "last"}
    finally:
        await client.close()


async def test_deliveries_before_the_answer_keep_the_later_position(cores: Cores) -> None:
    """The core may deliver before it answers the subscribe (both in one frame): the
    answer's start seq does not take the client back behind what it was given."""
    cores.answers[A] = lambda ev: None if isinstance(ev, Subscribe) else True
    client = await Client.connect([address(A), address(B)])
    try:
        a = cores.last(A)
        subscribing = asyncio.ensure_future(client.subscribe("stream/s", offset="first"))
        await until(lambda: a.of(Subscribe), "the subscribe reaches A")
        [made] = a.of(Subscribe)
        assert isinstance(made, Subscribe)
        a.send(Deliver(1, [1, 2], [Message(b"a", seq=5), Message(b"b", seq=6)]))
        a.send(Ok(made.rid, {"sid": 1, "destination": "stream/s", "seq": 5}))
        sub = await asyncio.wait_for(subscribing, 5)
        assert [(await sub.get(5)).message.seq for _ in range(2)] == [5, 6]
        a.say_goodbye("shutdown", "bye")
        await until(lambda: cores.made[B] and cores.last(B).of(Subscribe), "the resubscribe")
        [again] = cores.last(B).of(Subscribe)
        assert isinstance(again, Subscribe) and again.options == {"offset": 7}
    finally:
        await client.close()
