"""The asyncio client of the polymq core: the primitive API's calls, and busmq-like handles
over them.

::

    async with await Client.connect(["n1:7400", "n2:7400", "n3:7400"]) as client:
        q = client.queue("orders")
        await q.push(b"hello", persistent=True)        # returns after fsync on the core
        async with await q.consume(ack_mode="client-individual", prefetch=10) as sub:
            async for delivery in sub:
                print(delivery.message.body)
                delivery.ack()

A :class:`Client` is a :class:`~polymq.connection.CoreConnection` (the transport, the
codec, pending requests, batching, coalesced acks, flow control: see there) with the calls
of the primitive API on top. :meth:`Client.close` fails pending requests with
:class:`~polymq.errors.ConnectionClosed` and ends every subscription's iterator.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable, Iterable, Sequence
from ssl import SSLContext
from types import TracebackType
from typing import Any, Literal

from .addresses import DEFAULT_PORT, parse_addresses
from .answers import (
    Bound,
    CursorOpened,
    CursorPage,
    Declared,
    DestinationStats,
    Published,
    Unbound,
    stats_from_wire,
)
from .connection import CoreConnection
from .deliveries import (
    Delivery,
    DeliveryListener,
    Lease,
    Settled,
    Subscription,
    make_message,
)
from .events import (
    Bind,
    Bindings,
    CursorClose,
    CursorOpen,
    CursorPoll,
    Declare,
    Delete,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    MetaGet,
    MetaSet,
    Peek,
    Ping,
    Publish,
    Pull,
    Purge,
    Settle,
    Stats,
    Subscribe,
    Unbind,
)
from .failover import Reconnected
from .handles import ChannelHandle, QueueHandle, StreamHandle, TopicHandle
from .heartbeat import DEFAULT_HEARTBEAT
from .types import ChannelRole, Message, Outcome

__all__ = [
    "DEFAULT_HEARTBEAT",
    "DEFAULT_RECONNECT_TIMEOUT",
    "ChannelHandle",
    "Client",
    "Delivery",
    "DeliveryListener",
    "Lease",
    "QueueHandle",
    "Reconnected",
    "Settled",
    "StreamHandle",
    "Subscription",
    "TopicHandle",
]


DEFAULT_RECONNECT_TIMEOUT = 30.0  # seconds a client given several addresses fails over for
_BATCH_TTL_MARGIN = 120.0  # seconds an automatic batch id outlives reconnect_timeout
_LONE_HEARTBEAT = 30.0  # seconds of heartbeat, by default, for a client without failover


class Client(CoreConnection):
    """A connection to a polymq core, and the primitive API's calls over it."""

    _batch_prefix = ""  # (made on the first publish with failover)
    _batch_numbers: itertools.count[int]

    def _batch(
        self, batch_id: str | None, batch_ttl: float | None
    ) -> tuple[str | None, float | None]:
        """A publish's batch id and ttl: with failover, one of its own if none is given
        (a publish re-sent after a failover is then answered as a duplicate)."""
        if batch_id is not None or self.reconnect_timeout is None:
            return batch_id, batch_ttl
        if not self._batch_prefix:
            self._batch_prefix = f"polymq-{uuid.uuid4().hex}."
            self._batch_numbers = itertools.count(1)
        ttl = batch_ttl if batch_ttl is not None else self.reconnect_timeout + _BATCH_TTL_MARGIN
        return f"{self._batch_prefix}{next(self._batch_numbers)}", ttl

    # ---- connecting ---------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        host: str | Sequence[str] = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        client: str = "native",
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 10.0,
        local_buffer: int = 10_000,
        ssl: SSLContext | bool | None = None,
        reconnect_timeout: float | Literal["auto"] | None = "auto",
        on_reconnect: Callable[[Reconnected], None] | None = None,
        heartbeat: float | Literal["auto"] | None = "auto",
    ) -> Client:
        """Connect to the core at ``host``, ``port``, or to the first of several that
        takes the connection: ``host`` a list of ``"host:port"`` strings (or one string of
        them, comma-separated; ``port`` is the default port); a name is every IP address
        it resolves to (a headless Service's pods). :class:`~polymq.errors.ConnectionClosed`
        if none does.

        ``reconnect_timeout``: seconds to fail over for (see :mod:`polymq.failover`):
        when the connection is lost or the core says it is going, the client connects to
        another address, subscribes again, re-sends unanswered requests and calls
        ``on_reconnect`` with a :class:`~polymq.connection.Reconnected`; only when no
        address takes it for that long does what is pending fail with ``ConnectionClosed``.
        ``None``: no failover (a loss ends the client). The default, ``"auto"``: 30 s when
        ``host`` is a list, none for ``connect(host, port)``. With failover, every publish
        without a ``batch_id`` is given one (kept by the core for ``reconnect_timeout`` +
        120 s), so that one re-sent after a failover is not taken twice.

        ``heartbeat``: seconds the core may stay silent after a ping (see
        :mod:`polymq.heartbeat`) before the connection is taken as lost, as when it closes:
        with failover the client moves to another address, without it the client is
        closed (:class:`~polymq.errors.ConnectionClosed`, code ``heartbeat``). It finds a
        core that hangs with the socket open (``SIGSTOP``), which nothing else does.
        ``"auto"`` (the default): 5 s with failover, 30 s without (a client with nowhere
        else to go gives a busy core longer); ``None``: no pings. Under 2 s, a connection
        whose reading the core holds (a resource alarm) may be taken for hung: the core
        then says a word of its own only every second.

        ``ssl``: speak TLS to the core (one started with ``--tls-cert``, or a cluster's
        ``peer_wire`` listener): an ``ssl.SSLContext`` (e.g.
        ``ssl.create_default_context(cafile="ca.pem")``), or True for the system's CAs;
        the certificate must name the host as given (not the IPs a name resolves to)."""
        try:
            addresses = parse_addresses(host, default_port=port)
        except ValueError as exc:
            raise ValueError(f"Client.connect: {exc}") from None
        if reconnect_timeout == "auto":
            reconnect_timeout = None if isinstance(host, str) else DEFAULT_RECONNECT_TIMEOUT
        if reconnect_timeout is not None and not reconnect_timeout > 0:
            raise ValueError("reconnect_timeout must be a positive number of seconds, or None")
        if heartbeat == "auto":
            heartbeat = DEFAULT_HEARTBEAT if reconnect_timeout is not None else _LONE_HEARTBEAT
        if heartbeat is not None and not heartbeat > 0:
            raise ValueError("heartbeat must be a positive number of seconds, or None")
        self = cls(local_buffer=local_buffer)
        await self._open(
            addresses,
            client=client,
            user=user,
            password=password,
            token=token,
            timeout=timeout,
            ssl=ssl,
            reconnect_timeout=reconnect_timeout,
            on_reconnect=on_reconnect,
            heartbeat=heartbeat,
        )
        return self

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

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
        batch_id, batch_ttl = self._batch(batch_id, batch_ttl)
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
        batch_id, batch_ttl = self._batch(None, None)
        ev = Publish(rid, destination, messages, role, batch_id, batch_ttl)
        self._send(ev)
        fut: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, Published.from_wire, ev)
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
        sub = Subscription(self, sid, destination, listener, options)
        self._subs[sid] = sub
        try:
            await self._call(Subscribe(self._rid(), sid, destination, options), sub._subscribed)
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
    ) -> asyncio.Future[CursorPage]:
        """A :class:`~polymq.answers.CursorPage`: what follows ``cursor`` (None: the oldest
        held), waiting up to ``wait`` seconds for the first. Presenting a cursor confirms
        everything up to it; :class:`~polymq.errors.Gone` if it points before what is held.
        The poll is sent at once and answered by the future returned (await it): a frontend
        holding thousands of polls spends no task on each (the page is made where the
        client reads the core's answer)."""
        page: asyncio.Future[CursorPage] = self._request(
            CursorPoll(self._rid(), sub_id, cursor, max, wait)
        )
        return page

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
        if not ChannelRole.named(role):
            raise ValueError("role must be 'server' or 'client'")
        return ChannelHandle(self, f"channel/{name}", role)
