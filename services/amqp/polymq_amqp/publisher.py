"""basic.publish: routing, mandatory returns, publisher confirms, transactions.

A publish is routed without awaiting when the records it needs are cached (see
:mod:`polymq_server.exchanges.kinds` for where each exchange type sends it); otherwise the
session's busy task looks them up first, and reading waits, so a channel's publishes reach
the core in order.
A publish to a queue that cannot refuse it (no ``reject-publish`` bound; the default
exchange) joins its queue's batch in the session's :class:`Outbox`, published as one core
request once the frames of one read are handled (as STOMP's SENDs); the batch's answer
answers each of its messages. Every other publish is one core request per destination, so
that a refusal names the message that was refused (a batch is refused whole). The outbox is
flushed before any such request and before the session's busy task runs, so the core gets
each channel's messages in order. The client puts every request of a loop iteration in one
frame.

The core's answer decides the rest: a topic publish says how many subscribers and bound
queues took the message, and which bound queues refused it (full under ``reject``); a
queue publish that is refused fails with QueueFull. A message nothing took (no queue, no
subscriber; or the default exchange naming no queue) is returned with basic.return 312
NO_ROUTE when it is mandatory. In confirm mode each publish is then answered with
basic.ack, or basic.nack when a queue refused it (after the return, if any), or when the
core could not take it now (``unavailable``: a cluster without a majority, a shard changing
leader, a durable queue it was routed into whose leader, on another node, did not commit it
or did not answer in time). A refused message on a channel without confirms is dropped, as
in RabbitMQ.
While a mandatory publish awaits the core, a later method of its channel that the broker
answers waits for it (``returns_sent``, see ``channels.py``), so that the basic.return comes
before that answer, in the channel's order as RabbitMQ sends it.

The codec gives a run of publishes that differ only in their bodies as one event
(:class:`~polymq_amqp.wire.events.ContentRun`): it is routed, checked and authorized once, its
messages are made from one template, and in a batch it is one entry whose answer answers
each message (a return each, a confirm each); off the batch path each of its messages is
one publish, as above.

In a transaction publishes are routed at once (an unknown exchange is still a 404) but kept
until tx.commit, which publishes them in order and answers after the core did.
"""

from __future__ import annotations

import asyncio
import copy
from functools import partial
from typing import Final, Protocol

from pamqp import commands

from polymq.answers import Published
from polymq.errors import PolymqError, QueueFull, Unavailable
from polymq.types import Message
from polymq_server.auth.provider import Permission
from polymq_server.exchanges.resolution import Missing, route_later, route_now
from polymq_server.names import UnmappableName, reply_target

from . import replyto
from .errors import (
    NO_ROUTE,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    ChannelException,
    ConnectionException,
)
from .parts import ChannelHost, PartHost
from .properties import PublishTemplate, delivery_properties
from .route import check_publish
from .topology import QueueRecord
from .wire.events import Content, ContentRun
from .wire.tables import from_tagged

__all__ = ["AmqpPublisher", "Outbox", "PublisherHost", "PublisherSession"]

_BATCH_BYTES: Final = 4 * 1024 * 1024  # a queue's batch goes to the core past this
_REJECTING: Final = frozenset({"reject-publish", "reject-publish-dlx"})


class _Publish:
    """One basic.publish on its way to the core, or a run of them with one fate (the
    messages of a :class:`ContentRun` in one batch)."""

    __slots__ = (
        "due",
        "failed",
        "messages",
        "method",
        "nbytes",
        "pending",
        "refused",
        "routed",
        "seq",
    )

    def __init__(
        self, seq: int, method: commands.Basic.Publish, messages: list[Message], nbytes: int
    ) -> None:
        self.seq = seq  # the first one's confirm sequence number (0: not in confirm mode)
        self.method = method
        self.messages = messages
        self.nbytes = nbytes  # of the bodies
        self.pending = 0  # core answers awaited
        self.routed = False
        self.refused = False
        self.failed: BaseException | None = None
        self.due = False  # mandatory, awaiting the core: its basic.return may be due


