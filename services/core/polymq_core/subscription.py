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

    from .routing import TopicRouter
    from .session import Session


class Source(Protocol):
    """What a subscription is attached to: a queue, a stream or the topic router."""

    def detach(self, sub: Subscription, *, requeue: list[Message]) -> None: ...
    def settle(
        self, sub: Subscription, keys: list[Any], outcome: Outcome
    ) -> asyncio.Future[None] | None:
        """Settle deliveries; returns the store write that makes it durable, if any."""

    def pump(self) -> None: ...


_KIND_TEXT = {k.value: k.value for k in Kind}  # one string per kind, shared

# Shared by every subscription with nothing unacked (most of them: auto mode, topics), so
# an idle subscription costs no dict of its own. Only ``deliver`` ever inserts, after
# replacing it with a dict of the subscription's own.
_NONE_UNACKED: dict[int, Any] = {}


class Subscription:
    """One subscription. A million idle ones must fit in little memory (ocamlmq's ~150 B
    each is the mark): the destination is kept as its kind's text (one shared string) and
    its name, which for a topic is the very string the router keys it by; the ack mode and
    prefetch are read from ``options``, which ``SubscribeOptions.from_dict`` interns."""

    __slots__ = (
        "closed",
        "inflight",
        "kind",
        "name",
        "next_tag",
        "options",
        "session",
        "sid",
        "source",
    )

    def __init__(
        self,
        session: Session,
        sid: int,
        destination: str | Destination,
        options: SubscribeOptions,
        source: Source,
    ) -> None:
        self.session = session
        self.sid = sid
        if isinstance(destination, Destination):
            self.kind: str = destination.kind.value
            self.name: str = destination.name
        else:
            kind, _, self.name = destination.partition("/")
            self.kind = _KIND_TEXT.get(kind, kind)
        self.options = options
        self.source = source
        # delivery tag -> the source's key for that delivery (a queue seq, a stream seq)
        self.inflight: dict[int, Any] = _NONE_UNACKED
        self.next_tag = 1
        self.closed = False

    @property
    def destination(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def auto(self) -> bool:
        return self.options.ack_mode is AckMode.AUTO

    @property
    def prefetch(self) -> int:
        return self.options.prefetch

    def has_credit(self) -> bool:
        """May the source deliver one more message now?"""
        if self.closed or not self.session.accepts(self):
            return False
        options = self.options
        prefetch = options.prefetch
        return prefetch == 0 or len(self.inflight) < prefetch or options.ack_mode is AckMode.AUTO

    def deliver(self, message: Message, key: Any) -> int:
        """Hand one message to the session; returns its delivery tag."""
        tag = self.next_tag
        self.next_tag = tag + 1
        if self.options.ack_mode is not AckMode.AUTO:
            inflight = self.inflight
            if inflight is _NONE_UNACKED:
                inflight = self.inflight = {}
            inflight[tag] = key
        self.session.push_delivery(self, tag, message, key)
        return tag

    def send(self, message: Message) -> None:
        """Hand over a message nobody redelivers (a topic's): no window, acks are no-ops."""
        tag = self.next_tag
        self.next_tag = tag + 1
        self.session.push_delivery(self, tag, message, None)

    def take(self, tags: list[int], cumulative: bool) -> list[Any]:
        """Remove acked/nacked tags from the window; return their source keys.

        ``cumulative`` (or ack mode ``client``) settles every tag up to the highest named.
        Unknown tags are ignored (already settled, or timed out and redelivered).
        """
        if not self.inflight or not tags:
            return []
        if cumulative or self.options.ack_mode is AckMode.CLIENT:
            top = max(tags)
            keys = []
            for tag in list(self.inflight):
                if tag > top:
                    break
                keys.append(self.inflight.pop(tag))
            return keys
        return [self.inflight.pop(t) for t in tags if t in self.inflight]

    def forget(self, key: Any) -> None:
        """Drop a delivery from the window without a settle (its ack timed out)."""
        for tag, k in self.inflight.items():
            if k == key:
                del self.inflight[tag]
                return

    def __repr__(self) -> str:
        return f"<Subscription {self.sid} {self.destination} on {self.session.name}>"


class TopicSource:
    """The topic side of a subscription: transient fanout through the router."""

    __slots__ = ("router",)

    def __init__(self, router: TopicRouter[Subscription]) -> None:
        self.router = router  # one for every topic subscription: the pattern is theirs

    def detach(self, sub: Subscription, *, requeue: list[Message]) -> None:
        self.router.remove(sub.name, sub)

    def settle(self, sub: Subscription, keys: list[Any], outcome: Outcome) -> None:
        return None  # topic messages are transient: nothing to redeliver

    def unsent(self, sub: Subscription, msg: Message) -> None:
        pass

    def pump(self) -> None:
        pass
