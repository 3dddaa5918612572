"""One client connection to the core: a reader that feeds the codec, one writer.

Reading: ``data_received`` feeds the sans-IO codec and hands each event to the broker.
Requests answered synchronously are replied to in the same flush; those that wait (a
persistent publish waiting for fsync, a pull waiting for messages) reply when their future
is done. While too many requests wait, reading pauses (back-pressure to the producer).

Writing (:class:`~polymq_core.sessionoutput.SessionOutput`, a mixin of the session):
replies and deliveries collect in the session and go out as one frame per loop iteration.
When the socket does not drain (``pause_writing``), deliveries stay here, counted
per subscription; a subscription whose backlog passes its ``buffer_messages`` /
``buffer_bytes`` gets its slow-consumer policy: ``disconnect`` closes this connection (every
unacked and unsent queue message goes back to its queue for others), ``drop`` drops topic
messages for it alone. Queues and streams never wait for a slow session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from polymq import inproc
from polymq.codec import NEED_DATA, Connection, Role
from polymq.errors import Forbidden, RemoteProtocolError, RequestError, Unavailable
from polymq.events import (
    Cancelled,
    Event,
    Fail,
    Goodbye,
    Hello,
    Ok,
    Publish,
    Pulled,
    Subscribe,
    Unsubscribe,
    Welcome,
)
from polymq.inproc import PipeEnd
from polymq.types import Destination, Message
from polymq_server.auth.provider import INTERNAL_PRINCIPAL, AuthProvider, Permission
from polymq_server.link.connections import Tracked, revoked
from polymq_server.resources import Admission

from .destinations.subscription import Subscription
from .forwarding.handover import is_handover
from .forwarding.relay import Leaders, Relay, RelayHost
from .handlers.sids import SidTable
from .identities import PEER_CLIENT
from .metrics import protocol_label
from .sessionoutput import Backlog, SessionOutput

if TYPE_CHECKING:
    from polymq_server.auth.provider import Principal
    from polymq_server.resources import ConnectionLimits

    from .alarms import ResourceMonitor
    from .handlers.context import HandlerContext

log = logging.getLogger(__name__)

_MAX_WAITING = 20_000  # requests awaiting an answer before reading pauses
# seconds between the words (Ok for request 0) said to a client whose reading is held: its
# pings are not read, and its heartbeat (polymq.heartbeat) must not take the core for hung
_HELD_WORD_EVERY = 1.0


class SessionHost(RelayHost, Protocol):
    """What a session uses of the broker (a protocol, so that this module need not import
    ``broker.py``, which names Session): what its relay uses (a session hands its broker
    on to it), the cluster, the wire port's connection limits, the resource alarms, the
    login and its auth, what its handlers share (a users reload checks again the
    destinations its subscriptions name), the dispatch of a request, and the calls that keep
    the broker's list of sessions."""

    auth: AuthProvider
    cluster: Leaders | None
    connections: ConnectionLimits
    monitor: ResourceMonitor
    server_name: str
    context: HandlerContext

    async def authenticate(
        self, hello: Hello, auth: AuthProvider | None = None, source: str | None = None
    ) -> Principal: ...
    def handle(self, session: Session, event: Event) -> Any: ...
    def session_opened(self, session: Session) -> None: ...
    def logged_in(self, session: Session) -> None: ...
    def session_closed(self, session: Session) -> None: ...


