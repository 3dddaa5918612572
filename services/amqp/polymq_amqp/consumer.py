"""basic.consume, basic.cancel, basic.get, and the basic.deliver frames.

One :class:`Consumer` per basic.consume listens to one core subscription (it is the
:class:`polymq.client.DeliveryListener`):

===================  ===========================================  =========================
AMQP consumer        core subscription                             acknowledgement
===================  ===========================================  =========================
``no_ack=false``     ``client-individual``, window = the qos       basic.ack / nack / reject
                     prefetch (0: ``amqp_max_prefetch``)           name each message
``no_ack=true``      ``client`` (cumulative), window =             the frontend acks as it
                     ``amqp_noack_window``                         hands deliveries to the
                                                                   socket: a slow client
                                                                   slows its own window, and
                                                                   what it never got goes
                                                                   back to the queue
===================  ===========================================  =========================

``x-priority`` in basic.consume's arguments is the core subscription's ``priority``: the
queue serves the consumers of the highest priority that have room in their window first
(RabbitMQ's consumer priorities).

basic.cancel stops deliveries at once; messages delivered and not yet acknowledged stay
acknowledgeable (as in RabbitMQ), and the core subscription is released when the last of
them is settled (what the core sent meanwhile goes back to the queue then, marked
redelivered). An ``auto_delete`` queue is deleted when its last consumer is gone. A queue
deleted under a consumer ends it with a basic.cancel from the server, for clients that
announce ``consumer_cancel_notify``.

basic.get is a core pull with a lease of ``amqp_get_visibility`` seconds (the message goes
back to the queue if it is not acknowledged by then, or when the channel closes); its
``message_count`` is the queue's ready count after the pull.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, Final, Protocol

from pamqp import commands

from polymq.answers import QueueStats
from polymq.client import Subscription
from polymq.errors import ConnectionClosed, PolymqError, Unavailable
from polymq.types import Message, Outcome
from polymq_server.auth.provider import Permission
from polymq_server.link.corelink import CoreLink

from . import replyto
from .deliver import DeliverFrames, shown_route
from .errors import (
    ACCESS_REFUSED,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    ChannelException,
    ConnectionException,
)
from .parts import PartHost
from .properties import delivery_properties

if TYPE_CHECKING:
    from .declarations import Declarations

__all__ = ["AmqpConsumers", "Consumer", "ConsumerHost", "Pending"]

log = logging.getLogger(__name__)

_BIG_BUFFER: Final = 1 << 40  # core buffer of window-bounded subscriptions: never reached


class Consumer:
    """A :class:`polymq.client.DeliveryListener` relaying to one channel."""

    __slots__ = (
        "auto_delete",
        "cancelled",
        "channel",
        "closed",
        "core",
        "core_queue",
        "exclusive",
        "frames",
        "no_ack",
        "outstanding",
        "queue",
        "reply",
        "tag",
    )

    def __init__(
        self,
        channel: ConsumerHost,
        tag: str,
        queue: str,
        core_queue: str,
        *,
        no_ack: bool,
        exclusive: bool,
        auto_delete: bool,
    ) -> None:
        self.channel = channel
        self.tag = tag
        self.queue = queue
        self.core_queue = core_queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.auto_delete = auto_delete
        self.reply = False  # direct reply-to: an auto-acknowledged topic subscription
        self.core: Subscription | None = None
        self.closed = False  # released: its core subscription is (being) unsubscribed
        self.cancelled = False  # basic.cancel: no more deliveries, draining what is out
        self.outstanding = 0  # delivered and not yet acknowledged
        self.frames = DeliverFrames(channel.number, tag, channel.names)

    @property
    def live(self) -> bool:
        return not (self.closed or self.cancelled or self.channel.closed)

    # ---- polymq.client.DeliveryListener -------------------------------------------------
    def on_deliver(self, sub: Subscription, tags: list[int], messages: list[Message]) -> None:
        if self.core is None:
            self.core = sub  # deliveries may come before subscribe() returns
        if not self.live:
            return  # left unacknowledged at the core; they go back when it is unsubscribed
        try:
            self.channel.consumers.deliver(self, tags, messages)
        except Exception as exc:  # never into the shared client's data_received
            self.channel.session.fail(exc, 0)

    def on_end(self, sub: Subscription, error: BaseException) -> None:
        if not self.closed:
            try:
                self.channel.consumers.ended(self, error)
            except Exception as exc:  # pragma: no cover - a bug; never into the client
                self.channel.session.fail(exc, 0)

    # ---- acknowledgements -----------------------------------------------------------------
    def settle_many(self, core_tags: list[int], outcome: Outcome) -> None:
        """Ack, requeue or reject each of ``core_tags`` at the core, in order."""
        self.outstanding -= len(core_tags)
        core = self.core
        if core is None or core.closed:
            return  # its queue was deleted, or the link broke: nothing left to settle
        if outcome is Outcome.ACK:
            ack = core.ack
            for tag in core_tags:
                ack(tag)
        else:
            requeue = outcome is Outcome.REQUEUE
            for tag in core_tags:
                with contextlib.suppress(PolymqError):
                    core.nack(tag, requeue=requeue)

    def written(self, core_tag: int) -> None:
        """A no-ack delivery left for the socket: the core may forget it."""
        core = self.core
        if core is not None and not core.closed:
            core.ack(core_tag)

    def __repr__(self) -> str:
        return f"<Consumer {self.tag!r} on {self.queue!r}>"


class Pending:
    """One unacknowledged delivery: a consumer's core tag, or a basic.get lease."""

    __slots__ = ("consumer", "receipt", "tag")

    def __init__(self, consumer: Consumer | None, tag: int, receipt: str | None) -> None:
        self.consumer = consumer
        self.tag = tag
        self.receipt = receipt


