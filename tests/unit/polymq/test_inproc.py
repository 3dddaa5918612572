"""polymq.inproc: the in-process pipe between a client and a server protocol."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TypeVar

import pytest

from polymq import inproc
from polymq.codec import NEED_DATA, Connection, Role, State
from polymq.errors import LocalProtocolError, RemoteProtocolError
from polymq.events import Ack, Declare, Event, Hello, Publish
from polymq.types import Message


class Recorder(asyncio.Protocol):
    """Records what the pipe does to it, in order."""

    def __init__(self) -> None:
        self.transport: inproc.PipeEnd | None = None
        self.calls: list[tuple[str, object]] = []
        self.lost = asyncio.get_event_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, inproc.PipeEnd)
        self.transport = transport
        self.calls.append(("made", None))

    def data_received(self, data: bytes) -> None:
        self.calls.append(("data", data))

    def eof_received(self) -> bool | None:
        self.calls.append(("eof", None))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append(("lost", exc))
        if not self.lost.done():
            self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.calls.append(("pause_writing", None))

    def resume_writing(self) -> None:
        self.calls.append(("resume_writing", None))

    def data(self) -> bytes:
        return b"".join(d for k, d in self.calls if k == "data")  # type: ignore[misc]


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


R = TypeVar("R", bound=Recorder)


def serving(port: int, kind: type[R]) -> Iterator[list[R]]:
    """Serve ``kind`` protocols on ``port`` (in-process) while the test runs: those made."""
    made: list[R] = []

    def factory() -> R:
        made.append(kind())
        return made[-1]

    inproc.serve("127.0.0.1", port, factory)
    yield made
    inproc.unserve("127.0.0.1", port)


@pytest.fixture
def server() -> Iterator[list[Recorder]]:
    yield from serving(65001, Recorder)


async def connect(made: list[Recorder]) -> tuple[Recorder, Recorder]:
    res = inproc.connect("127.0.0.1", 65001, Recorder)
    assert res is not None
    end, client = res
    assert isinstance(client, Recorder) and client.transport is end
    return client, made[-1]


async def test_nothing_served_means_no_pipe() -> None:
    assert not inproc.served("127.0.0.1", 65002)
    assert inproc.connect("127.0.0.1", 65002, Recorder) is None


async def test_connect_makes_both_sides_and_names_them(server: list[Recorder]) -> None:
    assert inproc.served("127.0.0.1", 65001)
    client, srv = await connect(server)
    assert client.calls == [("made", None)] and srv.calls == [("made", None)]
    assert srv.transport is not None and client.transport is not None
    assert str(srv.transport.get_extra_info("peername")).startswith("in-process:")
    assert client.transport.get_extra_info("peername") == "127.0.0.1:65001"
    assert client.transport.get_extra_info("socket") is None


async def test_writes_of_one_turn_arrive_together_in_order_next_turn(
    server: list[Recorder],
) -> None:
    client, srv = await connect(server)
    assert client.transport is not None and srv.transport is not None
    client.transport.write(b"one ")
    client.transport.write(bytearray(b"two "))
    client.transport.write(memoryview(b"three"))
    client.transport.write(b"")
    assert srv.data() == b""  # never re-entrant: nothing is handed on within the write
    await turns()
    assert [d for k, d in srv.calls if k == "data"] == [b"one two three"]
    srv.transport.write(b"back")
    await turns()
    assert client.data() == b"back"


async def test_big_writes_are_handed_on_in_chunks_in_order(server: list[Recorder]) -> None:
    client, srv = await connect(server)
    assert client.transport is not None
    payload = bytes(range(256)) * (3 * inproc.CHUNK // 256 + 7)
    client.transport.set_write_buffer_limits(high=len(payload) * 2)
    client.transport.write(payload)
    await turns(10)
    chunks = [d for k, d in srv.calls if k == "data"]
    assert all(len(c) <= inproc.CHUNK for c in chunks) and len(chunks) == 4
    assert b"".join(chunks) == payload  # type: ignore[arg-type]


async def test_a_reader_that_pauses_pushes_back_on_the_writer(server: list[Recorder]) -> None:
    client, srv = await connect(server)
    assert client.transport is not None and srv.transport is not None
    client.transport.set_write_buffer_limits(high=100, low=20)
    assert client.transport.get_write_buffer_limits() == (20, 100)
    srv.transport.pause_reading()
    assert not srv.transport.is_reading()
    client.transport.write(b"x" * 60)
    await turns()
    assert srv.data() == b"" and client.transport.get_write_buffer_size() == 60
    assert ("pause_writing", None) not in client.calls
    client.transport.write(b"y" * 60)
    assert client.calls[-1] == ("pause_writing", None)  # as a socket that does not drain
    srv.transport.resume_reading()
    await turns()
    assert srv.data() == b"x" * 60 + b"y" * 60
    assert client.calls[-1] == ("resume_writing", None)
    assert client.transport.get_write_buffer_size() == 0


async def test_close_hands_on_what_was_written_then_ends_both(server: list[Recorder]) -> None:
    client, srv = await connect(server)
    assert client.transport is not None
    client.transport.write(b"last words")
    client.transport.close()
    assert client.transport.is_closing()
    client.transport.write(b"dropped")  # as a socket transport after close()
    assert await asyncio.wait_for(srv.lost, 1) is None
    assert await asyncio.wait_for(client.lost, 1) is None
    assert [k for k, _ in srv.calls] == ["made", "data", "eof", "lost"]
    assert srv.data() == b"last words"
    client.transport.close()  # twice: nothing more happens
    await turns()
    assert [k for k, _ in client.calls] == ["made", "lost"]


async def test_close_waits_for_a_paused_reader(server: list[Recorder]) -> None:
    client, srv = await connect(server)
    assert client.transport is not None and srv.transport is not None
    srv.transport.pause_reading()
    client.transport.write(b"held")
    client.transport.close()
    await turns(5)
    assert not srv.lost.done() and srv.data() == b""
    srv.transport.resume_reading()
    assert await asyncio.wait_for(srv.lost, 1) is None
    assert srv.data() == b"held"


async def test_abort_drops_what_was_not_handed_on_and_resets_the_peer(
    server: list[Recorder],
) -> None:
    client, srv = await connect(server)
    assert client.transport is not None and srv.transport is not None
    client.transport.write(b"never")
    srv.transport.write(b"never either")
    client.transport.abort()
    assert await asyncio.wait_for(client.lost, 1) is None
    exc = await asyncio.wait_for(srv.lost, 1)
    assert isinstance(exc, ConnectionResetError)
    await turns()
    assert srv.data() == b"" and client.data() == b""
    assert srv.transport.is_closing() and not srv.transport.is_reading()
    srv.transport.write(b"after")  # dropped, no error
    srv.transport.abort()  # already gone: nothing more
    await turns()
    assert [k for k, _ in srv.calls].count("lost") == 1


async def test_abort_from_inside_data_received(server: list[Recorder]) -> None:
    client, srv = await connect(server)
    assert client.transport is not None and srv.transport is not None
    st = srv.transport

    def data_received(data: bytes) -> None:
        srv.calls.append(("data", data))
        st.abort()

    srv.data_received = data_received  # type: ignore[method-assign]
    client.transport.set_write_buffer_limits(high=1)
    client.transport.write(b"bad input")
    assert client.calls[-1] == ("pause_writing", None)
    assert isinstance(await asyncio.wait_for(client.lost, 1), ConnectionResetError)
    assert await asyncio.wait_for(srv.lost, 1) is None
    assert ("resume_writing", None) not in client.calls  # a lost connection drains no more


async def test_write_buffer_limits_are_checked(server: list[Recorder]) -> None:
    client, _ = await connect(server)
    assert client.transport is not None
    with pytest.raises(ValueError):
        client.transport.set_write_buffer_limits(high=10, low=20)
    client.transport.set_write_buffer_limits(low=1000)
    assert client.transport.get_write_buffer_limits() == (1000, 4000)
    client.transport.set_write_buffer_limits(high=400)
    assert client.transport.get_write_buffer_limits() == (100, 400)


async def test_a_protocol_that_fails_on_data_ends_both_sides(
    server: list[Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    client, srv = await connect(server)
    assert client.transport is not None and srv.transport is not None
    boom = RuntimeError("a bug")

    def data_received(data: bytes) -> None:
        raise boom

    srv.data_received = data_received  # type: ignore[method-assign]
    client.transport.write(b"trigger")
    client.transport.write(b"more")
    assert await asyncio.wait_for(srv.lost, 1) is boom
    assert isinstance(await asyncio.wait_for(client.lost, 1), ConnectionResetError)
    assert "data_received failed" in caplog.text
    assert srv.transport.is_closing() and client.transport.is_closing()


# ---- events handed over without encoding ---------------------------------------------------


class EventRecorder(Recorder):
    """A protocol that takes events (as the core's Session and the client's protocol do)."""

    def events_received(self, events: list[Event], size: int) -> None:
        self.calls.append(("events", (events, size)))

    def events(self) -> list[Event]:
        return [e for k, v in self.calls if k == "events" for e in v[0]]  # type: ignore[index]


@pytest.fixture
def event_server() -> Iterator[list[EventRecorder]]:
    yield from serving(65003, EventRecorder)


async def open_pair(made: list[EventRecorder]) -> tuple[EventRecorder, EventRecorder, Connection]:
    """A client (that takes events too) and the server; a client codec past its Hello."""
    res = inproc.connect("127.0.0.1", 65003, EventRecorder)
    assert res is not None
    conn = Connection(Role.CLIENT)
    conn.send(Hello(1, "test"))  # (requests may follow a Hello before its Welcome)
    return res[1], made[-1], conn  # type: ignore[return-value]


def msg(body: bytes = b"hi", **headers: str) -> Message:
    return Message(body, headers=dict(headers), id="m-1", seq=7)


async def test_events_arrive_in_order_with_the_bytes_around_them(
    event_server: list[EventRecorder],
) -> None:
    client, srv, conn = await open_pair(event_server)
    end = client.transport
    assert end is not None and end.passes_events
    pub = Publish(1, "queue/q", [msg()])
    declare = Declare(2, "queue/q", {"durable": True})  # not passed: encoded
    end.write(b"before")
    inproc.write_events(end, conn, [pub, declare, Ack(0, 1, [1, 2], False)], [10, 10, 10], 1 << 20)
    end.write(b"after")
    assert srv.calls == [("made", None)]  # never within the write
    await turns()
    kinds = [k for k, _ in srv.calls]
    assert kinds == ["made", "data", "events", "data", "events", "data"]
    assert srv.calls[1] == ("data", b"before") and srv.calls[-1] == ("data", b"after")
    (first, size), (second, _) = (v for k, v in srv.calls if k == "events")  # type: ignore[misc]
    assert size == 10 and [type(e) for e in first] == [Publish]
    assert second == [Ack(0, 1, [1, 2], False)]
    twin = Connection(Role.CLIENT)  # the frame the Declare makes
    twin.send(Hello(1, "test"))
    assert srv.calls[3] == ("data", twin.send(declare))


async def test_messages_are_copied_when_written(event_server: list[EventRecorder]) -> None:
    """What the peer gets is a snapshot, as decoded bytes would be: changed later on either
    side, a message (or its headers) does not change on the other."""
    client, srv, conn = await open_pair(event_server)
    assert client.transport is not None
    original = msg(bytearray(b"body"), k="v")  # type: ignore[arg-type]
    inproc.write_events(client.transport, conn, [Publish(1, "queue/q", [original])], [10], 1 << 20)
    original.headers["k"] = "changed"
    original.delivery_count = 5
    await turns()
    (got,) = srv.events()
    assert isinstance(got, Publish)
    (copy,) = got.messages
    assert copy is not original and copy.headers == {"k": "v"} and copy.delivery_count == 0
    assert type(copy.body) is bytes and copy.body == b"body"
    assert (copy.id, copy.seq) == ("m-1", 7)


async def test_events_count_against_the_write_buffer(event_server: list[EventRecorder]) -> None:
    client, srv, conn = await open_pair(event_server)
    end = client.transport
    assert end is not None and srv.transport is not None
    end.set_write_buffer_limits(high=100, low=20)
    srv.transport.pause_reading()
    inproc.write_events(end, conn, [Ack(0, 1, [1], False)], [60], 1 << 20)
    await turns()
    assert srv.events() == [] and end.get_write_buffer_size() == 60  # held while paused
    inproc.write_events(end, conn, [Ack(0, 1, [2], False)], [60], 1 << 20)
    assert client.calls[-1] == ("pause_writing", None)
    srv.transport.resume_reading()
    await turns()
    assert [e.tags for e in srv.events()] == [[1], [2]]  # type: ignore[attr-defined]
    assert client.calls[-1] == ("resume_writing", None) and end.get_write_buffer_size() == 0


async def test_a_peer_that_takes_no_events_is_not_given_any(server: list[Recorder]) -> None:
    client, _ = await connect(server)
    assert client.transport is not None
    assert not client.transport.passes_events and not inproc.passes_events(client.transport)


def test_received_events_queue_behind_the_frames_before_them() -> None:
    """The codec serves events handed over in-process after every frame that came before
    them, checks them against the state, and reports one that may not come once those
    before it are served."""
    client = Connection(Role.CLIENT)
    server = Connection(Role.SERVER)
    server.receive_data(client.send(Hello(1, "test")))
    server.receive_events([Publish(1, "queue/q", [msg()])])
    assert isinstance(server.next_event(), Hello)  # (the bytes first)
    assert isinstance(server.next_event(), Publish) and server.next_event() is NEED_DATA
    server.receive_events([Ack(0, 1, [1], False), Hello(1, "again"), Ack(0, 1, [2], False)])
    assert server.next_event() == Ack(0, 1, [1], False)
    with pytest.raises(RemoteProtocolError, match="Hello"):
        server.next_event()


def test_sent_events_are_checked_against_the_state() -> None:
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.send_events([Publish(1, "queue/q", [msg()])])  # before its Hello
    assert client.state is State.HELLO
