"""What a subscription delivers, and the subscription itself: an async iterator of
:class:`Delivery` (or a :class:`DeliveryListener` fed from the client's reads), whose acks
and nacks go out through its :class:`~polymq.client.Client` (fire-and-forget, coalesced);
a pulled message is a :class:`Lease`. ``make_message`` builds a :class:`Message` from a body
and fields, as every publishing call of the client does."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from .events import Ack, Event, Nack, Unsubscribe
from .types import Message, Outcome

__all__ = [
    "Delivery",
    "DeliveryListener",
    "Finished",
    "Lease",
    "Settled",
    "Subscription",
    "SubscriptionHost",
    "make_message",
]


_MESSAGE_FIELDS = frozenset(
    {"content_type", "headers", "priority", "persistent", "expires", "ack_timeout",
     "correlation_id", "reply_to"}
)  # fmt: skip


def make_message(body: bytes | str | Message, **fields: Any) -> Message:
    if isinstance(body, Message):
        return body
    unknown = set(fields) - _MESSAGE_FIELDS
    if unknown:
        raise TypeError(f"unknown message field(s): {', '.join(sorted(unknown))}")
    if isinstance(body, str):
        body = body.encode()
        fields.setdefault("content_type", "text/plain; charset=utf-8")
    return Message(body=bytes(body), **fields)


@dataclass(slots=True)
class Delivery:
    """One delivered message; ``ack``/``nack`` are fire-and-forget (coalesced)."""

    message: Message
    tag: int
    subscription: Subscription

    def ack(self) -> None:
        self.subscription.ack(self.tag)

    def nack(self, requeue: bool = True) -> None:
        self.subscription.nack(self.tag, requeue=requeue)


@dataclass(frozen=True, slots=True)
class Lease:
    """A pulled message and the receipt that settles it."""

    receipt: str
    message: Message


@dataclass(frozen=True, slots=True)
class Settled:
    """The answer to settling leases: how many were settled, and the receipts the core no
    longer knows (already settled, expired, or of a deleted queue)."""

    settled: int
    missing: list[str]


class DeliveryListener(Protocol):
    """Takes a subscription's deliveries as they arrive, instead of its async iterator.

    For frontends that relay deliveries to their own clients from protocol callbacks: no
    task per subscription, no buffering in the client (so nothing here pauses reading the
    shared connection; the listener bounds its own buffers, e.g. with the prefetch window).
    Both methods are called from the client's ``data_received`` and must not block.
    """

    def on_deliver(self, sub: Subscription, tags: list[int], messages: list[Message]) -> None:
        """Messages and their delivery tags (to ack or nack), in delivery order."""

    def on_end(self, sub: Subscription, error: BaseException) -> None:
        """The subscription ended without ``unsubscribe()``: the core cancelled it
        (its destination was deleted) or the connection closed; ``error`` says which."""


class SubscriptionHost(Protocol):
    """What a subscription needs of the connection that holds it (the
    :class:`~polymq.connection.CoreConnection` that a :class:`~polymq.client.Client` is):
    its local buffer and reading pauses, its table of subscriptions, and its outgoing events
    (acks coalesced, calls answered). A protocol, so that this module need not import the
    connection's, which imports it."""

    local_buffer: int
    closed: bool
    _subs: dict[int, Subscription]

    def _pause_reading(self) -> None: ...
    def _resume_reading(self) -> None: ...
    def _rid(self) -> int: ...
    def _send(self, ev: Event) -> None: ...
    def _queue_acks(self, sub: Subscription) -> None: ...
    def _flush(self) -> None: ...
    async def _call(self, ev: Event) -> Any: ...