class PublisherSession(ChannelHost, Protocol):
    """The session as a channel's publisher sees it: a part's view (``parts.py``), and the
    outbox that batches its publishes."""

    @property
    def outbox(self) -> Outbox: ...


class PublisherHost(PartHost, Protocol):
    """What a publisher asks of its channel: a part's view (``parts.py``) whose session has
    the outbox, and its confirms and transaction mode. A protocol, so that this module need
    not import ``channel.py``, which imports it."""

    @property
    def session(self) -> PublisherSession: ...
    @property
    def closed(self) -> bool: ...
    @property
    def confirming(self) -> bool: ...
    @property
    def transactional(self) -> bool: ...
    @property
    def unconfirmed(self) -> dict[int, None]: ...

    def confirm(self, seq: int, ok: bool) -> None: ...


class _Batch:
    __slots__ = ("items", "messages", "nbytes")

    def __init__(self) -> None:
        self.items: list[tuple[AmqpPublisher, _Publish]] = []
        self.messages: list[Message] = []
        self.nbytes = 0


class Outbox:
    """The publishes of one session that go to the core as one request per queue."""

    __slots__ = ("batches", "session")

    def __init__(self, session: ChannelHost) -> None:
        self.session = session
        self.batches: dict[str, _Batch] = {}

    def add(self, dest: str, publisher: AmqpPublisher, p: _Publish) -> None:
        batch = self.batches.get(dest)
        if batch is None:
            batch = self.batches[dest] = _Batch()
        batch.items.append((publisher, p))
        batch.messages += p.messages
        batch.nbytes += p.nbytes
        if batch.nbytes >= _BATCH_BYTES:
            del self.batches[dest]
            self._publish(dest, batch)

    def flush(self) -> None:
        """Publish every batch (before any other core request of the session)."""
        if self.batches:
            batches, self.batches = self.batches, {}
            for dest, batch in batches.items():
                self._publish(dest, batch)

    def clear(self) -> None:
        self.batches.clear()

    def _publish(self, dest: str, batch: _Batch) -> None:
        try:
            fut = self.session.client().publish_soon(dest, batch.messages)
        except Exception as exc:  # no client (the core link is down)
            fut = self.session.loop.create_future()
            fut.set_exception(exc)
            self._answered(dest, batch, fut)
            return
        fut.add_done_callback(partial(self._answered, dest, batch))

    def _answered(self, dest: str, batch: _Batch, fut: asyncio.Future[Published]) -> None:
        if not fut.cancelled() and isinstance(fut.exception(), QueueFull):
            # the queue refuses after all (declared with a bound elsewhere): from now on its
            # messages go one by one, so that a refusal names one message
            refusing = self.session.hub.refusing
            if len(refusing) >= 10_000:
                refusing.clear()
            refusing.add(dest)
            self.session.reads += 1  # (and a publisher's last route is forgotten)
        # one answer for all: the same outcome for each message, in order
        routed, refused, failed = _outcome(fut)
        session = self.session
        for _publisher, p in batch.items:
            p.pending = 0
            p.routed = routed
            p.refused = refused
            p.failed = failed
            session.inflight -= len(p.messages)
            session.inflight_bytes -= p.nbytes
        try:
            session.update_reading()
        except Exception as exc:  # pragma: no cover - a bug: this connection only
            session.fail(exc, 0)
        for publisher, p in batch.items:
            try:
                publisher._done(p)
            except Exception as exc:  # pragma: no cover - a bug: this connection only
                session.fail(exc, 0)


