"""Tests for polymq_core.session: a stream subscription this node served, whose shard is led
elsewhere now (``Session.moved``), is subscribed again through the relay from the first entry
its client did not get: after what went out to the socket, not from the offset it was made
with (``first`` read the whole stream again), and not after deliveries still waiting here for
the socket (the client never had them)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from polymq.codec import Connection, Role
from polymq.events import Deliver, Hello, Welcome
from polymq.types import DeclareOptions, Message, SubscribeOptions
from polymq_core.destinations.stream import Stream
from polymq_core.destinations.subscription import Subscription
from polymq_core.session import Session


class Relocations:
    """The session's relay, as far as a move goes: what it was asked to move, and how."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int, dict[int, str] | None, int | None]] = []

    def relocate(
        self, sid: int, top: int, held: dict[int, str] | None = None, seq: int | None = None
    ) -> None:
        self.asked.append((sid, top, held, seq))

    def close(self) -> None:
        pass


class Socket:
    """A transport that keeps what is written (the codec's frames)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.frames.append(data)

    def writelines(self, data: list[bytes]) -> None:
        self.frames.extend(data)

    def close(self) -> None:
        pass


def _logged_in(session: Session) -> Connection:
    """The client's end of ``session``'s codec, past the Hello and the Welcome."""
    client = Connection(Role.CLIENT)
    session.conn.receive_data(client.send(Hello(1, "test")))
    assert isinstance(session.conn.next_event(), Hello)
    client.receive_data(session.conn.send(Welcome(1, "n1", "s", {})))
    assert isinstance(client.next_event(), Welcome)
    return client


def _delivered(client: Connection, frames: list[bytes]) -> list[int]:
    """The stream seqs of the deliveries in ``frames``, as the client reads them."""
    client.receive_data(b"".join(frames))
    seqs = []
    while isinstance(event := client.next_event(), Deliver):
        seqs.extend(m.seq for m in event.messages)
    return seqs


async def test_a_moved_stream_subscription_reads_on_from_what_its_client_did_not_get() -> None:
    sensors = SimpleNamespace(on_subscription=lambda kind, n: None, on_deliver=lambda n: None)
    settings = SimpleNamespace(max_frame=1 << 20, max_login_frame=1 << 16)
    cluster = SimpleNamespace(secret="s", node_id="n1")
    broker: Any = SimpleNamespace(settings=settings, cluster=cluster, sensors=sensors)
    session = Session(broker)
    relay = Relocations()
    session.relay = relay  # type: ignore[assignment]
    socket = Socket()
    session.transport = socket  # type: ignore[assignment]
    client = _logged_in(session)
    host: Any = SimpleNamespace(sensors=sensors, loop=session.loop)
    stream = Stream(host, "stream/s", DeclareOptions())
    sub = Subscription(session, 3, "stream/s", SubscribeOptions(offset="first"), stream)
    session.add_sub(sub)
    for seq in (1, 2, 3):
        stream.put(Message(b"x", id=f"m{seq}", seq=seq))
    stream.attach(sub)
    session._flush()  # 1-3 go out
    for seq in (4, 5):
        stream.put(Message(b"x", id=f"m{seq}", seq=seq))
    stream.pump()  # 4 and 5 wait for the socket's next flush
    seq = stream.cursors.pop(sub)  # (what Shard.demote does)
    assert seq == 6
    session.moved(sub, "led elsewhere", {}, seq)
    session._flush()
    assert _delivered(client, socket.frames) == [1, 2, 3]
    assert relay.asked == [(3, 5, {}, 4)]