class Subscription:
    """A subscription's deliveries as an async iterator (or handed to a listener)."""

    def __init__(
        self,
        client: SubscriptionHost,
        sid: int,
        destination: str,
        listener: DeliveryListener | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.sid = sid
        self.destination = destination
        self.listener = listener
        self.options = dict(options or {})  # as subscribed (made again after a failover)
        # after a failover the core numbers deliveries from 1 again: tags handed out are
        # the core's plus this base (a tag below it is of a lost connection: not acked)
        self._base = 0
        # a stream's: where a failover reads on from: the seq after the last delivered, or
        # before any delivery the seq the core said it starts at (its subscribe's answer)
        self._next_seq: int | None = None
        self._stream = destination.startswith("stream/")
        self._items: deque[Delivery] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._acks: list[int] = []
        self.closed = False

    def _push(self, tags: list[int], messages: list[Message]) -> None:
        if self._base:
            tags = [tag + self._base for tag in tags]
        if self._stream and messages:
            self._next_seq = messages[-1].seq + 1
        if self.listener is not None:
            self.listener.on_deliver(self, tags, messages)
            return
        items = self._items
        for tag, msg in zip(tags, messages, strict=True):
            items.append(Delivery(msg, tag, self))
        self._wake()
        if len(items) >= self.client.local_buffer:
            self.client._pause_reading()

    def _subscribed(self, result: Any) -> Any:
        """The core's answer to subscribing (again): a stream's names the seq it reads
        first (``seq``; an older core does not say), where a failover before any delivery
        goes on from. (Deliveries may come before the answer: the later position holds.)"""
        seq = result.get("seq") if isinstance(result, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            if self._next_seq is None or seq > self._next_seq:
                self._next_seq = seq
        return result

    def _rebase(self, base: int) -> None:
        """A failover: tags from now on are ``base`` plus the new connection's; acks not
        yet sent are of the lost one (the core gives those deliveries again)."""
        self._base = base
        self._acks = []

    def _resume_options(self) -> dict[str, Any]:
        """The options to subscribe again with: a stream reads on after the last entry
        delivered, or from where the core said it started (neither known: from the offset
        first asked for)."""
        if self._next_seq is None:
            return self.options
        return {**self.options, "offset": self._next_seq}

    def _end(self, error: BaseException) -> None:
        first = self._error is None
        if first:
            self._error = error
        self.closed = True
        self._wake()
        if first and self.listener is not None and not isinstance(error, Finished):
            self.listener.on_end(self, error)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        while not self._items:
            if self._error is not None:
                if isinstance(self._error, Finished):
                    raise StopAsyncIteration
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        d = self._items.popleft()
        if len(self._items) < self.client.local_buffer // 2:
            self.client._resume_reading()
        return d

    async def get(self, timeout: float | None = None) -> Delivery:
        """The next delivery, or :class:`asyncio.TimeoutError` after ``timeout``."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    def pending(self) -> int:
        return len(self._items)

    def ack(self, tag: int) -> None:
        if tag < self._base:
            return  # delivered on a connection since lost: the core gives it again
        self._acks.append(tag - self._base)
        self.client._queue_acks(self)

    def nack(self, tag: int, requeue: bool = True) -> None:
        if tag < self._base:
            return  # (as ack)
        self.client._send(Nack(0, self.sid, [tag - self._base], requeue, False))

    def settle(self, tag: int, outcome: Outcome) -> None:
        """:meth:`ack` or :meth:`nack` ``tag``, as ``outcome`` says."""
        if outcome is Outcome.ACK:
            self.ack(tag)
        else:
            self.nack(tag, requeue=outcome is Outcome.REQUEUE)

    async def ack_many(self, tags: list[int], *, cumulative: bool = False) -> int:
        """Ack ``tags`` (with ``cumulative``, or in ack mode ``client``, every delivery up to
        the highest of them) and wait until the core has the acks written: how many
        deliveries it acked (tags it no longer held unsettled are not counted)."""
        base = self._base
        if base:  # (as ack; before any failover the core itself checks what it is sent)
            tags = [tag - base for tag in tags if tag >= base]
        if not tags:
            return 0
        r = await self.client._call(Ack(self.client._rid(), self.sid, tags, cumulative))
        return int(r["acked"])

    async def unsubscribe(self) -> None:
        if self.closed:
            return
        if self._acks:
            self.client._flush()  # acks given before leaving go out first
        self.closed = True
        self.client._subs.pop(self.sid, None)
        try:
            await self.client._call(Unsubscribe(self.client._rid(), self.sid))
        finally:
            self._end(Finished())

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.client.closed:
            await self.unsubscribe()


class Finished(Exception):
    pass
