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

The hot paths (``_send``, ``_flush``, ``_event``) are methods of the client itself, by
inheritance, so that no call is added per message between the API and the wire.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

from . import inproc
from .answers import CursorPage
from .codec import NEED_DATA, PROTOCOL_VERSION, Connection, Role
from .deliveries import Lease, Subscription
from .errors import (
    ConnectionClosed,
    LocalProtocolError,
    PolymqError,
    RemoteProtocolError,
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

__all__ = ["CoreConnection"]

log = logging.getLogger("polymq.client")  # the name users set levels on: the client's


class _Protocol(asyncio.Protocol):
    """Hands what the transport reports to its :class:`CoreConnection`."""

    def __init__(self, connection: CoreConnection) -> None:
        self.connection = connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connection._transport = transport  # type: ignore[assignment]  # uvloop: no subclass

    def data_received(self, data: bytes) -> None:
        self.connection._data(data)

    def eof_received(self) -> bool | None:
        self.connection._data(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection._lost(exc)

    def pause_writing(self) -> None:
        self.connection._can_write.clear()

    def resume_writing(self) -> None:
        self.connection._can_write.set()


class CoreConnection:
    """The client's end of one connection to a polymq core: it owns the transport, the
    codec, the pending requests by request id, the subscriptions by subscription id, and
    flow control."""

    def __init__(self, *, local_buffer: int = 10_000) -> None:
        self.local_buffer = local_buffer
        self.conn = Connection(Role.CLIENT)
        self._transport: asyncio.Transport | None = None
        # each request's future, and what makes the answer of its Ok's result (None: the
        # result as it is); publish_soon's future is answered so, without a task
        self._pending: dict[int, tuple[asyncio.Future[Any], Callable[[Any], Any] | None]] = {}
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

    # ---- connecting ----------------------------------------------------------------------
    async def _open(
        self,
        host: str,
        port: int,
        *,
        client: str,
        user: str | None,
        password: str | None,
        token: str | None,
        timeout: float,
        ssl: SSLContext | bool | None,
    ) -> None:
        """Connect to the core at ``host:port`` and say hello; returns once it welcomed us
        (its ``server`` and ``limits`` are known), else closes and raises."""
        loop = asyncio.get_running_loop()
        # a core in this process (polymq run) is reached without a socket
        if inproc.connect(host, port, lambda: _Protocol(self)) is None:
            try:
                await asyncio.wait_for(
                    loop.create_connection(lambda: _Protocol(self), host, port, ssl=ssl or None),
                    timeout,
                )
            except (OSError, TimeoutError) as exc:
                raise ConnectionClosed(
                    f"cannot connect to polymq core at {host}:{port}: {exc}"
                ) from exc
        self._welcome = loop.create_future()
        self._send(Hello(PROTOCOL_VERSION, client, user, password, token))
        try:
            welcome = await asyncio.wait_for(asyncio.shield(self._welcome), timeout)
        except BaseException:
            await self.close()
            raise
        self.server = welcome.server
        self.limits = dict(welcome.limits)

    async def close(self) -> None:
        """Say goodbye to the core and end the connection: what is pending fails with
        :class:`~polymq.errors.ConnectionClosed`, every subscription's iterator ends."""
        if self.closed:
            return
        self._flush()
        t = self._transport
        if t is not None and not t.is_closing():
            t.write(self.conn.goodbye("bye", "client closed"))
            t.close()
        self._lost(None, ConnectionClosed("client closed"))

    # ---- I/O -----------------------------------------------------------------------------
    def _data(self, data: bytes) -> None:
        self.conn.receive_data(data)
        while True:
            try:
                ev = self.conn.next_event()
            except RemoteProtocolError as exc:
                log.error("polymq: protocol error from server: %s", exc)
                self._fail_all(exc)
                if self._transport is not None:
                    self._transport.abort()
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
            waiting = self._pending.pop(ev.rid, None)
            if waiting is not None:
                answered, answer = waiting
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
            fut = self._waiting(ev.rid)
            err = error_from_code(ev.code, ev.message)
            if fut is not None:
                fut.set_exception(err)
            elif ev.rid == 0:
                log.warning("polymq: a fire-and-forget request failed: %s", err)
        elif isinstance(ev, Cancelled):
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
            self._fail_all(reason)

    def _waiting(self, rid: int) -> asyncio.Future[Any] | None:
        """The future of request ``rid``, which this answer ends; None if nothing waits."""
        waiting = self._pending.pop(rid, None)
        if waiting is None or waiting[0].done():
            return None
        return waiting[0]

    def _lost(self, exc: BaseException | None, reason: BaseException | None = None) -> None:
        if self.closed and self.close_reason is not None:
            return
        if reason is None:
            reason = self.close_reason or ConnectionClosed(
                f"connection lost: {exc}" if exc else "connection closed by the server"
            )
        self._fail_all(reason)

    def _fail_all(self, reason: BaseException) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self.closed = True
        err = self.close_reason
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(err)
        subs, self._subs = self._subs, {}
        for sub in subs.values():
            sub._end(err)
        self._can_write.set()

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
        if self._ack_subs:
            for sub in self._ack_subs:
                if sub._acks and not sub.closed:
                    self._out.append(Ack(0, sub.sid, sub._acks, False))
                sub._acks = []
            self._ack_subs.clear()
        out, self._out = self._out, []
        t = self._transport
        if not out or t is None or t.is_closing():
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
                        fut = self._waiting(getattr(ev, "rid", 0))
                        if fut is not None:
                            fut.set_exception(exc)
                        else:
                            log.warning("polymq: cannot send %s: %s", type(ev).__name__, exc)

    async def _call(self, ev: Event) -> Any:
        if not self._can_write.is_set():
            await self._can_write.wait()
        return await self._request(ev)

    def _request(self, ev: Event) -> asyncio.Future[Any]:
        """Send ``ev`` now (once the connection may be written again if it may not) and
        give the future of its answer: no task of its own, for a request held open by the
        thousand (long polls)."""
        if not self._can_write.is_set():
            return asyncio.ensure_future(self._call(ev))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        rid: int = ev.rid  # type: ignore[attr-defined]
        try:
            self._send(ev)
        except Exception as exc:  # (closed: the awaiter gets it, as from _call)
            fut.set_exception(exc)
            return fut
        self._pending[rid] = (fut, None)
        return fut
