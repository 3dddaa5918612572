"""The client's failover, against fake cores served in this process (``polymq.inproc``: no
sockets) that speak the wire protocol with the real codec: a ``Goodbye`` ``shutdown`` sends
the client to the next address, where it subscribes again (a stream from the entry after
the last delivered), sends the unanswered publish again with the same batch id, answers
what belonged to the lost connection itself, and reports a ``Reconnected``; when no
address takes it within ``reconnect_timeout``, what is pending fails with
``ConnectionClosed``; without failover a Goodbye ends the client, as it always did."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from polymq import Client, ConnectionClosed, Message, Reconnected, inproc
from polymq.codec import NEED_DATA, Connection, Role
from polymq.events import (
    Ack,
    Deliver,
    Event,
    Hello,
    Ok,
    Publish,
    Subscribe,
    Unsubscribe,
    Welcome,
)

HOST = "127.0.0.1"
A, B = 65101, 65102  # the fake cores' ports (served in-process only: no socket)


class FakeCore(asyncio.Protocol):
    """A core that welcomes every Hello (or, ``refuse``d, says Goodbye ``unavailable``),
    records what it is sent, and answers as ``answer`` says (None: not at all)."""

    def __init__(self, name: str, answer: Callable[[Event], object]) -> None:
        self.name = name
        self.answer = answer
        self.conn = Connection(Role.SERVER)
        self.got: list[Event] = []
        self.transport: asyncio.Transport | None = None
        self.refuse = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        while (ev := self.conn.next_event()) is not NEED_DATA:
            assert isinstance(ev, Event)
            self.got.append(ev)
            if isinstance(ev, Hello):
                if self.refuse:
                    self.say_goodbye("unavailable", "not now")
                else:
                    self.send(Welcome(1, self.name, f"{self.name}-session", {}))
                continue
            result = self.answer(ev)
            if result is not None:
                self.send(Ok(ev.rid, None if result is True else result))  # type: ignore[attr-defined]

    def send(self, ev: Event) -> None:
        assert self.transport is not None
        self.transport.write(self.conn.send(ev))

    def say_goodbye(self, code: str, message: str) -> None:
        assert self.transport is not None
        self.transport.write(self.conn.goodbye(code, message))
        self.transport.close()

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.got if isinstance(e, kind)]


def answer_all(ev: Event) -> object:
    if isinstance(ev, Publish):
        return {"count": len(ev.messages), "ids": ["i"], "seqs": [1], "duplicate": False}
    return True


def answer_but_publishes(ev: Event) -> object:
    return None if isinstance(ev, Publish) else True


class Cores:
    """The fake cores made at each address, newest last; ``refusing`` the addresses whose
    next cores say Goodbye to the Hello."""

    def __init__(self) -> None:
        self.made: dict[int, list[FakeCore]] = {A: [], B: []}
        self.answers: dict[int, Callable[[Event], object]] = {A: answer_all, B: answer_all}
        self.refusing: set[int] = set()

    def factory(self, port: int) -> Callable[[], FakeCore]:
        def make() -> FakeCore:
            core = FakeCore(f"core-{port}", self.answers[port])
            core.refuse = port in self.refusing
            self.made[port].append(core)
            return core

        return make

    def last(self, port: int) -> FakeCore:
        return self.made[port][-1]


@pytest.fixture
def cores() -> Iterator[Cores]:
    made = Cores()
    for port in (A, B):
        inproc.serve(HOST, port, made.factory(port))
    yield made
    for port in (A, B):
        inproc.unserve(HOST, port)


async def until(check: Callable[[], object], what: str, within: float = 5.0) -> None:
    """Poll ``check`` (the fakes answer from the client's own loop) until it is true."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        if check():
            return
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within {within:g}s"
        await asyncio.sleep(0.005)


def address(port: int) -> str:
    return f"{HOST}:{port}"


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
