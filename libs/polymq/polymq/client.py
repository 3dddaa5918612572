"""The asyncio client of the polymq core, and busmq-like handles over it.

::

    async with await Client.connect("127.0.0.1", 7400) as client:
        q = client.queue("orders")
        await q.push(b"hello", persistent=True)        # returns after fsync on the core
        async with await q.consume(ack_mode="client-individual", prefetch=10) as sub:
            async for delivery in sub:
                print(delivery.message.body)
                delivery.ack()

A core served in this process (:mod:`polymq.inproc`; ``polymq run``) is reached over an
in-process pipe, any other over TCP. Requests issued in the same loop iteration travel in one
frame (batching). Acks are
fire-and-forget and coalesced. Writing waits while the socket does not drain; reading
pauses while a subscription has ``local_buffer`` undelivered messages, which pushes back on
the core (where the slow-consumer policy of that subscription applies).

Every task and future is owned: :meth:`Client.close` fails pending requests with
:class:`~polymq.errors.ConnectionClosed` and ends every subscription's iterator.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from ssl import SSLContext
from types import TracebackType
from typing import Any

from . import inproc
from .answers import (
    Bound,
    CursorOpened,
    Declared,
    DestinationStats,
    Published,
    Unbound,
    stats_from_wire,
)
from .codec import NEED_DATA, PROTOCOL_VERSION, Connection, Role
from .deliveries import (
    Delivery,
    DeliveryListener,
    Lease,
    Settled,
    Subscription,
    make_message,
)
from .errors import (
    ConnectionClosed,
    LocalProtocolError,
    PolymqError,
    RemoteProtocolError,
    error_from_code,
)
from .events import (
    Ack,
    Bind,
    Bindings,
    Cancelled,
    CursorClose,
    CursorOpen,
    CursorPoll,
    Declare,
    Delete,
    Deliver,
    Event,
    Fail,
    Goodbye,
    Hello,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    MetaGet,
    MetaSet,
    Ok,
    Peek,
    Peeked,
    Ping,
    Polled,
    Publish,
    Pull,
    Pulled,
    Purge,
    Settle,
    Stats,
    Subscribe,
    Unbind,
    Welcome,
)
from .handles import ChannelHandle, QueueHandle, StreamHandle, TopicHandle
from .types import Message, Outcome

__all__ = [
    "ChannelHandle",
    "Client",
    "Delivery",
    "DeliveryListener",
    "Lease",
    "QueueHandle",
    "Settled",
    "StreamHandle",
    "Subscription",
    "TopicHandle",
]

log = logging.getLogger(__name__)


class _Protocol(asyncio.Protocol):
    def __init__(self, client: Client) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client._transport = transport  # type: ignore[assignment]  # uvloop: no subclass

    def data_received(self, data: bytes) -> None:
        self.client._data(data)

    def eof_received(self) -> bool | None:
        self.client._data(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost(exc)

    def pause_writing(self) -> None:
        self.client._can_write.clear()

    def resume_writing(self) -> None:
        self.client._can_write.set()


class Client:
    """A connection to a polymq core."""

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

    # ---- connecting ---------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 7400,
        *,
        client: str = "native",
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 10.0,
        local_buffer: int = 10_000,
        ssl: SSLContext | None = None,
    ) -> Client:
        """``ssl``: speak TLS to the core (a cluster's ``peer_wire`` listener)."""
        self = cls(local_buffer=local_buffer)
        loop = asyncio.get_running_loop()
        # a core in this process (polymq run) is reached without a socket
        if inproc.connect(host, port, lambda: _Protocol(self)) is None:
            try:
                await asyncio.wait_for(
                    loop.create_connection(lambda: _Protocol(self), host, port, ssl=ssl), timeout
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
        return self

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
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
                fut.set_result(
                    {"cursor": ev.cursor, "receipts": ev.receipts, "messages": ev.messages}
                )
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

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None:
            if all(len(s._items) < self.local_buffer for s in self._subs.values()):
                self._reading_paused = False
                self._transport.resume_reading()

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

    # ---- the primitive API ------------------------------------------------------------
    async def publish(
        self,
        destination: str,
        messages: bytes | str | Message | Iterable[Message],
        *,
        role: str | None = None,
        batch_id: str | None = None,
        batch_ttl: float | None = None,
        **fields: Any,
    ) -> Published:
        """Publish one message or a batch; returns after the core accepted (and, for
        persistent messages on durable destinations, fsynced) every one.

        A batch is all or nothing. With ``batch_id`` it is idempotent: for ``batch_ttl``
        seconds (None: the core's window) a repeat with the same id to the same destination
        publishes nothing and answers like the first, with ``duplicate`` true.

        A queue or stream answers the messages' ``ids`` and ``seqs``. A topic answers the
        live ``subscribers`` reached, the number of bound ``queues`` (see :meth:`bind`) that
        took a copy and the list of those that ``refused`` it (full, under ``overflow:
        reject``); it returns once copies of persistent messages in durable queues are on
        disk. See :class:`~polymq.answers.Published`."""
        if isinstance(messages, bytes | str | Message):
            batch = [make_message(messages, **fields)]
        else:
            batch = list(messages)
        ev = Publish(self._rid(), destination, batch, role, batch_id, batch_ttl)
        return Published.from_wire(await self._call(ev))

    def publish_soon(
        self, destination: str, messages: list[Message], *, role: str | None = None
    ) -> asyncio.Future[Published]:
        """Publish a batch in this loop iteration's frame and return the future of the core's
        answer, without a coroutine: for frontends that publish from protocol callbacks.
        It does not wait for the socket to drain: callers bound what they have in flight.
        Raises at once (no future) if the client is closed."""
        rid = self._rid()
        self._send(Publish(rid, destination, messages, role))
        fut: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, Published.from_wire)
        return fut

    def publish_nowait(self, destination: str, messages: list[Message]) -> None:
        """Fire and forget: no receipt, errors are only logged."""
        self._send(Publish(0, destination, messages, None))

    async def drain(self) -> None:
        """Wait until the socket accepts more (back-pressure for ``publish_nowait``)."""
        if not self._can_write.is_set():
            await self._can_write.wait()

    async def declare(self, destination: str, **options: Any) -> Declared:
        """Create ``destination`` with ``options`` (see :class:`~polymq.types.DeclareOptions`)
        or change its options; a topic has none to keep."""
        return Declared.from_wire(await self._call(Declare(self._rid(), destination, options)))

    async def delete(self, destination: str) -> None:
        await self._call(Delete(self._rid(), destination))

    async def purge(self, destination: str) -> int:
        r = await self._call(Purge(self._rid(), destination))
        return int(r["purged"])

    async def stats(self, destination: str) -> DestinationStats:
        """A :class:`~polymq.answers.QueueStats`, :class:`~polymq.answers.StreamStats`,
        :class:`~polymq.answers.TopicStats` (a pattern's too) or
        :class:`~polymq.answers.ChannelStats`, as ``destination``'s kind is."""
        return stats_from_wire(await self._call(Stats(self._rid(), destination)))

    async def subscribe(
        self, destination: str, *, listener: DeliveryListener | None = None, **options: Any
    ) -> Subscription:
        """Subscribe with ``options`` (see :class:`~polymq.types.SubscribeOptions`). With a
        ``listener``, deliveries go to it (from the moment the core has the subscription,
        which may be before this returns) instead of the async iterator."""
        sid = next(self._sids)
        sub = Subscription(self, sid, destination, listener)
        self._subs[sid] = sub
        try:
            await self._call(Subscribe(self._rid(), sid, destination, options))
        except BaseException:
            self._subs.pop(sid, None)
            raise
        return sub

    async def pull(
        self, destination: str, max: int = 1, *, wait: float = 0.0, visibility: float = 30.0
    ) -> list[Lease]:
        r: list[Lease] = await self._call(Pull(self._rid(), destination, max, wait, visibility))
        return r

    async def peek(
        self, destination: str, count: int = 10, *, role: str | None = None
    ) -> list[Message]:
        """Look without taking: a queue's first ``count`` ready messages in delivery order
        (a durable queue's in-memory window: paged messages come after it), or a stream's
        last ``count`` entries. Nothing is leased, acked or counted as delivered."""
        r: list[Message] = await self._call(Peek(self._rid(), destination, count, role))
        return r

    async def settle(self, receipts: list[str], outcome: Outcome = Outcome.ACK) -> Settled:
        """Settle pulled leases by receipt, from any connection; :class:`NotFound` when the
        core knows none of them."""
        # the wire carries the outcome's word (anything else is sent as it is: the core
        # answers BadRequest)
        word = outcome.value if isinstance(outcome, Outcome) else outcome
        r: dict[str, Any] = await self._call(Settle(self._rid(), receipts, word))
        return Settled(r["settled"], r["missing"])

    async def get_metadata(self, destination: str) -> dict[str, str]:
        r: dict[str, str] = await self._call(MetaGet(self._rid(), destination))
        return r

    async def set_metadata(self, destination: str, metadata: dict[str, str]) -> None:
        await self._call(MetaSet(self._rid(), destination, metadata))

    async def kv_get(self, key: str) -> bytes:
        r: bytes = await self._call(KvGet(self._rid(), key))
        return r

    async def kv_put(self, key: str, value: bytes) -> None:
        await self._call(KvPut(self._rid(), key, value))

    async def kv_delete(self, key: str) -> None:
        await self._call(KvDelete(self._rid(), key))

    async def kv_list(self, prefix: str = "", limit: int = 10_000) -> list[str]:
        """The keys that start with ``prefix``, sorted, at most ``limit`` of them."""
        keys: list[str] = await self._call(KvList(self._rid(), prefix, limit))
        return keys

    async def ping(self) -> None:
        await self._call(Ping(self._rid()))

    # ---- bindings: topic pattern -> queue ----------------------------------------------
    async def bind(self, pattern: str, queue: str) -> Bound:
        """Bind ``queue`` (``"queue/<name>"``) to ``pattern`` (``"topic/<pattern>"``, with
        ``*``, ``#`` or a trailing ``*`` prefix): every message published to a matching topic
        is also appended to the queue. Idempotent (``added`` is false for a binding that was
        there); kept across restarts when the queue is declared durable, and removed with
        the queue."""
        return Bound.from_wire(await self._call(Bind(self._rid(), pattern, queue)))

    async def unbind(self, pattern: str, queue: str) -> Unbound:
        """Remove a binding; ``removed`` is false if there was none."""
        return Unbound.from_wire(await self._call(Unbind(self._rid(), pattern, queue)))

    async def bindings(self, queue: str) -> list[str]:
        """The patterns (``"topic/..."``) ``queue`` is bound to, sorted."""
        r: list[str] = await self._call(Bindings(self._rid(), queue))
        return r

    # ---- cursor subscriptions: live in the core, polled from any connection -------------
    async def cursor_open(
        self,
        destination: str,
        *,
        offset: str | int = "next",
        ttl: float = 300.0,
        visibility: float = 30.0,
        buffer: int = 10_000,
    ) -> CursorOpened:
        """Open a subscription the core keeps until ``ttl`` seconds pass without a poll.

        Returns its ``id`` and first ``cursor``. Topics buffer up to ``buffer`` messages;
        streams read from ``offset``; queues lease what a poll takes for ``visibility``
        seconds.
        """
        options = {"offset": offset, "ttl": ttl, "visibility": visibility, "buffer": buffer}
        return CursorOpened.from_wire(
            await self._call(CursorOpen(self._rid(), destination, options))
        )

    def cursor_poll(
        self, sub_id: str, cursor: int | None, *, max: int = 100, wait: float = 0.0
    ) -> asyncio.Future[dict[str, Any]]:
        """``{"cursor", "messages", "receipts"}``: what follows ``cursor`` (None: the oldest
        held), waiting up to ``wait`` seconds for the first. Presenting a cursor confirms
        everything up to it; :class:`~polymq.errors.Gone` if it points before what is held.
        The poll is sent at once and answered by the future returned (await it): a frontend
        holding thousands of polls spends no task on each."""
        return self._request(CursorPoll(self._rid(), sub_id, cursor, max, wait))

    async def cursor_close(self, sub_id: str) -> None:
        await self._call(CursorClose(self._rid(), sub_id))

    # ---- busmq-like handles -------------------------------------------------------------
    def queue(self, name: str) -> QueueHandle:
        return QueueHandle(self, f"queue/{name}")

    def topic(self, name: str) -> TopicHandle:
        return TopicHandle(self, f"topic/{name}")

    def stream(self, name: str) -> StreamHandle:
        return StreamHandle(self, f"stream/{name}")

    def channel(self, name: str, role: str) -> ChannelHandle:
        if role not in ("server", "client"):
            raise ValueError("role must be 'server' or 'client'")
        return ChannelHandle(self, f"channel/{name}", role)