class AmqpPublisher:
    def __init__(self, channel: PublisherHost) -> None:
        self.channel = channel
        self.session = channel.session
        self.tx: list[tuple[commands.Basic.Publish, list[str], Message]] = []
        self.tx_bytes = 0
        self._seq = 0
        self._batch = False  # the publish being routed may join its queue's batch
        # the last publish to a cached queue: (session.reads, routing key, dest, batch)
        self._last: tuple[int, str, str, bool] | None = None
        self._template = PublishTemplate()  # the message of the last properties, kept
        # mandatory publishes awaiting the core (a basic.return may be due for each), and
        # what waits until there are none (see returns_sent)
        self.returns_due = 0
        self._no_returns_due: asyncio.Future[None] | None = None

    def close(self) -> None:
        self.tx.clear()
        self.tx_bytes = 0

    # ---- routing --------------------------------------------------------------------------
    def publish(self, content: Content | ContentRun) -> None:
        m = content.method
        if m.immediate:
            raise ConnectionException(NOT_IMPLEMENTED, "immediate=true", 60, 40)
        self._batch = False
        route = self._route_now(content)
        if route is None:  # a record to read first; later frames wait
            self.session.start_busy(self._publish_later(content), self.channel.number, m)
            return
        self._accept(content, route)

    def _route_now(self, content: Content | ContentRun) -> list[str] | None:
        topology = self.session.topology
        names = self.channel.names
        exchange = content.method.exchange or ""
        routing_key = content.method.routing_key or ""
        if not exchange:
            last = self._last
            reads = self.session.reads
            if last is not None and last[0] == reads and last[1] == routing_key:
                self._batch = last[3]  # as a moment ago, in the same read
                return [last[2]]
            if routing_key.startswith(replyto.PREFIX):  # a reply to a direct reply-to
                topic = replyto.core_topic(routing_key)
                return [topic] if topic is not None else []
            queue = topology.cached_queue(names, routing_key)
            if queue is not None:  # declared over AMQP: its arguments say if it may refuse
                dest = names.queue(routing_key)
                self._batch = _cannot_refuse(queue, dest, self)
                self._last = (reads, routing_key, dest, self._batch)
                return [dest]
            try:
                known = topology.known_queue(names, routing_key)
            except UnmappableName:
                return []
            if known is None:
                return None
            return [names.queue(routing_key)]
        rec = topology.cached_exchange(names, exchange)
        if rec is None:
            return None
        check_publish(names, rec)
        try:
            return route_now(topology, names, rec, routing_key, content.properties.headers)
        except Missing:
            return None

    async def _publish_later(self, content: Content | ContentRun) -> None:
        try:
            route = await self._route_later(content)
        except (Unavailable, TimeoutError):
            # A lookup the core could not answer now (the node holding the record is cut
            # off, or its shard changing leader): in confirm mode this message is nacked,
            # as a publish the core could not take; the connection and its other publishes
            # go on. Without confirms there is no answer for one message: as before.
            ch = self.channel
            if not ch.confirming or ch.transactional:
                raise
            count = 1 if isinstance(content, Content) else len(content.bodies)
            seq = self._seq + 1
            self._seq += count
            for n in range(seq, seq + count):
                ch.unconfirmed[n] = None
                ch.confirm(n, False)
            return
        if not self.channel.closed:
            self._accept(content, route)

    async def _route_later(self, content: Content | ContentRun) -> list[str]:
        topology = self.session.topology
        names = self.channel.names
        exchange = content.method.exchange or ""
        routing_key = content.method.routing_key or ""
        self._batch = False
        if not exchange:
            try:
                exists = await topology.queue_exists(names, routing_key)
            except UnmappableName:
                exists = False
            route = [names.queue(routing_key)] if exists else []
        else:
            rec = await topology.exchange(names, exchange)
            if rec is None:
                raise ChannelException(
                    NOT_FOUND, f"no exchange '{exchange}' in vhost '{names.vhost}'"
                )
            check_publish(names, rec)
            route = await route_later(topology, names, rec, routing_key, content.properties.headers)
        return route

    def _accept(self, content: Content | ContentRun, route: list[str]) -> None:
        session = self.session
        ch = self.channel
        props = content.properties
        if props.reply_to == replyto.PSEUDO_QUEUE:
            props = self._reply_to(props)
        principal = session.principal
        if (
            props.user_id
            and principal is not None
            and not principal.anonymous
            and props.user_id != principal.name
        ):
            raise ChannelException(
                PRECONDITION_FAILED,
                f"user_id property set to '{props.user_id}' but authenticated user was "
                f"'{principal.name}'",
            )
        for dest in route:
            session.authorize(Permission.WRITE, dest)
        m = content.method
        exchange = m.exchange or ""
        routing_key = m.routing_key or ""
        make = self._template.message
        names = ch.names
        if isinstance(content, Content):
            bodies = [content.body]
        else:
            bodies = content.bodies
        messages = [make(props, body, exchange, routing_key, names) for body in bodies]
        reply = reply_target(messages[0].reply_to)  # (one set of properties for them all)
        if reply is not None and not reply.startswith(replyto.CORE_PREFIX):  # (no deputy)
            session.authorize(Permission.WRITE, reply)  # a responder writes there: so must we
        if ch.transactional:
            s = ch.settings
            for message in messages:
                self.tx_bytes += len(message.body)
                if len(self.tx) >= s.amqp_max_tx_messages or self.tx_bytes > s.amqp_max_tx_bytes:
                    raise ChannelException(
                        PRECONDITION_FAILED,
                        f"transaction too large: at most {s.amqp_max_tx_messages} messages "
                        f"and {s.amqp_max_tx_bytes} bytes",
                    )
                self.tx.append((m, route, message))
            return
        self._send(m, route, messages)

    def _reply_to(self, props: commands.Basic.Properties) -> commands.Basic.Properties:
        """The properties of a request naming ``amq.rabbitmq.reply-to``: the channel's own
        reply-to name instead (a copy: the codec's events are never changed)."""
        name = self.channel.reply_to
        if name is None:
            raise ChannelException(PRECONDITION_FAILED, "fast reply consumer does not exist")
        props = copy.copy(props)
        props.reply_to = name
        return props

    # ---- to the core ---------------------------------------------------------------------
    def _send(
        self, method: commands.Basic.Publish, route: list[str], messages: list[Message]
    ) -> None:
        ch = self.channel
        session = self.session
        seq = 0
        if ch.confirming:
            seq = self._seq + 1
            self._seq += len(messages)
            unconfirmed = ch.unconfirmed
            for n in range(seq, self._seq + 1):
                unconfirmed[n] = None
        if self._batch and route:
            nbytes = 0
            for message in messages:
                nbytes += len(message.body)
            p = _Publish(seq, method, messages, nbytes)
            p.pending = 1
            self._due(p)
            session.inflight += len(messages)
            session.inflight_bytes += nbytes
            session.outbox.add(route[0], self, p)
            return
        if route:
            session.outbox.flush()  # what was read before goes first
            client = session.client()
        for message in messages:
            p = _Publish(seq, method, [message], len(message.body))
            if seq:
                seq += 1
            if not route:
                self._done(p)
                continue
            p.pending = len(route)
            self._due(p)
            session.inflight += 1
            session.inflight_bytes += p.nbytes
            for dest in route:
                fut = client.publish_soon(dest, [message])
                fut.add_done_callback(partial(self.answered, p))

    def answered(self, p: _Publish, fut: asyncio.Future[Published]) -> None:
        p.pending -= 1
        routed, refused, failed = _outcome(fut)
        p.routed |= routed
        p.refused |= refused
        if failed is not None:
            p.failed = failed
        if p.pending:
            return
        session = self.session
        session.inflight -= 1
        session.inflight_bytes -= p.nbytes
        try:
            session.update_reading()
            self._done(p)
        except Exception as exc:  # pragma: no cover - a bug: this connection only
            session.fail(exc, 0)

    def _done(self, p: _Publish) -> None:
        try:
            self._settle(p)
        finally:
            self._returned(p)

    def _settle(self, p: _Publish) -> None:
        ch = self.channel
        session = self.session
        if ch.closed or session.closing:
            return
        if p.failed is not None:
            if p.seq and isinstance(p.failed, Unavailable):
                # In confirm mode a message the core could not take now (a cluster with no
                # majority, a shard changing leader) is nacked, as RabbitMQ nacks what a
                # quorum queue could not commit: the publisher retries; the connection stays.
                for seq in range(p.seq, p.seq + len(p.messages)):
                    ch.confirm(seq, False)
                return
            session.fail(p.failed, ch.number, p.method)
            return
        if p.method.mandatory and not p.routed:
            for message in p.messages:
                self._return(p.method, message)
        if p.seq:
            ok = not p.refused
            for seq in range(p.seq, p.seq + len(p.messages)):
                ch.confirm(seq, ok)

    # ---- returns in the channel's order -------------------------------------------------------
    def _due(self, p: _Publish) -> None:
        if p.method.mandatory:
            p.due = True
            self.returns_due += 1

    def _returned(self, p: _Publish) -> None:
        """``p`` is answered (its return sent, if it had one): wake what waits once no
        return is due."""
        if p.due:
            p.due = False
            self.returns_due -= 1
            waiter = self._no_returns_due
            if not self.returns_due and waiter is not None:
                self._no_returns_due = None
                if not waiter.done():
                    waiter.set_result(None)

    async def returns_sent(self) -> None:
        """Wait until no mandatory publish of this channel awaits the core: every
        basic.return due is sent (RabbitMQ sends a return before it answers any later
        method of the channel)."""
        while self.returns_due:
            if self._no_returns_due is None:
                self._no_returns_due = self.session.loop.create_future()
            await self._no_returns_due

    def _return(self, m: commands.Basic.Publish, message: Message) -> None:
        ret = commands.Basic.Return(NO_ROUTE, "NO_ROUTE", m.exchange or "", m.routing_key or "")
        props = delivery_properties(message, self.channel.names)
        if self.session.send_content(self.channel.number, ret, props, message.body):
            self.session.metrics.returns.inc()

    # ---- transactions ----------------------------------------------------------------------
    def rollback(self) -> None:
        self.close()

    async def commit(self) -> None:
        """Publish what the transaction holds, in order; return the unroutable mandatory
        ones. A refusal (a full queue) drops that message, as without a transaction."""
        items, self.tx, self.tx_bytes = self.tx, [], 0
        if not items:
            return
        session = self.session
        session.outbox.flush()
        client = session.client()
        waits: list[tuple[_Publish, list[asyncio.Future[Published]]]] = []
        for method, route, message in items:
            p = _Publish(0, method, [message], len(message.body))
            futs = [client.publish_soon(dest, [message]) for dest in route]
            waits.append((p, futs))
        for p, futs in waits:
            for result in await asyncio.gather(*futs, return_exceptions=True):
                if isinstance(result, QueueFull):
                    p.routed = True
                elif isinstance(result, BaseException):
                    if isinstance(result, PolymqError | TimeoutError):
                        raise result
                    raise result
                else:
                    _tally(p, result)
            if p.method.mandatory and not p.routed:
                self._return(p.method, p.messages[0])


