"""One AMQP connection (the transport's endpoint): reading, writing, closing (what each
event read asks is ``dispatch.py``'s, the handshake's methods are in ``handshake.py``, the
heartbeats in ``heartbeat.py``, the table of open channels in ``channels.py``).

Reading: ``data_received`` feeds the sans-IO codec and handles its events in order. Most
methods are handled at once, without awaiting anything: a basic.publish whose exchange (and
queue, or headers bindings) is known goes to the core through the frontend's one shared
client, its confirm follows the core's answer; acks and nacks are fire-and-forget core acks.
A method that needs the core before it can be answered (declarations, basic.consume,
basic.get, tx.commit, a publish to something not in the cache, the login) runs as the
session's one *busy* task; until it is done the frames behind it wait in the codec and
reading pauses, so every channel's methods are answered in order.

Writing: every frame out is encoded at once and appended to one output buffer, written to
the transport once per loop iteration while it drains. Reading pauses while that buffer holds
more than ``amqp_write_buffer`` bytes, while the busy task runs, or while too many publishes
await the core (``amqp_max_inflight``).

Errors: whatever refuses a method raises an :class:`~polymq_amqp.errors.AmqpError` (or a
``polymq`` error of the core, translated by :func:`~polymq_amqp.errors.from_polymq`). A
channel exception closes that channel with channel.close (its consumers are released, their
unacknowledged messages go back to their queues); a connection exception sends
connection.close and waits (``amqp_close_timeout``) for close-ok. Closing releases every
channel and deletes the connection's exclusive queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from pamqp import base, commands

from polymq.client import Client
from polymq.errors import PolymqError
from polymq_server.auth.provider import Permission, Principal
from polymq_server.link.connections import revoked
from polymq_server.link.corelink import CoreLink
from polymq_server.names import VhostNames
from polymq_server.sessions.frontend import FrontendSession
from polymq_server.sessions.transport import Transport

from .blocking import Blocking
from .channels import Channels
from .dispatch import dispatch
from .errors import (
    ACCESS_REFUSED,
    CONNECTION_FORCED,
    AmqpError,
    ChannelException,
    ConnectionException,
    LocalProtocolError,
    ProtocolHeaderMismatch,
    from_polymq,
)
from .heartbeat import Heartbeats
from .hub import AmqpHub
from .metrics import AmqpMetrics
from .publisher import Outbox
from .topology import Topology
from .wire.codec import AmqpConnection
from .wire.events import Content, ContentRun, NeedData
from .wire.states import State, method_name

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["AmqpHub", "AmqpSession"]

log = logging.getLogger(__name__)

_MAX_INFLIGHT_BYTES: Final = 16 * 1024 * 1024  # bytes of publishes awaiting the core, then pause


class AmqpSession(FrontendSession):
    """The AMQP side of one connection (writing, reading's pauses, its tasks and the close
    of the transport are :class:`~polymq_server.sessions.frontend.FrontendSession`'s)."""

    metrics: AmqpMetrics

    def __init__(self, hub: AmqpHub, transport: Transport) -> None:
        super().__init__(transport)
        s = hub.settings
        self.hub = hub
        self.settings = s
        self.metrics = hub.metrics
        self.codec = AmqpConnection(
            frame_max=s.amqp_frame_max, channel_max=s.amqp_channel_max, max_body=hub.max_body
        )
        self.conn_id = secrets.token_hex(6)
        self.owner = f"{hub.instance}/{self.conn_id}"
        self.principal: Principal | None = None
        self.token_login = False  # logged in with a token (see handshake.login)
        self.vhost = "/"
        self.names = VhostNames("/")
        self.client_properties: dict[str, Any] = {}
        self.cancel_notify = False  # the client takes basic.cancel from the server
        self.blocked_notify = False  # the client takes connection.blocked / unblocked
        self.blocking = Blocking(self)  # a publish read while an alarm is set: held
        self.channels = Channels(self)
        self.exclusive_queues: set[str] = set()  # AMQP names of this connection's ones
        # closing (True once connection.close is sent or received): nothing more is handled
        self._done_reading = False  # the transport is closing: no more events
        self._allowed: set[tuple[Permission, str]] = set()
        # writing
        self._ack_after_write: dict[Any, int] = {}  # no-ack consumer -> last core tag
        self._in_bytes = 0
        self._delivered_out = 0  # basic.deliver frames not yet counted in the metrics
        self.published_in = 0  # and basic.publish frames read
        # what a publisher remembers of its last route is good until this changes: at every
        # read, and at every method but basic.publish
        self.reads = 0
        self._confirms: set[Channel] = set()  # channels with confirms to send
        # reading
        self.inflight = 0  # publishes awaiting the core
        self.outbox = Outbox(self)  # publishes read, to go to the core after this read
        self.inflight_bytes = 0  # and their bodies' bytes
        # timers
        self.heartbeats: Heartbeats | None = None  # from connection.tune-ok on, if any
        self._close_timer: asyncio.TimerHandle | None = self.loop.call_later(
            s.amqp_handshake_timeout, self._handshake_timeout
        )
        hub.sessions[self.conn_id] = self
        # its place in the connection limits (refused: told with a 530 at connection.open)
        self.admission = hub.connections.admit()
        self.metrics.connections.inc()
        self.metrics.connections_opened.inc()
        self.tracked = hub.link.connections.open(  # (the admin API's view of it)
            "amqp", transport.peer, self._closed_by_admin, self.channels.counts
        )
        self.tracked.recheck = self.recheck_login  # (after a users reload)

    def __repr__(self) -> str:
        return f"<amqp connection {self.conn_id} {self.transport.peer}>"

    @property
    def open(self) -> bool:
        return not self.closing and self.codec.state is State.OPEN

    # ==== transport events (polymq_server.sessions.transport.Endpoint)
    # ===============================
    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        self._in_bytes += len(data)
        if self._done_reading:
            return
        self.codec.receive_data(data)
        self._process()
        self._schedule()

    def eof_received(self) -> None:
        if self._done_reading:
            return
        self.codec.receive_data(b"")
        self._process()
        self._schedule()

    def connection_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        self._done_reading = True
        self.closing = True
        self._teardown()
        self.hub.link.connections.close(self.tracked)
        self.admission.release()
        self.metrics.connections.dec()

    def _closed_by_admin(self, reason: str) -> None:
        self.close_connection(ConnectionException(CONNECTION_FORCED, reason))

    def _tick(self) -> None:
        """Once per loop iteration with something to do: confirms made in it go out (acks
        coalesced into ``multiple``), then the frames written in it go to the transport."""
        self._tick_scheduled = False
        if self._confirms:
            channels, self._confirms = self._confirms, set()
            for ch in channels:
                ch.flush_confirms()
        if self._in_bytes:
            self.metrics.bytes_in.inc(self._in_bytes)
            self._in_bytes = 0
        if self._delivered_out:
            self.tracked.messages_out += self._delivered_out
            self.metrics.method_out("basic.deliver", self._delivered_out)
            self._delivered_out = 0
        if self.published_in:
            self.tracked.messages_in += self.published_in
            self.metrics.method_in("basic.publish", self.published_in)
            self.published_in = 0
        self._flush()

    # ==== reading ============================================================================
    def _process(self) -> None:
        codec = self.codec
        self.reads += 1
        try:
            while self._busy is None and not self._done_reading and self.blocking.held is None:
                try:
                    event = codec.next_event()
                except ProtocolHeaderMismatch as exc:
                    self._wrong_header(exc)
                    return
                except ConnectionException as exc:
                    if self.closing:  # garbage after our connection.close: give up on it
                        self.close_transport()
                        return
                    self.close_connection(exc)
                    continue
                if isinstance(event, NeedData):
                    break
                if self.hub.alarms and isinstance(event, Content | ContentRun):
                    self.blocking.hold(event)
                    break
                dispatch(self, event)
        finally:
            self.outbox.flush()
            self.update_reading()

    def fail(self, exc: BaseException, channel: int, method: base.Frame | None = None) -> None:
        """Answer ``exc``, raised while handling ``method`` on ``channel``."""
        if self.closing:
            return
        err = from_polymq(exc, method_name(method) if method is not None else "request")
        if not isinstance(exc, AmqpError | PolymqError | TimeoutError):
            log.error("amqp %s: internal error", self, exc_info=exc)
        if method is not None:
            err.about(method.index >> 16, method.index & 0xFFFF)
        if isinstance(err, ChannelException) and channel != 0:
            self.channels.close(channel, err)
        else:
            self.close_connection(err)

    def start_busy(
        self, coro: Coroutine[Any, Any, None], channel: int, method: base.Frame | None
    ) -> None:
        """Run ``coro`` before any later frame is handled."""
        self.outbox.flush()  # the publishes read before it reach the core first
        self._run_busy(coro, partial(self._busy_done, channel, method))

    def _busy_done(
        self, channel: int, method: base.Frame | None, exc: BaseException | None
    ) -> None:
        if exc is not None:
            self._task_failed(channel, method, exc)
        if not self._done_reading:
            self._process()
            self._schedule()

    def spawn(
        self, coro: Coroutine[Any, Any, None], channel: int, method: base.Frame | None = None
    ) -> None:
        """A task of this session nothing waits for; its failure closes ``channel``."""
        self._run_task(coro, partial(self._task_failed, channel, method))

    def _task_failed(self, channel: int, method: base.Frame | None, exc: BaseException) -> None:
        if channel == 0 or channel in self.channels:  # (not closed since)
            self.fail(exc, channel, method)

    # ==== resource alarms (hub.py, blocking.py) =============================================
    def alarm_changed(self) -> None:
        if self.hub.alarms or self.blocking.held is None or self.closing:
            return
        held = self.blocking.release()
        self.reads += 1  # what publishers remember of their routes is from before
        dispatch(self, held)
        self._process()
        self._schedule()

    def update_reading(self) -> None:
        self._set_reading(
            not self._lost
            and (
                self.blocking.held is not None
                or self._busy is not None
                or self._out_bytes > self.settings.amqp_write_buffer
                or self.inflight >= self.settings.amqp_max_inflight
                or self.inflight_bytes > _MAX_INFLIGHT_BYTES
            )
        )

    # ==== writing ============================================================================
    def send_method(self, channel: int, method: base.Frame) -> bool:
        """Write ``method``; False (nothing written) if it may not be sent now."""
        if self._lost:
            return False
        try:
            data = self.codec.send_method(channel, method)
        except LocalProtocolError as exc:
            log.debug("amqp %s: not sending %s: %s", self, method_name(method), exc)
            return False
        self.metrics.method_out(method_name(method))
        self._write(data)
        return True

    def send_content(
        self, channel: int, method: base.Frame, properties: bytes, body: bytes
    ) -> bool:
        if self._lost:
            return False
        try:
            data = self.codec.send_content(channel, method, properties, body)
        except LocalProtocolError as exc:
            log.debug("amqp %s: not sending %s: %s", self, method_name(method), exc)
            return False
        self.metrics.method_out(method_name(method))
        self._write(data)
        return True

    def send_delivers(self, channel: int, frames: list[bytes], count: int) -> bool:
        """``count`` basic.deliver (made by ``deliver.py``, see
        :meth:`AmqpConnection.send_delivers`) in one write; False if not sent."""
        if self._lost:
            return False
        try:
            data = self.codec.send_delivers(channel, frames)
        except LocalProtocolError as exc:
            log.debug("amqp %s: not sending basic.deliver: %s", self, exc)
            return False
        self._delivered_out += count
        self._write(data)
        return True

    def ack_after_write(self, consumer: Any, core_tag: int) -> None:
        """Ack ``core_tag`` of a no-ack consumer once what is written now left for the socket."""
        self._ack_after_write[consumer] = core_tag

    def confirms_due(self, channel: Channel) -> None:
        self._confirms.add(channel)
        self._schedule()

    def _written(self, force: bool) -> None:
        if self._ack_after_write:
            acks, self._ack_after_write = self._ack_after_write, {}
            for consumer, tag in acks.items():
                consumer.written(tag)

    # ==== closing ============================================================================
    def close_connection(self, err: AmqpError) -> None:
        """connection.close with ``err``'s reply code; close-ok is awaited a little while."""
        if self.closing:
            return
        self.closing = True
        handshake = self.codec.state is not State.OPEN
        self.metrics.error(err.reply_code, "connection")
        log.info("amqp %s: closing: %s", self, err.reply_text)
        sent = self.send_method(
            0,
            commands.Connection.Close(err.reply_code, err.reply_text, err.class_id, err.method_id),
        )
        self._teardown()
        self._flush(force=True)
        if not sent or handshake:  # (a refused login: no close-ok is awaited, as RabbitMQ)
            self.close_transport()
            return
        self._set_close_timer(self.settings.amqp_close_timeout)

    def _set_close_timer(self, delay: float) -> None:
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._close_timer = self.loop.call_later(delay, self.close_transport)

    def close_transport(self) -> None:
        """Close the socket after what is written; nothing more is read."""
        self._done_reading = True
        self._close()

    def closed_by_client(self) -> None:
        """The client's connection.close: release what the connection holds, answer
        close-ok, close."""
        self.closing = True
        self._teardown()
        self.send_method(0, commands.Connection.CloseOk())
        self.close_transport()

    def drop(self) -> None:
        """Close at once, without connection.close: the client stopped talking (its
        heartbeats are missed), it would not read it."""
        self.closing = True
        self._teardown()
        self.transport.abort()

    def _wrong_header(self, exc: ProtocolHeaderMismatch) -> None:
        """Not AMQP 0-9-1: answer with the header we speak, and close (as the spec says)."""
        log.info("amqp %s: %s", self, exc.detail)
        self.metrics.error(exc.reply_code, "connection")
        self.closing = True
        self._write(self.codec.protocol_header())
        self.close_transport()

    def _handshake_timeout(self) -> None:
        self._close_timer = None
        if self.codec.state is State.OPEN or self.closing:
            return
        log.info("amqp %s: no connection.open within the handshake timeout; closing", self)
        self.close_transport()

    def _teardown(self) -> None:
        """Release what the connection holds at the core (once)."""
        if self._torn_down:
            return
        self._torn_down = True
        self.closing = True
        self.outbox.flush()  # what was read is published, as it would have been at once
        if self.heartbeats is not None:
            self.heartbeats.stop()
        if self._lost and self._close_timer is not None:
            self._close_timer.cancel()
        self._cancel_tasks()
        self.channels.close_all()
        self.hub.sessions.pop(self.conn_id, None)
        exclusive, self.exclusive_queues = list(self.exclusive_queues), set()
        link = self.hub.link
        if exclusive and link.connected:
            link.spawn(self._delete_exclusive(exclusive), f"deleting the queues of {self}")

    async def _delete_exclusive(self, queues: list[str]) -> None:
        topology = self.hub.topology
        for name in queues:
            with contextlib.suppress(PolymqError, TimeoutError):
                rec = topology.cached_queue(self.names, name) or await topology.queue(
                    self.names, name
                )
                if rec is not None and rec.owner == self.owner:
                    await topology.delete_queue(self.names, rec)

    async def shutdown(self, grace: float) -> None:
        """The frontend stops: answer what was read, then connection.close 320."""
        if self.closing:
            return
        await self._wait_busy(grace)
        self.close_connection(
            ConnectionException(
                CONNECTION_FORCED,
                "broker forced connection closure with reason 'shutdown': node shutting down,"
                " reconnect",
            )
        )

    def core_lost(self, reason: str) -> None:
        self.close_connection(
            ConnectionException(CONNECTION_FORCED, f"lost the connection to the core: {reason}")
        )

    # ==== the handshake (handshake.py) =======================================================
    def opened(self) -> None:
        """connection.open-ok went out: the handshake timeout is over."""
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None

    # ==== what the channels share ============================================================
    def authorize(self, permission: Permission, destination: str) -> None:
        key = (permission, destination)
        if key in self._allowed:
            return
        assert self.principal is not None
        try:
            self.hub.auth.authorize(self.principal, permission, destination)
        except PolymqError as exc:
            raise ChannelException(
                ACCESS_REFUSED,
                f"{permission.value} access to {destination} refused for user "
                f"'{self.principal.name}': {exc}",
            ) from None
        if len(self._allowed) < 1024:
            self._allowed.add(key)

    def logged_in(self, principal: Principal) -> None:
        """The connection acts as ``principal`` from now on (the login, or a new secret:
        permissions are checked again)."""
        self.principal = principal
        self.tracked.user = principal.name
        self._allowed.clear()

    def recheck_login(self) -> None:
        """The users were reloaded: go on with the grants the login has now (its remembered
        decisions forgotten); a channel with a consumer on a queue they no longer let it
        read is closed (403 ACCESS_REFUSED: its unacknowledged messages go back), and a
        login that no longer holds (its user removed, as RabbitMQ does, or its password or
        token changed) closes the connection (320 CONNECTION_FORCED)."""
        principal = self.principal
        if principal is None or self.closing:
            return  # (a login under way reads the users as they are now)
        now = self.hub.auth.refresh(principal)
        if now is None:
            why = "broker forced connection closure with reason 'login revoked': " + revoked(
                principal
            )
            self.close_connection(ConnectionException(CONNECTION_FORCED, why))
            return
        if now == principal:
            return
        self.logged_in(now)
        for ch in self.channels.opened():
            for consumer in list(ch.consumers.by_tag.values()):
                try:
                    self.authorize(Permission.READ, consumer.core_queue)
                except ChannelException:
                    why = (
                        f"access to queue '{consumer.queue}' in vhost '{self.vhost}' refused "
                        f"for user '{now.name}': read permission withdrawn by a users reload"
                    )
                    self.channels.close(ch.number, ChannelException(ACCESS_REFUSED, why))
                    break

    def client(self) -> Client:
        """The frontend's client of the core; Unavailable while there is none."""
        return self.hub.link.get()

    @property
    def link(self) -> CoreLink:
        return self.hub.link

    @property
    def topology(self) -> Topology:
        return self.hub.topology
