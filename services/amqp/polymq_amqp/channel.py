"""One AMQP channel: method dispatch, basic.qos, acknowledgements, confirms, transactions.

Delivery tags are the channel's own, counting from 1; each unacknowledged one maps to a
core subscription's delivery tag (basic.consume) or to a pull lease (basic.get), so
basic.ack / nack / reject / recover settle the right thing at the core:

=====================  ======================================  ==========================
AMQP                   consumer delivery                       basic.get delivery
=====================  ======================================  ==========================
basic.ack              core ack (coalesced, fire-and-forget)    settle ``ack``
basic.nack/reject      core nack, requeue or not                settle ``requeue`` or
(requeue / not)        (not: dead-lettered, or dropped)         ``reject``
basic.recover          core nack with requeue of every          settle ``requeue``
                       unacknowledged delivery
=====================  ======================================  ==========================

``multiple`` covers every unacknowledged tag up to the one named (``0``: all of them). A tag
that names nothing unacknowledged is a 406 PRECONDITION_FAILED, as in RabbitMQ.

basic.qos: ``prefetch_count`` with ``global=false`` bounds each consumer started afterwards
(the core subscription's window); with ``global=true`` it bounds the channel's consumers
together (RabbitMQ's meaning): deliveries past it wait in the frontend until acks make room.
``prefetch_size`` is not supported (540, as RabbitMQ).

confirm.select: every publish gets a sequence number; its basic.ack goes out once the core
answered (after fsync for persistent messages into durable queues), its basic.nack when a
queue refused it (``reject-publish`` and full). Acks made in one loop iteration go out as one
``multiple`` ack where they are contiguous. tx.select: publishes and acknowledgements are kept
until tx.commit, which applies them in order; tx.rollback drops them.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from itertools import groupby, takewhile
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, Protocol

from pamqp import base, commands

from polymq.errors import PolymqError
from polymq.types import Outcome

from .consumer import AmqpConsumers, Consumer, Pending
from .declarations import Declarations
from .errors import (
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    ChannelException,
    ConnectionException,
)
from .publisher import AmqpPublisher, PublisherSession

if TYPE_CHECKING:
    from polymq.types import Message

__all__ = ["Channel", "ChannelSession", "Pending"]

_CONSUMER: Final[Callable[[Pending], Consumer | None]] = attrgetter("consumer")


class ChannelSession(PublisherSession, Protocol):
    """The session as a channel sees it: what its parts ask (``parts.py``, the publisher's
    outbox), and where its confirms are due. A protocol, so that this module need not
    import ``session.py``, which imports it."""

    def confirms_due(self, channel: Channel) -> None: ...


class Channel:
    def __init__(self, session: ChannelSession, number: int) -> None:
        self.session = session
        self.number = number
        self.hub = session.hub
        self.settings = session.settings
        self.names = session.names
        self.closed = False
        self.prefetch = 0  # per new consumer (global=false); 0 = unlimited
        self.global_prefetch = 0  # the channel's consumers together (global=true)
        self.unacked: dict[int, Pending] = {}  # delivery tag -> what settles it
        self.consumer_unacked = 0  # of those, consumer deliveries (what qos counts)
        self.held: deque[tuple[Consumer, int, Message]] = deque()  # past the global window
        self._tags = 0
        self.last_queue: str | None = None  # the queue "" stands for
        self.reply_to: str | None = None  # its direct reply-to name, while it consumes one
        self.confirming = False
        self.transactional = False
        self.tx_acks: list[tuple[Outcome, list[int]]] = []  # (outcome, the tags it settles)
        self.tx_settled: set[int] = set()  # the tags in tx_acks
        # confirms: sequence numbers not yet answered (in order), and answers to send
        self.unconfirmed: dict[int, None] = {}
        self.confirmed: list[tuple[int, bool]] = []
        self.consumers = AmqpConsumers(self)
        self.declarations = Declarations(self)
        self.publisher = AmqpPublisher(self)

    def __repr__(self) -> str:
        return f"<amqp channel {self.number} of {self.session}>"

    def next_tag(self) -> int:
        self._tags += 1
        return self._tags

    def next_tags(self, n: int) -> int:
        """The first of ``n`` delivery tags in a row."""
        first = self._tags + 1
        self._tags += n
        return first

    # ---- dispatch --------------------------------------------------------------------------
    def handle(self, method: base.Frame) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise ConnectionException(
                NOT_IMPLEMENTED,
                f"{method.name} is not implemented",
                method.index >> 16,
                method.index & 0xFFFF,
            )
        handler(self, method)

    def busy(self, coro: Any, method: base.Frame) -> None:
        self.session.start_busy(coro, self.number, method)

    def resolve_queue(self, name: str) -> str:
        """The queue a method names; "" is the last one declared on this channel."""
        if name:
            return name
        if self.last_queue is None:
            raise ConnectionException(
                NOT_ALLOWED, "no previously declared queue (an empty queue name needs one)"
            )
        return self.last_queue

    # ---- closing ---------------------------------------------------------------------------
    def teardown(self) -> None:
        """The channel is gone: release consumers (their unacknowledged messages go back to
        their queues) and requeue basic.get messages not acknowledged."""
        if self.closed:
            return
        self.closed = True
        self.held.clear()
        receipts = [p.receipt for p in self.unacked.values() if p.receipt is not None]
        self.unacked.clear()
        self.consumer_unacked = 0
        self.consumers.release_all()
        if receipts:
            self.settle_leases(receipts, Outcome.REQUEUE)
        self.publisher.close()

    # ---- channel.flow, basic.qos -------------------------------------------------------------
    def _flow(self, method: commands.Channel.Flow) -> None:
        if not method.active:
            raise ConnectionException(
                NOT_IMPLEMENTED, "channel.flow active=false is not supported", 20, 20
            )
        self.session.send_method(self.number, commands.Channel.FlowOk(active=True))

    def _flow_ok(self, method: commands.Channel.FlowOk) -> None:
        pass  # we never send channel.flow

    def _qos(self, method: commands.Basic.Qos) -> None:
        if method.prefetch_size:
            raise ConnectionException(
                NOT_IMPLEMENTED, "prefetch_size!=0 is not supported (use prefetch_count)", 60, 10
            )
        count = int(method.prefetch_count or 0)
        if method.global_:
            self.global_prefetch = count
            self.pump()
        else:
            self.prefetch = count
        self.session.send_method(self.number, commands.Basic.QosOk())

    # ---- acknowledgements -----------------------------------------------------------------
    def _covered(self, tag: int, multiple: bool) -> list[int]:
        """The unacknowledged tags a settle names: ``tag``, and with ``multiple`` every one
        before it (``multiple`` and ``0``: all of them); in a transaction, none settled in
        it already. A ``tag`` that names nothing unacknowledged is a 406, ``multiple`` or
        not (RabbitMQ's rule: a stale tag must not settle the deliveries before it)."""
        unacked, settled = self.unacked, self.tx_settled
        if multiple and tag == 0:
            return [t for t in unacked if t not in settled]
        if tag not in unacked or tag in settled:
            raise ChannelException(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        if not multiple:
            return [tag]
        # (unacked is in tag order: tags are issued rising and inserted as issued)
        return [t for t in takewhile(tag.__ge__, unacked) if t not in settled]

    def _take(self, tag: int, multiple: bool) -> list[Pending]:
        """What a settle outside a transaction takes out of ``unacked``."""
        unacked = self.unacked
        if not multiple:  # (the usual case first)
            p = unacked.pop(tag, None)
            if p is None:
                raise ChannelException(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            return [p]
        if tag == 0:
            taken = list(unacked.values())
            unacked.clear()
            return taken
        return [unacked.pop(t) for t in self._covered(tag, multiple)]

    def settle(self, tag: int, multiple: bool, outcome: Outcome) -> None:
        """Ack, requeue or reject deliveries (in a transaction: at commit; each tag is
        checked now, so that a commit never fails halfway, as RabbitMQ's does not)."""
        if self.transactional:
            if len(self.tx_acks) >= self.settings.amqp_max_tx_messages:
                raise ChannelException(PRECONDITION_FAILED, "transaction too large")
            tags = self._covered(tag, multiple)
            self.tx_settled.update(tags)
            self.tx_acks.append((outcome, tags))
            return
        self.apply(self._take(tag, multiple), outcome)

    def apply(self, pending: list[Pending], outcome: Outcome) -> None:
        receipts: list[str] = []
        touched: set[Consumer] = set()
        for consumer, run in groupby(pending, _CONSUMER):  # runs of one consumer, in order
            if consumer is None:
                receipts += [p.receipt for p in run if p.receipt is not None]
                continue
            tags = [p.tag for p in run]
            self.consumer_unacked -= len(tags)
            consumer.settle_many(tags, outcome)
            touched.add(consumer)
        if receipts:
            self.settle_leases(receipts, outcome)
        for consumer in touched:
            if consumer.cancelled and consumer.outstanding <= 0:
                self.consumers.release(consumer)
        self.pump()

    def settle_leases(self, receipts: list[str], outcome: Outcome) -> None:
        link = self.hub.link
        if not link.connected:
            return

        async def settle() -> None:
            with contextlib.suppress(PolymqError, TimeoutError):
                await link.call(lambda c: c.settle(receipts, outcome))

        link.spawn(settle(), "settling basic.get messages")

    def pump(self) -> None:
        """Deliver what waits for room in the channel's global prefetch window."""
        held = self.held
        limit = self.global_prefetch
        while held and (not limit or self.consumer_unacked < limit):
            consumer, tag, message = held.popleft()
            if consumer.live:
                self.consumers.deliver_one(consumer, tag, message)

    def _ack(self, method: commands.Basic.Ack) -> None:
        self.settle(int(method.delivery_tag or 0), bool(method.multiple), Outcome.ACK)

    def _nack(self, method: commands.Basic.Nack) -> None:
        outcome = Outcome.of_nack(bool(method.requeue))
        self.settle(int(method.delivery_tag or 0), bool(method.multiple), outcome)

    def _reject(self, method: commands.Basic.Reject) -> None:
        self.settle(int(method.delivery_tag or 0), False, Outcome.of_nack(bool(method.requeue)))

    def _recover(self, method: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        """Every unacknowledged delivery goes back to its queue (requeue=false, which the
        spec would redeliver to the same consumer, is treated the same way)."""
        taken = list(self.unacked.values())  # (those settled in a transaction too)
        self.unacked.clear()
        self.apply(taken, Outcome.REQUEUE)
        if isinstance(method, commands.Basic.Recover):
            self.session.send_method(self.number, commands.Basic.RecoverOk())

    # ---- confirms -------------------------------------------------------------------------
    def _confirm_select(self, method: commands.Confirm.Select) -> None:
        if self.transactional:
            raise ChannelException(
                PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10
            )
        self.confirming = True
        if not method.nowait:
            self.session.send_method(self.number, commands.Confirm.SelectOk())

    def confirm(self, seq: int, ok: bool) -> None:
        """The answer of publish ``seq`` is known: it goes out at the end of this tick."""
        if self.closed:
            return
        self.unconfirmed.pop(seq, None)
        self.confirmed.append((seq, ok))
        self.session.confirms_due(self)

    def flush_confirms(self) -> None:
        if self.closed or not self.confirmed:
            return
        ready, self.confirmed = sorted(self.confirmed), []
        low = next(iter(self.unconfirmed), None)
        metrics = self.session.metrics
        send = self.session.send_method
        for seq, ok in ready:
            if not ok:
                send(self.number, commands.Basic.Nack(seq, multiple=False, requeue=False))
                metrics.confirm_nack.inc()
        acks = [seq for seq, ok in ready if ok]
        below = [seq for seq in acks if low is None or seq < low]
        if len(below) > 1:  # every earlier tag is answered: one multiple ack covers them
            send(self.number, commands.Basic.Ack(below[-1], multiple=True))
        elif below:
            send(self.number, commands.Basic.Ack(below[0], multiple=False))
        for seq in acks[len(below) :]:
            send(self.number, commands.Basic.Ack(seq, multiple=False))
        metrics.confirm_ack.inc(len(acks))

    # ---- transactions ------------------------------------------------------------------------
    def _tx_select(self, method: commands.Tx.Select) -> None:
        if self.confirming:
            raise ChannelException(
                PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10
            )
        self.transactional = True
        self.session.send_method(self.number, commands.Tx.SelectOk())

    def _not_transactional(self, method: base.Frame) -> ChannelException:
        return ChannelException(
            PRECONDITION_FAILED,
            "channel is not transactional",
            method.index >> 16,
            method.index & 0xFFFF,
        )

    def _tx_commit(self, method: commands.Tx.Commit) -> None:
        if not self.transactional:
            raise self._not_transactional(method)
        acks, self.tx_acks = self.tx_acks, []
        self.tx_settled.clear()  # (no frame is handled before the commit is done)
        self.busy(self._commit(acks), method)

    async def _commit(self, acks: list[tuple[Outcome, list[int]]]) -> None:
        await self.publisher.commit()
        unacked = self.unacked
        for outcome, tags in acks:  # (a basic.recover in the transaction took some back)
            self.apply([unacked.pop(t) for t in tags if t in unacked], outcome)
        if acks:
            client = self.session.client()
            await self.hub.link.guard(client, client.ping())  # the core has the acks
        self.session.send_method(self.number, commands.Tx.CommitOk())

    def _tx_rollback(self, method: commands.Tx.Rollback) -> None:
        if not self.transactional:
            raise self._not_transactional(method)
        self.tx_acks = []
        self.tx_settled.clear()
        self.publisher.rollback()
        self.session.send_method(self.number, commands.Tx.RollbackOk())

    # ---- the rest, elsewhere ---------------------------------------------------------------
    def _consume(self, method: commands.Basic.Consume) -> None:
        self.busy(self.consumers.consume(method), method)

    def _cancel(self, method: commands.Basic.Cancel) -> None:
        self.consumers.cancel(method)

    def _cancel_ok(self, method: commands.Basic.CancelOk) -> None:
        pass  # the client's answer to our basic.cancel

    def _get(self, method: commands.Basic.Get) -> None:
        self.busy(self.consumers.get(method), method)

    def _exchange_declare(self, method: commands.Exchange.Declare) -> None:
        self.busy(self.declarations.exchange_declare(method), method)

    def _exchange_delete(self, method: commands.Exchange.Delete) -> None:
        self.busy(self.declarations.exchange_delete(method), method)

    def _exchange_bind(self, method: commands.Exchange.Bind) -> None:
        self.busy(self.declarations.exchange_bind(method), method)

    def _exchange_unbind(self, method: commands.Exchange.Unbind) -> None:
        self.busy(self.declarations.exchange_unbind(method), method)

    def _queue_declare(self, method: commands.Queue.Declare) -> None:
        self.busy(self.declarations.queue_declare(method), method)

    def _queue_bind(self, method: commands.Queue.Bind) -> None:
        self.busy(self.declarations.queue_bind(method), method)

    def _queue_unbind(self, method: commands.Queue.Unbind) -> None:
        self.busy(self.declarations.queue_unbind(method), method)

    def _queue_purge(self, method: commands.Queue.Purge) -> None:
        self.busy(self.declarations.queue_purge(method), method)

    def _queue_delete(self, method: commands.Queue.Delete) -> None:
        self.busy(self.declarations.queue_delete(method), method)


_HANDLERS: Final[dict[type[base.Frame], Callable[[Channel, Any], None]]] = {
    commands.Channel.Flow: Channel._flow,
    commands.Channel.FlowOk: Channel._flow_ok,
    commands.Basic.Qos: Channel._qos,
    commands.Basic.Consume: Channel._consume,
    commands.Basic.Cancel: Channel._cancel,
    commands.Basic.CancelOk: Channel._cancel_ok,
    commands.Basic.Get: Channel._get,
    commands.Basic.Ack: Channel._ack,
    commands.Basic.Nack: Channel._nack,
    commands.Basic.Reject: Channel._reject,
    commands.Basic.Recover: Channel._recover,
    commands.Basic.RecoverAsync: Channel._recover,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
    commands.Exchange.Declare: Channel._exchange_declare,
    commands.Exchange.Delete: Channel._exchange_delete,
    commands.Exchange.Bind: Channel._exchange_bind,
    commands.Exchange.Unbind: Channel._exchange_unbind,
    commands.Queue.Declare: Channel._queue_declare,
    commands.Queue.Bind: Channel._queue_bind,
    commands.Queue.Unbind: Channel._queue_unbind,
    commands.Queue.Purge: Channel._queue_purge,
    commands.Queue.Delete: Channel._queue_delete,
}