def _outcome(fut: asyncio.Future[Published]) -> tuple[bool, bool, BaseException | None]:
    """What the core's answer for one destination says: routed, refused, failed."""
    if fut.cancelled():
        return False, False, Unavailable("the publish was cancelled")
    exc = fut.exception()
    if isinstance(exc, QueueFull):
        return True, True, None
    if exc is not None:
        return False, False, exc
    routed, refused = _routed(fut.result())
    return routed, refused, None


def _tally(p: _Publish, result: Published) -> None:
    """What the core's answer says about one destination of ``p``."""
    routed, refused = _routed(result)
    if refused:
        p.refused = True
    if routed:
        p.routed = True


def _routed(result: Published) -> tuple[bool, bool]:
    """Did the message reach anyone, and did a queue refuse it? A queue's answer says it
    took it; a topic's counts its subscribers, the bound queues that took a copy and those
    that refused one."""
    if not result.to_topic:
        return True, False
    refused = bool(result.refused)
    return bool(result.subscribers or result.queues or refused), refused


def _cannot_refuse(rec: QueueRecord | None, dest: str, publisher: AmqpPublisher) -> bool:
    """May a publish to ``dest`` join its batch: its queue never refuses a message (no
    ``x-overflow: reject-publish`` with a length bound), as far as this frontend knows?"""
    if rec is None or dest in publisher.session.hub.refusing:
        return False
    args = rec.arguments
    if not args:
        return True
    overflow = args.get("x-overflow")
    if overflow is None:
        return True
    try:
        value = from_tagged(overflow)
    except (ValueError, TypeError):
        return False
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    return value not in _REJECTING or not ("x-max-length" in args or "x-max-length-bytes" in args)