class Session(SessionOutput, asyncio.Protocol):
    broker: SessionHost  # (what writing uses of it is narrower: OutputHost)

    def __init__(self, broker: SessionHost, auth: AuthProvider | None = None) -> None:
        self.broker = broker
        self.auth = auth  # the listener's own login rules (the peers'), else the core's
        # (in a cluster, what carries messages is kept as it came, for a relay to pass on)
        self.conn = Connection(
            Role.SERVER,
            max_frame=broker.settings.max_frame,
            keep_raw=broker.cluster is not None,
            max_login_frame=broker.settings.max_login_frame,
        )
        self.transport: asyncio.Transport | None = None
        self.name = "?"
        self.source: str | None = None  # the client's address (None: in-process)
        self.protocol = "native"
        self.client = ""  # what the client calls itself (Hello.client)
        # a leaving node handing its transient messages to this one
        # (polymq_core.forwarding.handover):
        # its publishes keep their ids and delivery counts
        self.handing = False
        self.speaks_for_core = False  # the admin API's own link (Broker.logged_in)
        self.principal: Principal | None = None
        # its place in the wire port's connection limits (polymq_server.resources)
        self.admission = Admission(None, None)
        self.publishing = False  # a native client that has published (held by an alarm)
        self.messages_in = self.messages_out = 0  # published, delivered (the admin API's)
        self.tracked: Tracked | None = None  # its entry in the broker's clients
        self._alarm_held = False  # not reading: a resource alarm holds this publisher
        # destinations named in requests, parsed and authorized (HandlerContext.destination)
        self.destinations: dict[tuple[str, Any, bool], Destination] = {}
        self.subs: SidTable[Subscription] = SidTable()  # by sid
        self.first_tags: dict[int, int] = {}  # sid -> its first delivery tag, if not 1 (moved)
        # sid -> what a moved subscription holds unacked (message id -> tag), while it is
        # subscribed again here (resubscribe_here)
        self.claims: dict[int, dict[str, int]] = {}
        self._replies: list[Event] = []
        self._raws: dict[int, bytes] = {}  # index in _replies -> that event's encoded op
        self._backlog: dict[Subscription, Backlog] = {}
        self._flush_scheduled = False
        self._paused = False  # the socket is not draining
        self._reading_paused = False
        self._waiting = 0
        self._answering: set[asyncio.Future[Any]] = set()  # requests still to be answered
        self._quiescing = False
        self._hello_pending = False
        self._handshake: asyncio.TimerHandle | None = None  # closes a peer slow to log in
        self._held_word: asyncio.TimerHandle | None = None  # (see _reading_held)
        self._closed = False
        self._told_unanswered = False  # logged a failed request nobody waits for
        self.loop = asyncio.get_event_loop()
        # in a cluster: forwards requests for shards led by other nodes
        self.relay = Relay(self, broker, broker.cluster) if broker.cluster is not None else None

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.transport.set_write_buffer_limits(high=1024 * 1024)  # type: ignore[union-attr]
        peer = transport.get_extra_info("peername")
        self.name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.source = str(peer[0]) if isinstance(peer, tuple) else None
        # (polymq run's own frontends come over an in-process pipe: no file, no limit)
        self.admission = self.broker.connections.admit(counted=not isinstance(transport, PipeEnd))
        self.passes_events = inproc.passes_events(transport)
        refused = self.admission.refused
        if refused is not None:
            self._closed = True  # (never counted: nothing to release)
            transport.write(self.conn.goodbye("unavailable", refused))  # type: ignore[attr-defined]
            transport.close()
            return
        self.broker.session_opened(self)
        timeout = self.broker.settings.handshake_timeout
        self._handshake = self.loop.call_later(timeout, self._handshake_expired, timeout)

    def _handshake_expired(self, timeout: float) -> None:
        """No Welcome within the handshake timeout: the peer never (or slowly) said Hello,
        or its login is still being checked. Closed, as RabbitMQ closes such sockets."""
        self._handshake = None
        if self.principal is not None or self._closed:
            return
        self.broker.sensors.on_protocol_error()
        log.info("session %s: no login within %gs: closed", self.name, timeout)
        self.close("timeout", f"no Hello (login) within {timeout:g} seconds of connecting")

    def data_received(self, data: bytes) -> None:
        self.broker.monitor.read(len(data))  # (may raise the memory alarm: reading pauses)
        self.conn.receive_data(data)
        self._process()

    def events_received(self, events: list[Event], size: int) -> None:
        """What a frontend in this process wrote without encoding it (:mod:`polymq.inproc`),
        served as if it had come in a frame of ``size`` bytes."""
        self.broker.monitor.read(size)
        self.conn.receive_events(events)
        self._process()

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self._process()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        if self._held_word is not None:
            self._held_word.cancel()
            self._held_word = None
        for fut in list(self._answering):
            fut.cancel()  # e.g. a waiting pull must not lease messages to nobody
        backlog, self._backlog = self._backlog, {}
        for sub in list(self.subs.values()):
            pending = backlog.get(sub)
            self._drop_sub(sub, pending)
        self.subs.clear()
        if self.relay is not None:
            self.relay.close()
        self.broker.session_closed(self)

    def pause_writing(self) -> None:
        self._paused = True
        if self.relay is not None:
            self.relay.pause()

    def resume_writing(self) -> None:
        self._paused = False
        if self.relay is not None:
            self.relay.resume()
        self._flush()
        for sub in list(self.subs.values()):
            sub.source.pump()

    # ---- reading --------------------------------------------------------------------------
    def _process(self) -> None:
        conn = self.conn
        while not self._hello_pending and not self._closed:
            try:
                event = conn.next_event()
            except RemoteProtocolError as exc:
                self.broker.sensors.on_protocol_error()
                log.info("session %s: protocol error: %s", self.name, exc)
                self.close("protocol-error", str(exc))
                return
            if event is NEED_DATA:
                return
            if isinstance(event, Goodbye):
                self.close(None, "")
                return
            if isinstance(event, Hello):
                self._hello(event)
                continue
            assert isinstance(event, Event)
            self.request(event, self.conn.raw)

    def _hello(self, hello: Hello) -> None:
        self.client = str(hello.client)
        self.protocol = protocol_label(self.client)
        self._hello_pending = True
        if self.transport is not None:  # what comes behind the Hello waits for the login
            self.transport.pause_reading()
        task = self.loop.create_task(self.broker.authenticate(hello, self.auth, self.source))
        task.add_done_callback(self._hello_done)

    def _hello_done(self, task: asyncio.Task[Principal]) -> None:
        self._hello_pending = False
        if self._closed:
            return
        exc = task.exception()
        if exc is not None:
            code = exc.code if isinstance(exc, RequestError) else "unauthorized"
            self.close(code, str(exc))
            return
        principal = task.result()
        if principal.name != INTERNAL_PRINCIPAL:  # (polymq's own links: no user limit)
            refused = self.admission.login(principal.name)
            if refused is not None:
                self.close("unavailable", refused)
                return
        self.principal = principal
        if self.protocol == PEER_CLIENT:  # never forwarded again (relay.py): no raws to keep
            self.conn.stop_keeping_raw()
        self.handing = is_handover(self.client, principal.name)
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        if self.transport is not None and not self._reading_paused and not self._alarm_held:
            self.transport.resume_reading()
        self.destinations.clear()  # (none is known before: requests wait for the hello)
        self.broker.sensors.on_connection(self.protocol, 1)
        self.broker.logged_in(self)
        if self.tracked is not None:  # (a users reload has it check its login again)
            self.tracked.recheck = self.recheck_login
        self.reply(Welcome(1, self.broker.server_name, self.name, self.broker.settings.limits()))
        self._process()

    def request(self, event: Event, raw: bytes | None, held: Any = None) -> None:
        """Serve ``event`` here or through the relay (``raw``: its op as it came, if it
        carries messages; ``held``: the relay held it and takes it again)."""
        if type(event) is Publish:
            self.messages_in += len(event.messages)
        if type(event) is Publish and self.admission.user is not None and not self.publishing:
            self.publishing = True  # a native publisher: held while a resource alarm is on
            if self.broker.monitor.alarms:
                self.alarm_changed()
        relay = self.relay
        if relay is not None:
            try:
                if relay.take(event, raw, held):
                    return
            except RequestError as exc:
                self.broker.sensors.on_request_error(exc.code)
                rid = getattr(event, "rid", 0)
                if rid:
                    self.reply(Fail(rid, exc.code, exc.message))
                return
        self.handle_here(event)

    def handle_here(self, event: Event) -> None:
        """Serve ``event`` on this node (no forwarding) and answer it."""
        rid: int = getattr(event, "rid", 0)
        try:
            result = self.broker.handle(self, event)
        except RequestError as exc:
            self.broker.sensors.on_request_error(exc.code)
            if rid:
                self.reply(Fail(rid, exc.code, exc.message))
            return
        except Exception as exc:  # a bug: answer it, keep serving this connection
            log.exception("session %s: %s failed", self.name, type(event).__name__)
            self.broker.sensors.on_request_error("internal")
            if rid:
                self.reply(Fail(rid, "internal", f"internal error: {exc!r}"[:500]))
            return
        if isinstance(result, Awaitable):
            self._waiting += 1
            if self._waiting >= _MAX_WAITING and not self._reading_paused and self.transport:
                self._reading_paused = True
                self.transport.pause_reading()
                self._reading_held()
            fut = asyncio.ensure_future(result)
            self._answering.add(fut)
            fut.add_done_callback(lambda f: self._answered(rid, f))
        elif rid:
            self.reply(result if isinstance(result, Event) else Ok(rid, result))

    def recheck_login(self) -> None:
        """The users were reloaded: go on with the grants the login has now (the
        destinations it authorized are forgotten), and end each subscription they no longer
        let it read (``Cancelled`` with ``forbidden``: what it held unacknowledged goes back);
        a login that no longer holds (its user removed, its password or token changed) is
        closed with a Goodbye (``unauthorized``)."""
        principal = self.principal
        if principal is None or self._closed:
            return  # (a login under way reads the users as they are now)
        auth = self.auth if self.auth is not None else self.broker.auth
        now = auth.refresh(principal)
        if now is None:
            log.info("session %s: %s", self.name, revoked(principal))
            self.close("unauthorized", revoked(principal))
            return
        if now == principal:
            return
        self.principal = now
        self.destinations.clear()
        for sub in list(self.subs.values()):
            try:
                auth.authorize(now, Permission.READ, sub.destination)
            except Forbidden as exc:
                if self.remove_sub(sub.sid) is not None:
                    self._withdrawn(sub.sid, exc)
                if self.relay is not None:
                    self.relay.requests.pop(sub.sid, None)  # (as an Unsubscribe does)
        relay = self.relay
        if relay is None:
            return
        for sid, remote in list(relay.subs.items()):  # (served by another node)
            request = relay.requests.get(sid)
            if request is None:
                continue
            try:
                self.broker.context.destination(
                    self, request.destination, Permission.READ, pattern=True
                )
            except Forbidden as exc:
                if remote.node:
                    relay.take(Unsubscribe(0, sid))  # (its leader lets it go)
                else:  # being moved: it stops moving
                    del relay.subs[sid], relay.requests[sid]
                self._withdrawn(sid, exc)

    def _withdrawn(self, sid: int, exc: Forbidden) -> None:
        """Subscription ``sid`` ended: a users reload withdrew the grant it needs."""
        self.reply(Cancelled(sid, exc.code, f"{exc.message} (withdrawn by a users reload)"))

    def alarm_changed(self) -> None:
        """A resource alarm went on or off: a native publisher's connection is read no more
        while one is on (what it sent already is served), and again once all clear."""
        hold = bool(self.broker.monitor.alarms) and self.publishing
        if hold == self._alarm_held or self.transport is None or self._closed:
            return
        self._alarm_held = hold
        if hold:
            self.transport.pause_reading()
            self._reading_held()
        elif not self._reading_paused and not self._hello_pending:
            self.transport.resume_reading()

    def _reading_held(self) -> None:
        """Reading this connection paused (a resource alarm holds the publisher, or too
        many of its requests wait): the pings of its client's heartbeat are not read, so
        the core says a word of its own, an ``Ok`` for request 0 (which answers nothing),
        every :data:`_HELD_WORD_EVERY` seconds while it does not read."""
        if self._held_word is None:
            self._held_word = self.loop.call_later(_HELD_WORD_EVERY, self._say_held_word)

    def _say_held_word(self) -> None:
        self._held_word = None
        if self._closed or not (self._alarm_held or self._reading_paused):
            return
        self.reply(Ok(0, None))
        self._reading_held()

    def _unanswered_failure(self, exc: BaseException) -> None:
        """A request sent without a request id (``publish_nowait``) failed once accepted (a
        write the store refused): nobody to answer, so the operator is told instead, in
        ``polymq_request_errors_total`` and in the log, once per connection."""
        code = exc.code if isinstance(exc, RequestError) else "internal"
        self.broker.sensors.on_request_error(code)
        if not self._told_unanswered:
            self._told_unanswered = True
            log.warning(
                "session %s: a request without a reply failed (%s); later ones on this "
                "connection are counted in polymq_request_errors_total, not logged",
                self.name,
                exc,
            )

    def _answered(self, rid: int, fut: asyncio.Future[Any]) -> None:
        self._waiting -= 1
        self._answering.discard(fut)
        resume = self._waiting < _MAX_WAITING // 2 and not self._quiescing
        if self._reading_paused and resume and self.transport:
            self._reading_paused = False
            if not self._alarm_held:
                self.transport.resume_reading()
        if not rid or self._closed:
            if not fut.cancelled():
                exc = fut.exception()  # retrieved: a failure with nobody to tell is not "unhandled"
                if exc is not None and not rid:
                    self._unanswered_failure(exc)
            return
        if fut.cancelled():
            self.reply(Fail(rid, "unavailable", "request cancelled (shutting down)"))
            return
        exc = fut.exception()
        if exc is None:
            result = fut.result()
            self.reply(result if isinstance(result, Event) else Ok(rid, result))
        elif isinstance(exc, RequestError):
            self.reply(Fail(rid, exc.code, exc.message))
        else:
            log.error("session %s: request failed", self.name, exc_info=exc)
            err = Unavailable(f"internal error: {exc}")
            self.reply(Fail(rid, err.code, err.message))

    # ---- subscriptions ----------------------------------------------------------------------
    def add_sub(self, sub: Subscription) -> None:
        self.subs[sub.sid] = sub

    def remove_sub(self, sid: int) -> Subscription | None:
        sub = self.subs.pop(sid, None)
        if sub is not None:
            self._drop_sub(sub, self._backlog.pop(sub, None))
        return sub

    def _drop_sub(self, sub: Subscription, pending: Backlog | None) -> None:
        sub.close()
        unsent: list[Message] = []
        if pending is not None:
            for tag, msg in zip(pending.tags, pending.messages, strict=True):
                if tag in sub.inflight:
                    continue  # unacked: detach() takes these back from the window
                unsent.append(msg)
        # auto-ack queue deliveries that never left: the queue takes them back as well
        for msg in unsent if sub.auto else ():
            sub.source.unsent(sub, msg)  # type: ignore[attr-defined]
        sub.source.detach(sub, requeue=[])
        self.broker.sensors.on_subscription(sub.destination.split("/", 1)[0], -1)

    def cancel(self, sub: Subscription, code: str, message: str) -> None:
        """The core ends a subscription (its destination was deleted)."""
        if self.subs.pop(sub.sid, None) is not None:
            sub.close()
            self._backlog.pop(sub, None)
            self.broker.sensors.on_subscription(sub.destination.split("/", 1)[0], -1)
            self.reply(Cancelled(sub.sid, code, message))

    def moved(
        self, sub: Subscription, reason: str, held: dict[int, str], seq: int | None = None
    ) -> None:
        """The shard of ``sub`` is led elsewhere now (cluster): subscribe it again there.
        What it held unacked (``held``: tag -> message id) it claims from the new leader,
        under the same tags (not delivered again); but not the deliveries still waiting
        here for the socket (:class:`~polymq_core.sessionoutput.Backlog`), which the
        client never had: claimed, they would stay checked out to it on the new leader,
        never delivered. Left unclaimed, they are ready there and delivered again.
        A stream's subscription (``seq``: the seq after the last entry its stream gave
        it) reads on there from the first entry the client did not get, not from the
        offset it was made with (``first`` read the whole stream again)."""
        if self.subs.pop(sub.sid, None) is None:
            return
        sub.close()
        unsent = self._backlog.pop(sub, None)
        if unsent is not None and held:
            never = set(unsent.tags)
            held = {tag: mid for tag, mid in held.items() if tag not in never}
        if unsent is not None and unsent.messages and seq is not None:
            seq = min(seq, unsent.messages[0].seq)
        self.broker.sensors.on_subscription(sub.destination.split("/", 1)[0], -1)
        if self.protocol == PEER_CLIENT:  # the origin node's relay moves it
            self.reply(Cancelled(sub.sid, "moved", reason))
        elif self.relay is not None:
            self.relay.relocate(sub.sid, sub.next_tag - 1, held, seq)
        else:
            self.reply(Cancelled(sub.sid, "unavailable", reason))

    def resubscribe_here(self, request: Subscribe, top: int, held: dict[int, str]) -> list[int]:
        """Take back a moved subscription now that this node leads its shard; its tags go
        on after ``top``, and the deliveries it holds (``held``: tag -> message id) are
        checked out to it again under their tags. Returns the tags so taken."""
        if request.sid in self.subs:
            return []
        self.first_tags[request.sid] = top + 1
        self.claims[request.sid] = {mid: tag for tag, mid in held.items()}
        try:
            self.broker.handle(
                self, Subscribe(0, request.sid, request.destination, request.options)
            )
        except RequestError as exc:
            self.reply(Cancelled(request.sid, exc.code, exc.message))
            return []
        finally:
            self.first_tags.pop(request.sid, None)
            self.claims.pop(request.sid, None)
        sub = self.subs.get(request.sid)
        return [tag for tag in held if sub is not None and tag in sub.inflight]

    # ---- closing ------------------------------------------------------------------------
    def quiesce(self) -> None:
        """Shutdown, step one: read no more requests (those already read are answered)."""
        self._quiescing = True
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    async def answered(self) -> None:
        """Shutdown, step two: wait until every request read so far has its answer."""
        if self._answering:
            await asyncio.wait(list(self._answering))

    def close(
        self, code: str | None, message: str, *, abort: bool = False, linger: float | None = None
    ) -> None:
        """Say Goodbye (with why) and close; ``abort`` drops what the socket still holds.

        ``linger`` (a slow consumer): the subscriptions are released now (what never reached
        the socket goes back to its queue), while what the socket holds, then the Goodbye, still
        go out to a peer that reads within ``linger`` seconds; after that the socket is aborted.
        Aborting at once would throw away auto-acked deliveries the peer never saw.
        """
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if code is not None:
            self._flush()
            try:
                transport.write(self.conn.goodbye(code, message))
            except Exception:  # pragma: no cover - the socket is going anyway
                pass
        if abort:
            self.connection_lost(None)  # requeue now; the peer is not reading anyway
            transport.abort()
            return
        if linger is not None:
            self.connection_lost(None)
            self.loop.call_later(linger, transport.abort)
        transport.close()


__all__ = ["Pulled", "Session", "SessionHost"]