class ConsumerHost(PartHost, Protocol):
    """What a channel's consumers ask of it: a part's view (``parts.py``), its prefetch
    windows and unacknowledged deliveries, its queue declarations and delivery tags. A
    protocol, so that this module need not import ``channel.py``, which imports it."""

    # what the consumers keep up to date
    reply_to: str | None
    consumer_unacked: int

    @property
    def closed(self) -> bool: ...
    @property
    def consumers(self) -> AmqpConsumers: ...
    @property
    def declarations(self) -> Declarations: ...
    @property
    def prefetch(self) -> int: ...
    @property
    def global_prefetch(self) -> int: ...
    @property
    def held(self) -> deque[tuple[Consumer, int, Message]]: ...
    @property
    def unacked(self) -> dict[int, Pending]: ...

    def next_tag(self) -> int: ...
    def next_tags(self, n: int) -> int: ...
    def resolve_queue(self, name: str) -> str: ...
    def settle_leases(self, receipts: list[str], outcome: Outcome) -> None: ...


class AmqpConsumers:
    """The consumers of one channel, and the methods that work on them."""

    def __init__(self, channel: ConsumerHost) -> None:
        self.channel = channel
        self.session = channel.session
        self.by_tag: dict[str, Consumer] = {}
        self.draining: set[Consumer] = set()  # cancelled, with deliveries unacknowledged

    # ---- deliveries ----------------------------------------------------------------------
    def deliver(self, consumer: Consumer, tags: list[int], messages: list[Message]) -> None:
        """Deliver ``messages`` (core ``tags``) in one write; those past the channel's global
        prefetch window wait in ``held``."""
        ch = self.channel
        if not self.session.open:
            return
        n = len(messages)
        if len(tags) != n:
            raise ValueError(f"{len(tags)} delivery tags for {n} messages")
        if not n:
            return
        room = n
        if not consumer.no_ack:
            limit = ch.global_prefetch
            if ch.held:
                room = 0
            elif limit:
                room = min(n, max(0, limit - ch.consumer_unacked))
        if room == n:
            self._send(consumer, tags, messages)
            return
        if room and not self._send(consumer, tags[:room], messages[:room]):
            return  # not sent (the channel is closing): nor would the rest be
        ch.held.extend(zip(repeat(consumer), tags[room:], messages[room:]))

    def deliver_one(self, consumer: Consumer, core_tag: int, message: Message) -> None:
        self._send(consumer, (core_tag,), (message,))

    def _send(
        self, consumer: Consumer, core_tags: Sequence[int], messages: Sequence[Message]
    ) -> bool:
        ch = self.channel
        session = self.session
        n = len(messages)
        first = ch.next_tags(n)
        frames: list[bytes] = []
        consumer.frames.frames(frames, first, messages, session.codec.frame_max)
        if not session.send_delivers(ch.number, frames, n):
            return False
        if consumer.no_ack:
            if not consumer.reply:
                session.ack_after_write(consumer, core_tags[-1])
        else:
            pending = map(Pending, repeat(consumer), core_tags, repeat(None))
            ch.unacked.update(zip(range(first, first + n), pending, strict=True))
            ch.consumer_unacked += n
            consumer.outstanding += n
        session.metrics.delivered_consume.inc(n)
        return True

    def ended(self, consumer: Consumer, error: BaseException) -> None:
        """The core ended a subscription: its queue was deleted, or the link broke."""
        session = self.session
        if consumer.closed or session.closing:
            return
        core = consumer.core
        if isinstance(error, ConnectionClosed | Unavailable) or (
            core is not None and core.client.closed
        ):
            session.core_lost(str(error))
            return
        consumer.closed = True
        self.by_tag.pop(consumer.tag, None)
        self.draining.discard(consumer)
        session.metrics.consumers.dec()
        self._forget(consumer)
        if session.cancel_notify and not consumer.cancelled:
            session.send_method(
                self.channel.number, commands.Basic.Cancel(consumer.tag, nowait=True)
            )
        log.debug("amqp %s: consumer %r ended: %s", session, consumer.tag, error)

    # ---- basic.consume ---------------------------------------------------------------------
    async def consume(self, method: commands.Basic.Consume) -> None:
        ch = self.channel
        session = self.session
        s = ch.settings
        queue = ch.resolve_queue(method.queue or "")
        tag = method.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in self.by_tag:
            raise ConnectionException(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if len(self.by_tag) >= s.amqp_max_consumers:
            raise ChannelException(
                NOT_ALLOWED, f"at most {s.amqp_max_consumers} consumers per channel"
            )
        if queue == replyto.PSEUDO_QUEUE:
            await self._consume_replies(method, tag)
            return
        rec = await ch.declarations.existing_queue(queue, exclusive_use=True)
        core_queue = rec.core if rec is not None else ch.names.queue(queue)
        session.authorize(Permission.READ, core_queue)
        hub = session.hub
        if core_queue in hub.exclusive_consumers:
            raise ChannelException(
                ACCESS_REFUSED, f"queue '{queue}' in vhost '{ch.names.vhost}' in exclusive use"
            )
        if method.exclusive:
            stats = await ch.session.topology.core_has(core_queue)
            if stats is not None and stats.subscribers > 0:
                raise ChannelException(
                    ACCESS_REFUSED,
                    f"queue '{queue}' in vhost '{ch.names.vhost}' has consumers: it cannot be "
                    "used exclusively",
                )
        consumer = Consumer(
            ch,
            tag,
            queue,
            core_queue,
            no_ack=bool(method.no_ack),
            exclusive=bool(method.exclusive),
            auto_delete=rec is not None and rec.auto_delete,
        )
        if consumer.no_ack:
            window = s.amqp_noack_window
            core_options: dict[str, Any] = {"ack_mode": "client"}
        else:
            window = min(ch.prefetch or s.amqp_max_prefetch, s.amqp_max_prefetch)
            if ch.global_prefetch:
                window = min(window, ch.global_prefetch)
            core_options = {"ack_mode": "client-individual"}
        core_options.update(
            prefetch=window, buffer_messages=max(window, 10_000), buffer_bytes=_BIG_BUFFER
        )
        priority = _consumer_priority(method.arguments, tag)
        if priority:
            core_options["priority"] = priority
        if method.exclusive:
            hub.exclusive_consumers[core_queue] = f"{session.owner}/{ch.number}/{tag}"
        await self._subscribe(consumer, method, core_options)

    async def _consume_replies(self, method: commands.Basic.Consume, tag: str) -> None:
        """basic.consume from ``amq.rabbitmq.reply-to`` (see ``replyto.py``)."""
        ch = self.channel
        if not method.no_ack:
            raise ChannelException(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if ch.reply_to is not None:
            raise ChannelException(PRECONDITION_FAILED, "reply consumer already set")
        name = replyto.new_name()
        topic = replyto.core_topic(name)
        assert topic is not None
        consumer = Consumer(
            ch, tag, replyto.PSEUDO_QUEUE, topic, no_ack=True, exclusive=False, auto_delete=False
        )
        consumer.reply = True
        ch.reply_to = name
        core_options: dict[str, Any] = {
            "ack_mode": "auto",
            "prefetch": 0,
            "slow_policy": "drop",  # a requester too slow for its replies loses them
        }
        await self._subscribe(consumer, method, core_options)

    async def _subscribe(
        self, consumer: Consumer, method: commands.Basic.Consume, core_options: dict[str, Any]
    ) -> None:
        ch = self.channel
        session = self.session
        tag = consumer.tag
        core_queue = consumer.core_queue
        self.by_tag[tag] = consumer
        session.metrics.consumers.inc()
        if not method.nowait:  # before any delivery, as the spec wants
            session.send_method(ch.number, commands.Basic.ConsumeOk(tag))
        client = session.client()
        subscribing = client.subscribe(core_queue, listener=consumer, **core_options)
        task = asyncio.ensure_future(subscribing)
        try:
            core = await session.link.guard(client, asyncio.shield(task))
        except asyncio.CancelledError:
            link = session.link  # made after all (the session went away): released
            task.add_done_callback(lambda t: _release_late(link, t))
            raise
        except BaseException:
            if self.by_tag.get(tag) is consumer:
                del self.by_tag[tag]
                consumer.closed = True
                session.metrics.consumers.dec()
                self._forget(consumer)
            raise
        consumer.core = core
        if consumer.closed:
            session.link.spawn(_unsubscribe(core), "releasing a consumer")

    # ---- basic.cancel -----------------------------------------------------------------------
    def cancel(self, method: commands.Basic.Cancel) -> None:
        tag = method.consumer_tag or ""
        consumer = self.by_tag.pop(tag, None)
        if consumer is not None:
            consumer.cancelled = True
            if consumer.outstanding > 0 and not consumer.no_ack:
                self.draining.add(consumer)
            else:
                self.release(consumer)
        if not method.nowait:
            self.session.send_method(self.channel.number, commands.Basic.CancelOk(tag))

    def release(self, consumer: Consumer) -> None:
        """Unsubscribe at the core (what is unacknowledged goes back to the queue); delete
        an auto-delete queue that has no consumer left."""
        if consumer.closed:
            return
        consumer.closed = True
        self.draining.discard(consumer)
        self.by_tag.pop(consumer.tag, None)
        session = self.session
        session.metrics.consumers.dec()
        self._forget(consumer)
        link = session.link
        core = consumer.core
        if not link.connected:
            return
        names = self.channel.names
        topology = session.topology

        async def release() -> None:
            if core is not None and not core.closed:
                with contextlib.suppress(PolymqError, TimeoutError):
                    await asyncio.wait_for(core.unsubscribe(), 10.0)
            if consumer.auto_delete:
                with contextlib.suppress(PolymqError, TimeoutError):
                    stats = await topology.core_has(consumer.core_queue)
                    if stats is not None and not stats.subscribers:
                        rec = await topology.queue(names, consumer.queue)
                        if rec is not None and rec.auto_delete:
                            log.debug("amqp: auto-delete queue %r has no consumer left", rec.name)
                            await topology.delete_queue(names, rec)

        link.spawn(release(), f"releasing consumer {consumer.tag!r}")

    def release_all(self) -> None:
        for consumer in [*self.by_tag.values(), *self.draining]:
            self.release(consumer)

    def _forget(self, consumer: Consumer) -> None:
        """The consumer is gone: its exclusive use of a queue, or the channel's reply-to."""
        if consumer.reply:
            self.channel.reply_to = None
        if consumer.exclusive:
            hub = self.session.hub
            owner = f"{self.session.owner}/{self.channel.number}/{consumer.tag}"
            if hub.exclusive_consumers.get(consumer.core_queue) == owner:
                del hub.exclusive_consumers[consumer.core_queue]

    # ---- basic.get -------------------------------------------------------------------------
    async def get(self, method: commands.Basic.Get) -> None:
        ch = self.channel
        session = self.session
        queue = ch.resolve_queue(method.queue or "")
        rec = await ch.declarations.existing_queue(queue, exclusive_use=True)
        core_queue = rec.core if rec is not None else ch.names.queue(queue)
        session.authorize(Permission.READ, core_queue)
        client = session.client()
        visibility = ch.settings.amqp_get_visibility
        pulled = client.pull(core_queue, 1, wait=0.0, visibility=visibility)
        counted = client.stats(core_queue)  # after the pull: the same frame, in order
        leases, stats = await session.link.guard(
            client, asyncio.gather(pulled, counted, return_exceptions=True)
        )
        if isinstance(leases, BaseException):
            raise leases
        count = stats.messages if isinstance(stats, QueueStats) else 0  # (or an exception)
        if not leases:
            session.send_method(ch.number, commands.Basic.GetEmpty())
            return
        lease = leases[0]
        message = lease.message
        if ch.closed:
            return
        dtag = ch.next_tag()
        exchange, routing_key = shown_route(message, ch.names)
        ok = commands.Basic.GetOk(
            dtag, message.delivery_count > 1, exchange, routing_key, message_count=count
        )
        props = delivery_properties(message, ch.names)
        if method.no_ack:
            ch.settle_leases([lease.receipt], Outcome.ACK)
        else:
            ch.unacked[dtag] = Pending(None, 0, lease.receipt)
        session.send_content(ch.number, ok, props, message.body)
        session.metrics.delivered_get.inc()


def _consumer_priority(arguments: dict[str, Any] | None, tag: str) -> int:
    """basic.consume's ``x-priority`` (RabbitMQ's consumer priorities; 0 without it)."""
    v = (arguments or {}).get("x-priority")
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not -(2**31) <= v < 2**31:
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-priority' for consumer '{tag}': {v!r} is not a 32-bit integer",
        )
    return v


async def _unsubscribe(core: Subscription) -> None:
    if not core.closed:
        with contextlib.suppress(PolymqError, TimeoutError):
            await asyncio.wait_for(core.unsubscribe(), 10.0)


def _release_late(link: CoreLink, task: asyncio.Future[Subscription]) -> None:
    if task.cancelled() or task.exception() is not None:
        return
    link.spawn(_unsubscribe(task.result()), "releasing a late consumer")
