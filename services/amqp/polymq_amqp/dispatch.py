"""What each event an AMQP connection's codec reads asks of its session: :func:`dispatch`.

A publish (a Content, or a ContentRun of publishes alike) goes to its channel's publisher.
A method on channel 0 is the connection's own: the handshake's (``handshake.py``),
connection.tune-ok's heartbeats (``heartbeat.py``), the client's connection.close and our
close's close-ok; a method on any other channel is the channel table's (``channels.py``). A
heartbeat is counted, the protocol header starts the handshake, a publish larger than the
core takes is refused on its channel (406), the end of the stream closes. What a handler
raises, the session answers (``fail``: channel.close or connection.close) on the channel
it came on. Publishes are counted for the metrics at the end of the session's tick, and
every method (not basic.publish, which comes as content) counts as a read that makes the
publishers forget the routes they remember (``reads``, see ``publisher.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import base, commands

from . import handshake
from .errors import NOT_IMPLEMENTED, PRECONDITION_FAILED, ChannelException, ConnectionException
from .handshake import HandshakeSession
from .heartbeat import Heartbeats, HeartbeatSession
from .wire.events import (
    ConnectionClosed,
    Content,
    ContentRun,
    Event,
    Heartbeat,
    Method,
    OversizedContent,
    ProtocolHeader,
)
from .wire.states import method_name

if TYPE_CHECKING:
    from .channels import Channels

__all__ = ["DispatchSession", "dispatch"]


class DispatchSession(HandshakeSession, HeartbeatSession, Protocol):
    """The session as its events' dispatch sees it: what the handshake and the heartbeats
    ask, the channels, the counts of the reading, and how a method is refused and the
    connection closed."""

    reads: int  # methods read (publishers' remembered routes are good until it changes)
    published_in: int  # basic.publish read, not yet counted in the metrics
    heartbeats: Heartbeats | None

    @property
    def channels(self) -> Channels: ...

    def fail(self, exc: BaseException, channel: int, method: base.Frame | None = None) -> None: ...
    def start_busy(
        self, coro: Coroutine[Any, Any, None], channel: int, method: base.Frame | None
    ) -> None: ...
    def close_transport(self) -> None: ...
    def closed_by_client(self) -> None: ...


def dispatch(session: DispatchSession, event: Event) -> None:
    """Handle ``event``, read from ``session``'s codec."""
    if isinstance(event, ContentRun):
        session.published_in += len(event.bodies)  # (counted at the end of the tick)
        ch = session.channels.get(event.channel)
        if ch is not None:
            _guard(session, event.channel, event.method, ch.publisher.publish, event)
    elif isinstance(event, Content):
        session.published_in += 1
        ch = session.channels.get(event.channel)
        if ch is not None:
            _guard(session, event.channel, event.method, ch.publisher.publish, event)
    elif isinstance(event, Method):
        session.reads += 1
        method = event.method
        session.metrics.method_in(method_name(method))
        if event.channel == 0:
            _guard(session, 0, method, _connection_method, session, method)
        else:
            handle = session.channels.handle
            _guard(session, event.channel, method, handle, event.channel, method)
    elif isinstance(event, Heartbeat):
        session.metrics.method_in("heartbeat")
    elif isinstance(event, ProtocolHeader):
        handshake.send_start(session)
    elif isinstance(event, OversizedContent):
        err = ChannelException(
            PRECONDITION_FAILED,
            f"message size {event.size} is larger than the maximum {session.codec.max_body}",
        )
        session.fail(err.about(60, 40), event.channel)
    elif isinstance(event, ConnectionClosed):
        session.close_transport()


def _guard(
    session: DispatchSession,
    channel: int,
    method: base.Frame,
    fn: Callable[..., None],
    *args: Any,
) -> None:
    try:
        fn(*args)
    except Exception as exc:
        session.fail(exc, channel, method)


def _connection_method(session: DispatchSession, method: base.Frame) -> None:
    if isinstance(method, commands.Connection.StartOk):
        session.start_busy(handshake.login(session, method), 0, method)
    elif isinstance(method, commands.Connection.TuneOk):
        if session.codec.heartbeat:
            session.heartbeats = Heartbeats(session, session.codec.heartbeat)
    elif isinstance(method, commands.Connection.Open):
        handshake.open_vhost(session, method)
    elif isinstance(method, commands.Connection.UpdateSecret):
        session.start_busy(handshake.update_secret(session, method), 0, method)
    elif isinstance(method, commands.Connection.Close):
        session.closed_by_client()
    elif isinstance(method, commands.Connection.CloseOk):
        session.close_transport()
    else:  # pragma: no cover - the codec lets nothing else through
        raise ConnectionException(NOT_IMPLEMENTED, f"{method_name(method)}")
