"""A subscription: one subscriber's view of one destination, owned by its session.

The subscription knows its ack mode, its prefetch window and its unacked deliveries; the
destination (queue, stream, topic) decides what to deliver and calls :meth:`deliver`. The
session buffers the delivery for the socket; when the socket does not drain and the buffer
passes the subscription's bound, the slow-consumer policy applies (see ``session.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from polymq.types import AckMode, Destination, Kind, Message, Outcome, SubscribeOptions

if TYPE_CHECKING:
    import asyncio

    from ..topics.trie import TopicRouter


class SubscriberSession(Protocol):
    """What a subscription and the destinations it is attached to (queues, streams, the
    shard that moves them) use of the session that owns it: a protocol, so that this module
    need not import ``session.py``, which imports it. The session takes each delivery (or
    says it has no room), is told when the core ends or moves one of its subscriptions (a
    stream's with the seq it reads on from), and names itself in logs."""

    name: str

    @property
    def writable(self) -> bool:
        """Is the socket draining (a stream hands entries only while it is)?"""

    def accepts(self, sub: Subscription) -> bool: ...
    def push_delivery(self, sub: Subscription, tag: int, msg: Message, key: Any) -> None: ...
    def push_deliveries(
        self, sub: Subscription, first: int, msgs: list[Message], nbytes: int
    ) -> None: ...
    def cancel(self, sub: Subscription, code: str, message: str) -> None: ...
    def moved(
        self, sub: Subscription, reason: str, held: dict[int, str], seq: int | None = None
    ) -> None: ...


class TopicReceiver(Protocol):
    """What the topic router holds and hands a publish's messages to: a topic
    :class:`Subscription`, or a long-poll subscription's cursor
    (:class:`~polymq_core.handlers.cursors.TopicCursor`)."""

    def send_all(self, messages: list[Message], nbytes: int) -> None: ...


class Source(Protocol):
    """What a subscription is attached to: a queue, a stream or the topic router."""

    @property
    def kind(self) -> str:
        """The kind of destination subscribed to: "queue", "topic", "stream", "channel"."""

    def detach(self, sub: Subscription, *, requeue: list[Message]) -> None: ...
    def settle(
        self, sub: Subscription, keys: list[Any], outcome: Outcome
    ) -> asyncio.Future[None] | None:
        """Settle deliveries; returns the store write that makes it durable, if any."""

    def pump(self) -> None: ...


_KIND_TEXT = {k.value: k.value for k in Kind}  # one string per kind, shared


def kind_text(key: str) -> str:
    """The kind of the destination ``key`` (``queue/orders``: "queue"), one shared string."""
    kind = key.partition("/")[0]
    return _KIND_TEXT.get(kind, kind)


# Shared by every subscription with nothing unacked (most of them: auto mode, topics), so
# an idle subscription costs no dict of its own. Only ``deliver`` ever inserts, after
# replacing it with a dict of the subscription's own.
_NONE_UNACKED: dict[int, Any] = {}


class _Window:
    """A subscription's delivery state: its next delivery tag, its unacked deliveries and
    whether it is closed. Subscriptions that never delivered share one of two instances
    (:data:`_FRESH`, :data:`_FRESH_CLOSED`), which nothing changes; the first delivery (or
    a tag set from elsewhere) gives a subscription a window of its own."""

    __slots__ = ("closed", "inflight", "next_tag", "shared")

    def __init__(self, next_tag: int = 1, *, closed: bool = False, shared: bool = False) -> None:
        self.next_tag = next_tag
        # delivery tag -> the source's key for that delivery (a queue seq, a stream seq)
        self.inflight: dict[int, Any] = _NONE_UNACKED
        self.closed = closed
        self.shared = shared


_FRESH = _Window(shared=True)  # open, nothing delivered yet
_FRESH_CLOSED = _Window(closed=True, shared=True)  # closed before it delivered anything


class Subscription:
    """One subscription. A million idle ones must fit in little memory (ocamlmq's ~150 B
    each is the mark), so it has six slots (80 bytes with the GC header): the destination
    is its name, which for a topic is the very string the router keys it by, and its
    source's kind; the ack mode and prefetch are read from ``options``, which
    ``SubscribeOptions.from_dict`` interns; the tags and the unacked deliveries are in a
    :class:`_Window` shared by all those that have delivered nothing yet."""

    __slots__ = ("name", "options", "session", "sid", "source", "window")

    def __init__(
        self,
        session: SubscriberSession,
        sid: int,
        destination: str | Destination,
        options: SubscribeOptions,
        source: Source,
    ) -> None:
        self.session = session
        self.sid = sid
        if isinstance(destination, Destination):
            self.name: str = destination.name
        else:
            self.name = destination.partition("/")[2]
        self.options = options
        self.source = source
        self.window = _FRESH

    def _own(self) -> _Window:
        """This subscription's own window (made from the shared one it had, if so)."""
        w = self.window
        if w.shared:
            w = self.window = _Window(w.next_tag, closed=w.closed)
        return w

    @property
    def kind(self) -> str:
        return self.source.kind

    @property
    def destination(self) -> str:
        return f"{self.source.kind}/{self.name}"

    @property
    def auto(self) -> bool:
        return self.options.ack_mode is AckMode.AUTO

    @property
    def prefetch(self) -> int:
        return self.options.prefetch

    @property
    def closed(self) -> bool:
        return self.window.closed

    def close(self) -> None:
        """Deliver no more (the session let it go; what it held goes back to its source)."""
        if self.window is _FRESH:
            self.window = _FRESH_CLOSED
        else:
            self._own().closed = True

    @property
    def next_tag(self) -> int:
        """The tag of its next delivery (1, then 2, ...; or on from where it was moved)."""
        return self.window.next_tag

    @next_tag.setter
    def next_tag(self, tag: int) -> None:
        self._own().next_tag = tag

    @property
    def inflight(self) -> dict[int, Any]:
        """Its unacked deliveries: delivery tag -> the source's key (a queue or stream seq)."""
        return self.window.inflight

    def has_credit(self) -> bool:
        """May the source deliver one more message now?"""
        if self.window.closed or not self.session.accepts(self):
            return False
        options = self.options
        prefetch = options.prefetch
        return (
            prefetch == 0
            or len(self.window.inflight) < prefetch
            or options.ack_mode is AckMode.AUTO
        )

    def deliver(self, message: Message, key: Any) -> int:
        """Hand one message to the session; returns its delivery tag."""
        w = self.window
        if w.shared:
            w = self._own()
        tag = w.next_tag
        w.next_tag = tag + 1
        if self.options.ack_mode is not AckMode.AUTO:
            inflight = w.inflight
            if inflight is _NONE_UNACKED:
                inflight = w.inflight = {}
            inflight[tag] = key
        self.session.push_delivery(self, tag, message, key)
        return tag

    def adopt(self, tag: int, key: Any) -> None:
        """Hold a delivery made under ``tag`` before this subscription moved here (its
        source checked it out again), as unacked; later tags follow it."""
        w = self._own()
        inflight = w.inflight
        if inflight is _NONE_UNACKED:
            inflight = w.inflight = {}
        inflight[tag] = key
        if w.next_tag <= tag:
            w.next_tag = tag + 1

    def room(self) -> int:
        """How many more deliveries it may hold unacked now: -1 for no bound (auto mode, or
        prefetch 0); 0 when closed or its session takes none."""
        if self.window.closed or not self.session.accepts(self):
            return 0
        options = self.options
        prefetch = options.prefetch
        if prefetch == 0 or options.ack_mode is AckMode.AUTO:
            return -1
        return max(prefetch - len(self.window.inflight), 0)

    def deliver_window(self, messages: list[Message], nbytes: int) -> None:
        """Hand a queue's messages over in one call, as :meth:`deliver` does each with its
        seq as the key, in a mode that acks (each kept unacked under its tag); ``nbytes``:
        their bodies' bytes."""
        w = self._own()
        tag = w.next_tag
        n = len(messages)
        w.next_tag = tag + n
        inflight = w.inflight
        if inflight is _NONE_UNACKED:
            inflight = w.inflight = {}
        inflight.update(zip(range(tag, tag + n), [m.seq for m in messages], strict=True))
        self.session.push_deliveries(self, tag, messages, nbytes)

    def send_all(self, messages: list[Message], nbytes: int) -> None:
        """Hand over messages nobody redelivers, under consecutive tags, in one call
        (``nbytes``: their bodies' bytes): a topic's (no window, acks are no-ops: a fan-out
        costs a call per subscriber, not per delivery), or a queue's to a subscription in
        auto mode (nothing of them is kept unacked)."""
        w = self.window
        if w.shared:
            w = self._own()
        tag = w.next_tag
        w.next_tag = tag + len(messages)
        self.session.push_deliveries(self, tag, messages, nbytes)

    def take(self, tags: list[int], cumulative: bool) -> list[Any]:
        """Remove acked/nacked tags from the window; return their source keys.

        ``cumulative`` (or ack mode ``client``) settles every tag up to the highest named.
        Unknown tags are ignored (already settled, or timed out and redelivered).
        """
        inflight = self.window.inflight
        if not inflight or not tags:
            return []
        if cumulative or self.options.ack_mode is AckMode.CLIENT:
            top = max(tags)
            keys = []
            for tag in list(inflight):
                if tag > top:
                    break
                keys.append(inflight.pop(tag))
            return keys
        return [inflight.pop(t) for t in tags if t in inflight]

    def forget(self, key: Any) -> None:
        """Drop a delivery from the window without a settle (its ack timed out)."""
        inflight = self.window.inflight
        for tag, k in inflight.items():
            if k == key:
                del inflight[tag]
                return

    def __repr__(self) -> str:
        return f"<Subscription {self.sid} {self.destination} on {self.session.name}>"


class TopicSource:
    """The topic side of a subscription: transient fanout through the router."""

    __slots__ = ("router",)

    kind = "topic"

    def __init__(self, router: TopicRouter[TopicReceiver]) -> None:
        self.router = router  # one for every topic subscription: the pattern is theirs

    def detach(self, sub: Subscription, *, requeue: list[Message]) -> None:
        self.router.remove(sub.name, sub)

    def settle(self, sub: Subscription, keys: list[Any], outcome: Outcome) -> None:
        return None  # topic messages are transient: nothing to redeliver

    def unsent(self, sub: Subscription, msg: Message) -> None:
        pass

    def pump(self) -> None:
        pass
