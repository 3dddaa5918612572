"""One STOMP connection, over TCP or WebSocket (see ``transports.py``): the session handler.

Reading: ``data_received`` feeds the sans-IO codec and handles its frames in order (what
each frame asks is ``commands.py``'s). Most frames are handled at once, without awaiting
anything: a SEND joins the batch of its destination (published to the core, through the
frontend's one shared client, when the read is done; its RECEIPT goes out when the core
answered, after fsync for persistent messages), an ACK/NACK is a fire-and-forget core
ack/nack. A frame that needs an answer before the next
one may be read (CONNECT, SUBSCRIBE, COMMIT, DISCONNECT, a control SEND, the first use of a
temp queue) runs as the session's one *busy* task; until it is done the frames behind it wait
in the codec and reading pauses.

Writing: every frame out is encoded at once and appended to one output buffer, written to
the transport once per loop iteration while it drains. Reading pauses while that buffer holds
more than ``stomp_write_buffer`` bytes, while the busy task runs, or while too many SENDs
await the core (``stomp_max_inflight``).

Errors: whatever refuses a frame raises a :class:`~polymq_stomp.frames.RemoteStompError`
(or a ``polymq`` ``RequestError`` from the core); the session then writes an ERROR frame with
a ``message`` header and an explaining body (and the frame's ``receipt`` as ``receipt-id``),
flushes it, and closes (a lingering close: the client gets to read it). Closing releases the
connection's core subscriptions (their unacknowledged messages go back to their queues) and
deletes its temp queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Coroutine
from functools import partial
from typing import Any, Final

from polymq.client import Client
from polymq.errors import (
    ConnectionClosed,
    Forbidden,
    NotFound,
    PolymqError,
    RequestError,
    Unauthorized,
    Unavailable,
)
from polymq.types import AckMode
from polymq_server.auth.provider import Permission, Principal
from polymq_server.link.connections import revoked
from polymq_server.names import VhostNames
from polymq_server.sessions.frontend import FrontendSession

from .codec import CLOSED, NEED_DATA, Role, State, StompConnection
from .commands import BY_NAME
from .delivery import StompSubscription
from .frames import Command, Frame, Heartbeat, LocalStompError, RemoteStompError
from .handshake import VersionMismatch, agree, version_error
from .heartbeat import Heartbeats
from .hub import StompHub
from .metrics import StompMetrics
from .publisher import StompPublisher
from .refusal import Refused
from .subscription import Subscriptions, release
from .targets import ConnectionTargets
from .transports import Transport, WsTransport
from .vhost import DEFAULT_VHOST

__all__ = ["StompSession"]

log = logging.getLogger(__name__)

_DRAIN_TIMEOUT: Final = 10.0  # seconds DISCONNECT waits for SENDs to be answered


class StompSession(FrontendSession):
    """The STOMP side of one connection (the transport's endpoint; writing, reading's pauses,
    its tasks and the close of the transport are
    :class:`~polymq_server.sessions.frontend.FrontendSession`'s)."""

    transport: Transport
    metrics: StompMetrics

    def __init__(self, hub: StompHub, transport: Transport) -> None:
        super().__init__(transport)
        s = hub.settings
        self.hub = hub
        self.settings = s
        self.metrics = hub.metrics
        self.codec = StompConnection(
            Role.SERVER,
            max_frame=min(s.stomp_max_frame_before_login, s.stomp_max_frame),  # until CONNECTED
            max_headers=s.stomp_max_headers,
            max_header_length=s.stomp_max_header_length,
        )
        self.conn_id = secrets.token_hex(6)
        self.version = "1.0"
        self.principal: Principal | None = None
        self.vhost = DEFAULT_VHOST
        self.client_id = ""  # CONNECT's client-id header: names durable subscriptions' queues
        self.vhost_prefix = ""  # what starts the core names of the vhost's destinations
        # closing (True once an ERROR or DISCONNECT is on its way): read nothing more
        self.subscriptions = Subscriptions(self)
        self.publisher = StompPublisher(self)
        self.targets = ConnectionTargets(self)  # where its destinations lead, its own queues
        # (by the permission's value: checked per SEND, and an Enum member hashes in Python)
        self._allowed: set[tuple[str, str]] = set()
        # writing
        self._ack_after_write: dict[StompSubscription, int] = {}
        self._unwritten: set[StompSubscription] = set()
        self._in_counts: dict[str, int] = {}
        self._in_bytes = 0
        self.heartbeats: Heartbeats | None = None  # from CONNECTED on (heartbeat.py)
        hub.sessions.add(self)
        # its place in the connection limits (refused: told with an ERROR at its CONNECT)
        self.admission = hub.connections.admit()
        self.publishing = False  # it sent a SEND: held while a resource alarm is on
        self._handshake: asyncio.TimerHandle | None = self.loop.call_later(
            s.handshake_timeout, self._handshake_expired
        )
        self.metrics.connections.labels(transport.kind).inc()
        self.metrics.connections_opened.labels(transport.kind).inc()
        self.tracked = hub.link.connections.open(  # (the admin API's view of it)
            "stomp-ws" if transport.kind == "ws" else "stomp",
            transport.peer,
            self._closed_by_admin,
            lambda: {"subscriptions": len(self.subscriptions)},
        )
        self.tracked.recheck = self.recheck_login  # (after a users reload)

    def __repr__(self) -> str:
        return f"<stomp session {self.conn_id} {self.transport.kind} {self.transport.peer}>"

    @property
    def open(self) -> bool:
        """CONNECTED went out and nothing has closed the connection since."""
        return not self.closing and self.codec.state is State.OPEN

    # ==== transport events (transports.Endpoint) ============================================
    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        self._in_bytes += len(data)
        if self.closing:
            return
        self.codec.receive_data(data)
        self._process()
        self._schedule()

    def eof_received(self) -> None:
        if self.closing:
            return
        self.codec.receive_data(b"")
        self._process()

    def _tick(self) -> None:
        """Once per loop iteration with something to do: the SENDs read in it go to the core
        (one batch per destination, whatever the number of reads or WebSocket messages they
        came in), the frames written in it go to the transport, the counts to the metrics."""
        self._tick_scheduled = False
        if not self.closing:
            self.publisher.flush()
        counts = self._in_counts
        if counts:
            frames_in = self.metrics.frames_in
            for name, n in counts.items():
                frames_in[name].inc(n)
            counts.clear()
        if self._in_bytes:
            self.metrics.bytes_in.inc(self._in_bytes)
            self._in_bytes = 0
        self._flush()

    def connection_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        self.closing = True
        self._teardown()
        self.hub.sessions.discard(self)
        self.hub.link.connections.close(self.tracked)
        self.admission.release()
        self.metrics.connections.labels(self.transport.kind).dec()

    # ==== reading ============================================================================
    def _process(self) -> None:
        """Handle the frames the codec holds, until one needs the busy task."""
        codec = self.codec
        counts = self._in_counts
        try:
            while self._busy is None and not self.closing:
                try:
                    event = codec.next_event()
                except RemoteStompError as exc:
                    self.fail(exc.message, exc.detail, "protocol")
                    return
                if event is NEED_DATA:
                    break
                if event is CLOSED:  # the client closed its side
                    self._close()
                    break
                if isinstance(event, Heartbeat):
                    counts["HEARTBEAT"] = counts.get("HEARTBEAT", 0) + 1
                    continue
                assert isinstance(event, Frame)
                name = event.command._value_
                counts[name] = counts.get(name, 0) + 1
                try:
                    BY_NAME[name](self, event)
                except Exception as exc:  # refusals, the core's errors, and bugs (logged)
                    self.refuse(exc, event)
                    return
        finally:
            self.update_reading()

    def refuse(self, exc: BaseException, frame: Frame | None = None) -> None:
        """Answer a refused frame with an ERROR (and close)."""
        receipt = frame.get("receipt") if frame is not None else None
        if isinstance(exc, Refused):
            self.fail(exc.message, exc.detail, exc.reason, receipt)
        elif isinstance(exc, RemoteStompError):
            self.fail(exc.message, exc.detail, "protocol", receipt)
        elif isinstance(exc, Forbidden):  # as RabbitMQ names the AMQP errors behind these
            self.fail("access_refused", f"ACCESS_REFUSED - {exc.message}", "forbidden", receipt)
        elif isinstance(exc, Unauthorized):
            self.fail("access_refused", f"ACCESS_REFUSED - {exc.message}", "auth", receipt)
        elif isinstance(exc, NotFound):
            self.fail("not_found", f"NOT_FOUND - {exc.message}", "core", receipt)
        elif isinstance(exc, Unavailable | ConnectionClosed | TimeoutError):
            self.fail("the broker is unavailable", str(exc) or "timeout", "unavailable", receipt)
        elif isinstance(exc, RequestError):
            what = frame.command.value if frame is not None else "request"
            self.fail(f"{what} refused: {exc.code}", exc.message, "core", receipt)
        else:
            log.error("stomp %s: internal error", self, exc_info=exc)
            self.fail("internal error", f"internal error: {exc!r}"[:500], "internal", receipt)

    def start_busy(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None:
        """Run ``coro`` before any later frame is read (a frame that needs an answer first)."""
        self.publisher.flush()  # SENDs read before this frame go first
        self._run_busy(coro, partial(self._busy_done, frame))

    def _busy_done(self, frame: Frame, exc: BaseException | None) -> None:
        if exc is not None:
            self._task_failed(frame, exc)
            return
        if not self.closing:
            self._process()
            self._schedule()

    def spawn(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None:
        """A task of this session nothing waits for (e.g. an UNSUBSCRIBE's receipt)."""
        self._run_task(coro, partial(self._task_failed, frame))

    def _task_failed(self, frame: Frame, exc: BaseException) -> None:
        if not self.closing:
            self.refuse(exc, frame)

    def update_reading(self) -> None:
        self._set_reading(
            not self.closing
            and (
                self._busy is not None
                or self._out_bytes > self.settings.stomp_write_buffer
                or self.publisher.full
                or (self.publishing and bool(self.hub.link.alarms))  # held by an alarm
            )
        )

    # ==== writing ============================================================================
    def _send(self, frame: Frame) -> None:
        if self.closing:
            return  # after an ERROR nothing more goes out
        try:
            data = self.codec.send(frame)
        except LocalStompError as exc:
            log.warning("stomp %s: cannot send %s: %s", self, frame.command.value, exc.detail)
            return
        self.metrics.frames_out[frame.command._value_].inc()
        self._write(data)

    def receipt(self, receipt_id: str, *extra: tuple[str, str]) -> None:
        self._send(Frame(Command.RECEIPT, (("receipt-id", receipt_id), *extra)))

    def write_messages(
        self, sub: StompSubscription, frames: list[bytes], nbytes: int, last_tag: int
    ) -> None:
        """MESSAGE frames of ``sub`` (see ``Deliveries.deliver``)."""
        self._out += frames
        self._out_bytes += nbytes
        if sub.topic:
            self._unwritten.add(sub)
        if sub.ack_on_write:
            self._ack_after_write[sub] = last_tag
        self.metrics.frames_out["MESSAGE"].inc(len(frames))
        self.tracked.messages_out += len(frames)
        self._schedule()

    def log_unsendable(self, exc: LocalStompError) -> None:  # pragma: no cover - a bug
        log.warning("stomp %s: cannot send a message: %s", self, exc.detail)

    def _written(self, force: bool) -> None:
        if self._unwritten:
            for sub in self._unwritten:
                sub.unwritten = sub.unwritten_bytes = 0
            self._unwritten.clear()
        if self._ack_after_write:
            acks, self._ack_after_write = self._ack_after_write, {}
            if not force:  # on an ERROR: left unacked, so they go back to the queue
                for sub, tag in acks.items():
                    if not sub.closed and sub.core is not None:
                        sub.core.ack(tag)

    # ==== closing ============================================================================
    def fail(self, message: str, detail: str, reason: str, receipt_id: str | None = None) -> None:
        """Write an ERROR frame, flush it, close the connection."""
        if self.closing:
            return
        self.closing = True
        self.metrics.error(reason)
        self.metrics.frames_out["ERROR"].inc()
        log.info("stomp %s: ERROR %s: %s", self, message, detail)
        self._write(self.codec.error_bytes(message, detail, receipt_id))
        self._close()

    async def disconnect(self, frame: Frame) -> None:
        """Answer every SEND read before; release the subscriptions (what is unacknowledged
        goes back to its queue) and temp queues at the core; then RECEIPT, and close."""
        await self.publisher.drain(_DRAIN_TIMEOUT)
        self._flush()  # MESSAGE frames already made go out first (auto ones are acked)
        subs = self.subscriptions.close_all()
        cores = [sub.core for sub in subs if sub.core is not None and not sub.core.closed]
        temps = self.targets.take_owned()
        client = self.hub.link.client
        if client is not None and not client.closed:
            with contextlib.suppress(PolymqError, TimeoutError):
                await asyncio.wait_for(release(cores, temps, self.hub.link), _DRAIN_TIMEOUT)
                await asyncio.wait_for(client.ping(), _DRAIN_TIMEOUT)  # acks processed
        receipt = frame.get("receipt")
        if receipt is not None:
            self.receipt(receipt)
        self._close()  # after what is written

    def _teardown(self) -> None:
        """Release what the connection holds at the core (once)."""
        if self._torn_down:
            return
        self._torn_down = True
        if self.heartbeats is not None:
            self.heartbeats.stop()
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        self._cancel_tasks()
        self.publisher.close()
        subs = self.subscriptions.close_all()
        cores = [sub.core for sub in subs if sub.core is not None and not sub.core.closed]
        temps = self.targets.owned()
        link = self.hub.link
        if (cores or temps) and link.connected:
            link.spawn(release(cores, temps, link), f"releasing {self}")

    def _closed_by_admin(self, reason: str) -> None:
        self.fail("connection closed", reason, "closed")

    async def shutdown(self, grace: float) -> None:
        """The frontend stops: answer what was read, then ERROR "shutting down"."""
        if self.closing:
            return
        self.transport.pause_reading()
        self._reading_paused = True
        await self._wait_busy(grace)  # (its outcome is handled by _busy_done)
        if not self.closing:
            self.publisher.flush()
            await self.publisher.drain(grace)
        self.fail(
            "shutting down",
            "node shutting down: reconnect (to another instance) to go on",
            "shutdown",
        )

    def slow_consumer(self, sub: StompSubscription) -> None:
        if sub.outstanding >= sub.window and sub.mode is not AckMode.AUTO:
            why = f"{sub.outstanding} messages are unacknowledged (the window is {sub.window})"
        else:
            why = f"{sub.unwritten} messages / {sub.unwritten_bytes} bytes wait for the socket"
        self.fail(
            "slow consumer",
            f"subscription {sub.id!r} to {sub.target.stomp}: {why}; topic messages cannot "
            "wait (with x-slow-policy: drop they are dropped instead)",
            "slow-consumer",
        )

    def subscription_ended(self, sub: StompSubscription, error: BaseException) -> None:
        """The core ended a subscription: its destination was deleted, or the link broke."""
        if self.closing:
            return
        if isinstance(error, ConnectionClosed | Unavailable) or (
            sub.core is not None and sub.core.client.closed
        ):
            detail = f"lost the connection to the core: {error}"
            self.fail("the broker is unavailable", detail, "unavailable")
        else:
            self.fail(
                "subscription cancelled",
                f"subscription {sub.id!r} to {sub.target.stomp} was cancelled: {error}",
                "subscription",
            )

    # ==== CONNECT (handshake.py, heartbeat.py) ===============================================
    async def connect(self, frame: Frame) -> None:
        """CONNECT (or STOMP): agree what it asks, act on it, answer CONNECTED."""
        try:
            agreed = await agree(
                frame,
                self.settings,
                auth=self.hub.auth,
                link=self.hub.link,
                admission=self.admission,
                transport_host=self.transport_host(),
                peer=self.transport.peer,
            )
        except VersionMismatch as exc:
            self._version_error(exc.offered)
            return
        principal, version, vhost = agreed.principal, agreed.version, agreed.vhost
        self.principal = principal
        self.version = version
        self.vhost = vhost
        self.tracked.user, self.tracked.vhost = principal.name, vhost
        self.vhost_prefix = VhostNames(vhost).prefix
        self.client_id = agreed.client_id
        self.codec.negotiate(version)
        self.codec.max_frame = self.settings.stomp_max_frame
        self._send(agreed.connected(self.conn_id))
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        send_ms, expect_ms = agreed.heartbeat
        grace = self.settings.stomp_heartbeat_grace
        self.heartbeats = Heartbeats(self, send_ms, expect_ms, grace)
        log.debug("stomp %s: connected as %s (STOMP %s)", self, principal.name, version)

    def _handshake_expired(self) -> None:
        """No CONNECTED within the handshake timeout (no CONNECT, or one still being
        checked): ERROR, then the socket is closed."""
        self._handshake = None
        if not self.closing and self.codec.state is not State.OPEN:
            timeout = self.settings.handshake_timeout
            self.fail(
                "Handshake timeout",
                f"no CONNECT (login) within {timeout:g} seconds of connecting",
                "handshake",
            )

    def _version_error(self, offered: str) -> None:
        """ERROR with a ``version`` header listing what we speak (STOMP 1.2 says so)."""
        self.closing = True
        self.metrics.error("version")
        self.metrics.frames_out["ERROR"].inc()
        log.info("stomp %s: ERROR Version mismatch: the client accepts %r", self, offered[:100])
        self._write(self.codec.send(version_error()))
        self._close()

    # ==== what the handlers share ============================================================
    def authorize(self, permission: Permission, destination: str) -> None:
        """Forbidden unless this connection's principal holds ``permission``."""
        key = (permission._value_, destination)
        if key in self._allowed:
            return
        assert self.principal is not None
        own_temp = destination.startswith(f"queue/tmp.{self.conn_id}.")
        if not (own_temp and self.principal.allows(permission, destination)):
            # (this connection's own temporary queues are reserved to it, not from it: its
            # grants alone decide; anything else, the reserved names too: polymq_server.names)
            self.hub.auth.authorize(self.principal, permission, destination)
        if len(self._allowed) < 1024:
            self._allowed.add(key)

    def recheck_login(self) -> None:
        """The users were reloaded: go on with the grants the login has now, its remembered
        decisions forgotten; a subscription they no longer let it read ends the connection
        (ERROR ``access_refused``), as does a login that no longer holds (its user removed,
        its password or token changed)."""
        principal = self.principal
        if principal is None or self.closing:
            return  # (a login under way reads the users as they are now)
        now = self.hub.auth.refresh(principal)
        if now is None:
            self.fail("access_refused", f"ACCESS_REFUSED - {revoked(principal)}", "auth")
            return
        if now == principal:
            return
        self.principal = now
        self._allowed.clear()
        for sub in list(self.subscriptions.by_id.values()):
            try:
                self.authorize(Permission.READ, sub.reads)
            except Forbidden as exc:
                detail = (
                    f"ACCESS_REFUSED - subscription {sub.id!r} to {sub.target.stomp}: "
                    f"{exc.message} (withdrawn by a users reload)"
                )
                self.fail("access_refused", detail, "forbidden")
                return

    def transport_host(self) -> str | None:
        """The host name a WebSocket client opened its socket on (its Host header)."""
        if isinstance(self.transport, WsTransport):
            host = self.transport.request.host
            return host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return None

    def client(self) -> Client:
        """The frontend's client of the core; Unavailable while there is none."""
        return self.hub.link.get()
