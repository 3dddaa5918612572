"""One connection to a polymq core, as the client holds it: the transport and the sans-IO
codec's :class:`~polymq.codec.Connection`, the requests waiting for their answers, and flow
control. :class:`~polymq.client.Client` is a :class:`CoreConnection` with the primitive API's
verbs on top; a :class:`~polymq.deliveries.Subscription` uses what is here (its
:class:`~polymq.deliveries.SubscriptionHost`) for its reading pauses and acks.

A core served in this process (:mod:`polymq.inproc`; ``polymq run``) is reached over an
in-process pipe, any other over TCP. Requests issued in the same loop iteration travel in one
frame (batching). Acks are fire-and-forget and coalesced. Writing waits while the socket
does not drain; reading pauses while a subscription has ``local_buffer`` undelivered
messages, which pushes back on the core (where the slow-consumer policy of that
subscription applies).

Every task and future is owned: :meth:`CoreConnection.close` fails pending requests with
:class:`~polymq.errors.ConnectionClosed` and ends every subscription's iterator.

**Failover.** A connection may know several core addresses (:mod:`polymq.addresses`; a name
stands for every IP it resolves to). It connects to the first that welcomes it. With a
``reconnect_timeout``, losing the connection (or a ``Goodbye`` ``shutdown``/``unavailable``)
is no error: its :class:`~polymq.failover.Failover` connects to another address and makes
the subscriptions and unanswered requests again there (see that module).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ssl import SSLContext
from typing import Any

from . import inproc
from .addresses import Address, expand
from .answers import CursorPage
from .codec import NEED_DATA, PROTOCOL_VERSION, Connection, Role, weight
from .deliveries import Lease, Subscription
from .errors import (
    ConnectionClosed,
    LocalProtocolError,
    PolymqError,
    RemoteProtocolError,
    Unavailable,
    error_from_code,
)
from .events import (
    Ack,
    Cancelled,
    Deliver,
    Event,
    Fail,
    Goodbye,
    Hello,
    Ok,
    Peeked,
    Polled,
    Pulled,
    Welcome,
)
from .failover import FAILOVER_CODES, Failover, Reconnected, Waiting
from .heartbeat import Heartbeat

__all__ = ["CoreConnection"]

log = logging.getLogger("polymq.client")  # the name users set levels on: the client's


@dataclass(frozen=True, slots=True)
class _Login:
    """How to connect and say hello, kept for the connections made again."""

    client: str
    user: str | None
    password: str | None
    token: str | None
    timeout: float
    ssl: SSLContext | bool | None


_FRAME_BYTES = 1024 * 1024  # bytes per frame of what is encoded for an in-process core, roughly


class _Protocol(asyncio.Protocol):
    """Hands what the transport reports to its :class:`CoreConnection`, while it is that
    connection's current one (a lost connection's late reports are ignored)."""

    def __init__(self, connection: CoreConnection) -> None:
        self.connection = connection
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop: no subclass

    def data_received(self, data: bytes) -> None:
        if self.connection._protocol is self:
            self.connection._data(data)

    def events_received(self, events: list[Event], size: int) -> None:
        """What a core in this process wrote without encoding it (:mod:`polymq.inproc`)."""
        if self.connection._protocol is self:
            self.connection.conn.receive_events(events)
            self.connection._data(b"", more=False)

    def eof_received(self) -> bool | None:
        if self.connection._protocol is self:
            self.connection._data(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.connection._protocol is self:
            self.connection._lost(exc)

    def pause_writing(self) -> None:
        if self.connection._protocol is self:
            self.connection._can_write.clear()

    def resume_writing(self) -> None:
        if self.connection._protocol is self:
            self.connection._can_write.set()


class CoreConnection:
    """The client's end of one connection to a polymq core: it owns the transport, the
    codec, the pending requests by request id, the subscriptions by subscription id, and
    flow control; with failover, the task that connects again."""

    def __init__(self, *, local_buffer: int = 10_000) -> None:
        self.local_buffer = local_buffer
        self.conn = Connection(Role.CLIENT)
        self._transport: asyncio.Transport | None = None
        self._protocol: _Protocol | None = None
        # each request's future, what makes the answer of its Ok's result (None: the
        # result as it is; publish_soon's future is answered so, without a task) and the
        # request itself (sent again after a failover)
        self._pending: dict[int, Waiting] = {}
        self._subs: dict[int, Subscription] = {}
        self._rids = itertools.count(1)
        self._sids = itertools.count(1)
        self._out: list[Event] = []
        self._flush_scheduled = False
        self._ack_subs: set[Subscription] = set()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._welcome: asyncio.Future[Welcome] | None = None
        self._reading_paused = False
        self.closed = False
        self.close_reason: BaseException | None = None
        self.server = ""
        self.limits: dict[str, Any] = {}
        # failover: the addresses as given, the one connected to, the settings
        self.addresses: list[Address] = []
        self.address: Address | None = None
        self.reconnect_timeout: float | None = None  # None: a loss ends the connection
        self.failover: Failover | None = None  # (with a reconnect_timeout)
        self._login: _Login | None = None
        # liveness: the heartbeat (None: none), and whether the core said anything since
        # it last looked
        self.heartbeat: Heartbeat | None = None
        self._heard = False

    # ---- connecting ----------------------------------------------------------------------
    async def _open(
        self,
        addresses: Sequence[Address],
        *,
        client: str,
        user: str | None,
        password: str | None,
        token: str | None,
        timeout: float,
        ssl: SSLContext | bool | None,
        reconnect_timeout: float | None = None,
        on_reconnect: Callable[[Reconnected], None] | None = None,
        heartbeat: float | None = None,
    ) -> None:
        """Connect to the first of ``addresses`` (each name expanded to its IPs) that
        welcomes us; returns once one did (its ``server`` and ``limits`` are known), else
        closes and raises (several addresses: :class:`ConnectionClosed` naming each).
        ``heartbeat``: seconds a core may take to answer a ping (:mod:`polymq.heartbeat`;
        None: no pings)."""
        self.addresses = list(addresses)
        self._login = _Login(client, user, password, token, timeout, ssl)
        self.reconnect_timeout = reconnect_timeout
        if reconnect_timeout is not None:
            self.failover = Failover(self, reconnect_timeout, timeout, on_reconnect)
        failures: list[tuple[Address, BaseException]] = []
        for address in await self._expanded():
            try:
                await self._attempt(address, timeout)
            except PolymqError as exc:
                failures.append((address, exc))
                continue
            if heartbeat is not None:
                self.heartbeat = Heartbeat(self, heartbeat)
                self.heartbeat.start()
            return
        err: BaseException = failures[-1][1]
        if len(failures) > 1:
            why = "; ".join(f"{a}: {e}" for a, e in failures)
            code = err.code if isinstance(err, ConnectionClosed) else "closed"
            err = ConnectionClosed(f"cannot connect to a polymq core: {why}", code)
        self._fail_all(err)
        raise err

    async def _expanded(self) -> list[Address]:
        """The addresses, each name as every IP it resolves to now (a core served in this
        process is reached by its name)."""
        loop = asyncio.get_running_loop()

        async def resolve(host: str, port: int) -> list[str]:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            return [str(info[4][0]) for info in infos]

        return await expand(self.addresses, resolve, lambda a: inproc.served(a.host, a.port))

    async def _attempt(self, address: Address, timeout: float) -> None:
        """Connect to ``address`` and say hello, as this connection's current protocol;
        returns once welcomed, else raises (a :class:`PolymqError`)."""
        login = self._login
        assert login is not None
        loop = asyncio.get_running_loop()
        proto = _Protocol(self)
        self._protocol = proto
        self.conn = Connection(Role.CLIENT)
        self._welcome = welcome = loop.create_future()
        self._reading_paused = False
        # a core in this process (polymq run) is reached without a socket
        if inproc.connect(address.server_name, address.port, lambda: proto) is None:
            tls = login.ssl or None
            try:
                await asyncio.wait_for(
                    loop.create_connection(
                        lambda: proto,
                        address.host,
                        address.port,
                        ssl=tls,
                        server_hostname=address.server_name if tls and address.name else None,
                    ),
                    timeout,
                )
            except (OSError, TimeoutError) as exc:
                if self._protocol is proto:
                    self._protocol = None
                raise ConnectionClosed(
                    f"cannot connect to polymq core at {address}: {exc}"
                ) from exc
        transport = proto.transport
        assert transport is not None
        try:
            hello = Hello(PROTOCOL_VERSION, login.client, login.user, login.password, login.token)
            if not welcome.done():  # (a core refusing the connection may say so first)
                transport.write(self.conn.send(hello))
            answer = await asyncio.wait_for(asyncio.shield(welcome), timeout)
        except BaseException as exc:
            if self._protocol is proto:
                self._protocol = None
            transport.abort()
            if isinstance(exc, TimeoutError):
                raise ConnectionClosed(
                    f"polymq core at {address}: no welcome within {timeout:g} s"
                ) from exc
            raise
        self._transport = transport
        self.address = address
        self.server = answer.server
        self.limits = dict(answer.limits)

    async def close(self) -> None:
        """Say goodbye to the core and end the connection: what is pending fails with
        :class:`~polymq.errors.ConnectionClosed`, every subscription's iterator ends."""
        if self.closed:
            return
        if self.failover is not None:
            await self.failover.cancel()
        if self.heartbeat is not None:
            await self.heartbeat.wait_stopped()
        self._flush()
        t = self._transport
        if t is not None and not t.is_closing():
            t.write(self.conn.goodbye("bye", "client closed"))
            t.close()
        self._fail_all(ConnectionClosed("client closed"))

    # ---- I/O -----------------------------------------------------------------------------
    def _data(self, data: bytes, *, more: bool = True) -> None:
        """Take ``data`` (``more=False``: nothing new, serve the events queued) and serve the
        events it completes."""
        self._heard = True
        if more:
            self.conn.receive_data(data)
        while True:
            try:
                ev = self.conn.next_event()
            except RemoteProtocolError as exc:
                log.error("polymq: protocol error from server: %s", exc)
                t = self._transport
                self._gone(exc, "protocol-error")
                if t is not None:
                    t.abort()
                return
            if ev is NEED_DATA:
                return
            self._event(ev)  # type: ignore[arg-type]

    def _event(self, ev: Event) -> None:
        if isinstance(ev, Deliver):
            sub = self._subs.get(ev.sid)
            if sub is not None:
                sub._push(ev.tags, ev.messages)
        elif isinstance(ev, Ok):
            if self.failover is not None and self.failover.retrying:
                self.failover.retrying.pop(ev.rid, None)
            waiting = self._pending.pop(ev.rid, None)
            if waiting is not None:
                answered, answer, _ = waiting
                if not answered.done():
                    if answer is None:
                        answered.set_result(ev.result)
                    else:
                        try:
                            answered.set_result(answer(ev.result))
                        except Exception as exc:  # a malformed answer fails its request only
                            answered.set_exception(exc)
        elif isinstance(ev, Pulled):
            fut = self._waiting(ev.rid)
            if fut is not None:
                fut.set_result([Lease(r, m) for r, m in zip(ev.leases, ev.messages, strict=True)])
        elif isinstance(ev, Peeked):
            fut = self._waiting(ev.rid)
            if fut is not None:
                fut.set_result(ev.messages)
        elif isinstance(ev, Polled):
            fut = self._waiting(ev.rid)
            if fut is not None:
                fut.set_result(CursorPage(ev.cursor, ev.messages, ev.receipts))
        elif isinstance(ev, Fail):
            err = error_from_code(ev.code, ev.message)
            failover = self.failover
            if failover is not None:
                if isinstance(err, Unavailable) and failover.retry(ev.rid):
                    return
                failover.retrying.pop(ev.rid, None)
            fut = self._waiting(ev.rid)
            if fut is not None:
                fut.set_exception(err)
            elif ev.rid == 0:
                log.warning("polymq: a fire-and-forget request failed: %s", err)
        elif isinstance(ev, Cancelled):
            if ev.code == "unavailable" and self.failover is not None:
                # (its shard found no leader, through this node: try another node, in a
                # session of its own, before giving up on it)
                sub = self._subs.get(ev.sid)
                if sub is not None and self._transport is not None:
                    why = f"the core cancelled the subscription to {sub.destination}: {ev.message}"
                    self._fail_over(ConnectionClosed(why, ev.code))
                    return
            sub = self._subs.pop(ev.sid, None)
            if sub is not None:
                sub._end(error_from_code(ev.code, ev.message))
        elif isinstance(ev, Welcome):
            if self._welcome is not None and not self._welcome.done():
                self._welcome.set_result(ev)
        elif isinstance(ev, Goodbye):
            reason: PolymqError
            if ev.code == "slow-consumer":
                reason = error_from_code(ev.code, ev.message)
            else:
                detail = f": {ev.message}" if ev.message else ""
                reason = ConnectionClosed(
                    f"the server closed the connection ({ev.code}){detail}", ev.code
                )
            self._gone(reason, ev.code)

    def _waiting(self, rid: int) -> asyncio.Future[Any] | None:
        """The future of request ``rid``, which this answer ends; None if nothing waits."""
        waiting = self._pending.pop(rid, None)
        if waiting is None or waiting[0].done():
            return None
        return waiting[0]

    def _lost(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        why = f"connection lost: {exc}" if exc else "connection closed by the server"
        self._gone(ConnectionClosed(why), "lost")

    def _gone(self, reason: PolymqError, code: str) -> None:
        """The current connection ended (``code``: the Goodbye's, or ``lost``): a
        connection being made fails that attempt; an open one fails over, or closes."""
        if self.closed:
            return
        welcome = self._welcome
        if welcome is not None and not welcome.done():
            welcome.set_exception(reason)
            self._protocol = None
            return
        if self.failover is not None and code in FAILOVER_CODES:
            self._fail_over(reason)
        else:
            self._fail_all(reason)

    def _fail_all(self, reason: BaseException) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self.closed = True
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self._protocol = None
        err = self.close_reason
        pending, self._pending = self._pending, {}
        for fut, _, _ in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(err)
        subs, self._subs = self._subs, {}
        for sub in subs.values():
            sub._end(err)
        self._can_write.set()

    @property
    def connected(self) -> bool:
        """Whether a connection is open (not closed, nor between two: failing over)."""
        t = self._transport
        return not self.closed and t is not None and not t.is_closing()

    def _unresponsive(self, reason: ConnectionClosed) -> None:
        """The heartbeat found the core silent: the connection is lost (failover, or the
        end, as a connection the core closed)."""
        t = self._transport
        self._gone(reason, "lost")
        if t is not None and not t.is_closing():
            t.abort()

    # ---- failover ----------------------------------------------------------------------
    def _fail_over(self, reason: PolymqError) -> None:
        """Drop the connection, keeping what is pending and every subscription, and let
        the failover connect elsewhere."""
        assert self.failover is not None
        t, self._transport = self._transport, None
        self._protocol = None
        if t is not None and not t.is_closing():
            t.abort()
        self._can_write.set()  # (requests made meanwhile wait in _out and _pending)
        self.failover.begin(reason)

    @property
    def reconnects(self) -> int:
        """How many times the connection failed over."""
        return 0 if self.failover is None else self.failover.reconnects

    # ---- flow control --------------------------------------------------------------------
    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None:
            if all(len(s._items) < self.local_buffer for s in self._subs.values()):
                self._reading_paused = False
                self._transport.resume_reading()

    # ---- sending, and requests by id -----------------------------------------------------
    def _rid(self) -> int:
        return next(self._rids)

    def _send(self, ev: Event) -> None:
        if self.closed:
            raise self.close_reason or ConnectionClosed("client is closed")
        self._out.append(ev)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _queue_acks(self, sub: Subscription) -> None:
        if self.closed:
            return
        self._ack_subs.add(sub)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        t = self._transport
        if t is None or t.is_closing():
            return  # (failing over: what waits goes out on the next connection)
        if self._ack_subs:
            for sub in self._ack_subs:
                if sub._acks and not sub.closed:
                    self._out.append(Ack(0, sub.sid, sub._acks, False))
                sub._acks = []
            self._ack_subs.clear()
        out, self._out = self._out, []
        if not out:
            return
        if inproc.passes_events(t):  # a core in this process: events as they are
            weights = list(map(weight, out))
            inproc.write_events(t, self.conn, out, weights, _FRAME_BYTES, self._unsendable)  # type: ignore[arg-type]
            return
        for i in range(0, len(out), 1024):
            chunk = out[i : i + 1024]
            try:
                t.write(self.conn.send_many(chunk))
            except LocalProtocolError:
                # Too big as one frame, or one event cannot be encoded: send them one frame
                # each, and a request that cannot be sent fails alone (never hangs).
                for ev in chunk:
                    try:
                        t.write(self.conn.send(ev))
                    except LocalProtocolError as exc:
                        self._unsendable(ev, exc)

    def _unsendable(self, ev: Event, exc: LocalProtocolError) -> None:
        """``ev`` cannot be encoded: its request fails alone (never hangs)."""
        fut = self._waiting(getattr(ev, "rid", 0))
        if fut is not None:
            fut.set_exception(exc)
        else:
            log.warning("polymq: cannot send %s: %s", type(ev).__name__, exc)

    async def _call(self, ev: Event, answer: Callable[[Any], Any] | None = None) -> Any:
        if not self._can_write.is_set():
            await self._can_write.wait()
        return await self._request(ev, answer)

    def _request(
        self, ev: Event, answer: Callable[[Any], Any] | None = None
    ) -> asyncio.Future[Any]:
        """Send ``ev`` now (once the connection may be written again if it may not) and
        give the future of its answer (``answer``: what makes it of the Ok's result, as the
        answer is read): no task of its own, for a request held open by the thousand (long
        polls)."""
        if not self._can_write.is_set():
            return asyncio.ensure_future(self._call(ev, answer))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        rid: int = ev.rid  # type: ignore[attr-defined]
        try:
            self._send(ev)
        except Exception as exc:  # (closed: the awaiter gets it, as from _call)
            fut.set_exception(exc)
            return fut
        self._pending[rid] = (fut, answer, ev)
        return fut
