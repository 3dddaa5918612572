"""SEND, control destinations and transactions (BEGIN, COMMIT, ABORT) of one session.

A SEND is handled without awaiting: its message joins the batch of its destination, and the
session publishes the batches once the frames of one read are handled (one core request per
destination, many messages each; the client puts every request of a loop iteration in one
frame). Its RECEIPT goes out when the core answered: for a persistent message on a durable
destination, after fsync. A refusal from the core is an ERROR. SENDs awaiting the core are
counted: past ``stomp_max_inflight`` (or 16 MiB of bodies) the session stops reading.

A SEND with a ``transaction`` header is kept until COMMIT, and so is its RECEIPT, as
RabbitMQ does: it goes out when the COMMIT is done, just before the COMMIT's own (and never
after an ABORT, which forgets them). ACK and NACK frames with one are kept until COMMIT
too, but their RECEIPTs come at once, as RabbitMQ sends them. COMMIT publishes the messages (one
batch per destination, in order) and applies the acknowledgements, then answers. A
transaction is not atomic across destinations: when the core refuses one batch (a full
queue, say), the others may be published; the ERROR says which.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

from polymq.answers import DestinationStats, Published, QueueStats, StreamStats, TopicStats
from polymq.errors import NotFound, PolymqError, Unavailable
from polymq.types import Message, Outcome
from polymq_server.auth.provider import Permission
from polymq_server.names import reply_target

from .destinations import Control, ControlOp, ExchangeRef, Target
from .exchange import routes_later, routes_now
from .frames import Command, Frame
from .messages import message_from_send
from .parts import PartSession
from .refusal import Refused

if TYPE_CHECKING:
    from .delivery import StompSubscription
    from .subscription import Subscriptions

__all__ = ["PublisherSession", "StompPublisher"]


class PublisherSession(PartSession, Protocol):
    """The session as its publisher sees it: a part's view (``parts.py``), its
    subscriptions (a reply-to's), the busy task a SEND may need, reading's pauses, and
    the refusal of a frame. A protocol, so that this module need not import ``session.py``,
    which imports it."""

    @property
    def closing(self) -> bool: ...
    @property
    def subscriptions(self) -> Subscriptions: ...

    def start_busy(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None: ...
    def update_reading(self) -> None: ...
    def refuse(self, exc: BaseException, frame: Frame | None = None) -> None: ...


_BATCH_BYTES: Final = 4 * 1024 * 1024  # a destination's SENDs go to the core past this
_MAX_INFLIGHT_BYTES: Final = 16 * 1024 * 1024  # bytes of SENDs awaiting the core, then pause


class _Batch:
    __slots__ = ("messages", "nbytes", "receipts")

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.receipts: list[str | None] = []
        self.nbytes = 0


class _Tx:
    __slots__ = ("acks", "frames", "nbytes", "receipts", "sends")

    def __init__(self) -> None:
        self.receipts: list[str] = []  # of its SEND frames, sent at COMMIT
        self.sends: list[tuple[str, Message]] = []
        self.acks: list[tuple[StompSubscription, int, Outcome]] = []
        self.frames = 0
        self.nbytes = 0


class StompPublisher:
    def __init__(self, session: PublisherSession) -> None:
        self.session = session
        self.batches: dict[str, _Batch] = {}
        self.inflight = 0
        self.inflight_bytes = 0
        self.transactions: dict[str, _Tx] = {}
        self._drained: asyncio.Future[None] | None = None

    @property
    def full(self) -> bool:
        """Too many SENDs await the core: stop reading."""
        return (
            self.inflight >= self.session.settings.stomp_max_inflight
            or self.inflight_bytes > _MAX_INFLIGHT_BYTES
        )

    def close(self) -> None:
        self.batches.clear()
        self.transactions.clear()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # ---- SEND --------------------------------------------------------------------------------
    def send(self, frame: Frame) -> None:
        session = self.session
        if "message-id" in frame:  # (before the destination, as RabbitMQ checks it)
            raise Refused("header", "Invalid header", "'message-id' is not allowed on 'SEND'.\n")
        target = session.targets.lookup(frame.get("destination"))
        if isinstance(target, Control):
            session.start_busy(self._control(frame, target), frame)
            return
        if isinstance(target, ExchangeRef):  # its type first (then remembered)
            session.start_busy(self._send_to_exchange(frame, target), frame)
            return
        self._send_to(frame, target)

    async def _send_to_exchange(self, frame: Frame, ref: ExchangeRef) -> None:
        self._send_to(frame, await self.session.targets.exchange_target(ref, subscribe=False))
        self.flush()

    def _send_to(self, frame: Frame, target: Target) -> None:
        session = self.session
        session.authorize(Permission.WRITE, target.core)
        message, temp_reply = message_from_send(frame, session.conn_id, session.vhost_prefix)
        reply = reply_target(message.reply_to) if temp_reply is None else None
        if reply is not None:  # a responder writes there: so must the sender be able to
            session.authorize(Permission.WRITE, reply)
        tx_name = frame.get("transaction")
        tx = self._tx(tx_name) if tx_name is not None else None
        cores: list[str] | None = [target.core]
        if target.routing_key is not None:  # an exchange's: routed as AMQP routes
            cores = routes_now(session, target, message)
        if (
            cores is None
            or (
                temp_reply is not None
                and not session.subscriptions.on(_core_of(session, temp_reply))
            )
            or (target.temp and not session.targets.owns(target.core))
        ):
            session.start_busy(
                self._send_after_setup(frame, target, message, temp_reply, tx), frame
            )
            return
        self._accept(frame, cores, message, tx)

    def _accept(self, frame: Frame, cores: list[str], message: Message, tx: _Tx | None) -> None:
        receipt = frame.get("receipt")
        if tx is not None:
            self._tx_add(tx, len(message.body))
            tx.sends += [(core, message) for core in cores]
            if receipt is not None:
                tx.receipts.append(receipt)
            return
        if len(cores) != 1:  # an exchange's: no queue (a receipt at once), or several
            self._publish_many(cores, message, receipt)
            return
        core = cores[0]
        batch = self.batches.get(core)
        if batch is None:
            batch = self.batches[core] = _Batch()
        batch.messages.append(message)
        batch.receipts.append(receipt)
        size = len(message.body)
        batch.nbytes += size
        self.inflight += 1
        self.inflight_bytes += size
        if batch.nbytes >= _BATCH_BYTES:
            self._publish(core, self.batches.pop(core))

    def _publish_many(self, cores: list[str], message: Message, receipt: str | None) -> None:
        """One message to several core destinations (or none), answered once all are."""
        session = self.session
        if not cores:
            if receipt is not None:
                session.receipt(receipt)
            return
        self.flush()  # what was read before goes first
        batch = _Batch()
        batch.messages.append(message)
        batch.receipts.append(receipt)
        batch.nbytes = len(message.body)
        self.inflight += 1
        self.inflight_bytes += batch.nbytes
        try:
            client = session.client()
        except PolymqError as exc:
            self._answered(batch)
            session.refuse(exc, _send_frame(batch))
            return
        answers = asyncio.gather(
            *(client.publish_soon(core, [message]) for core in cores), return_exceptions=True
        )
        answers.add_done_callback(partial(self._published_many, batch))

    async def _send_after_setup(
        self,
        frame: Frame,
        target: Target,
        message: Message,
        temp_reply: str | None,
        tx: _Tx | None,
    ) -> None:
        """The first SEND to one's own temp queue declares it; the first with a
        ``reply-to: /temp-queue/x`` subscribes to that temp queue (see subscription.py); a
        SEND to an exchange whose records are not cached reads them."""
        if target.temp:
            await self.session.targets.ensure_temp(target)
        if temp_reply is not None:
            await self.session.subscriptions.reply_subscription(temp_reply)
        cores = [target.core]
        if target.routing_key is not None:
            cores = await routes_later(self.session, target, message)
        self._accept(frame, cores, message, tx)
        self.flush()

    def flush(self) -> None:
        """Publish the batches of the SENDs read so far."""
        if self.batches:
            batches, self.batches = self.batches, {}
            for core, batch in batches.items():
                self._publish(core, batch)

    def _publish(self, core: str, batch: _Batch) -> None:
        try:
            fut = self.session.client().publish_soon(core, batch.messages)
        except PolymqError as exc:
            self._answered(batch)
            self.session.refuse(exc, _send_frame(batch))
            return
        fut.add_done_callback(partial(self._published, batch))

    def _answered(self, batch: _Batch) -> None:
        self.inflight -= len(batch.messages)
        self.inflight_bytes -= batch.nbytes
        if self.inflight <= 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _published(self, batch: _Batch, fut: asyncio.Future[Published]) -> None:
        if self.session.closing:
            self._answered(batch)
            if not fut.cancelled():
                fut.exception()  # retrieved: the client has gone, nobody to tell
            return
        exc = fut.exception() if not fut.cancelled() else Unavailable("publish cancelled")
        self._done(batch, exc)

    def _published_many(self, batch: _Batch, fut: asyncio.Future[list[Any]]) -> None:
        if fut.cancelled():
            exc: BaseException | None = Unavailable("publish cancelled")
        else:
            exc = next((r for r in fut.result() if isinstance(r, BaseException)), None)
        if self.session.closing:
            self._answered(batch)
            return
        self._done(batch, exc)

    def _done(self, batch: _Batch, exc: BaseException | None) -> None:
        self._answered(batch)
        session = self.session
        if exc is not None:
            session.refuse(exc, _send_frame(batch))
            return
        for receipt in batch.receipts:
            if receipt is not None:
                session.receipt(receipt)
        session.update_reading()

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until every SEND read so far has its answer."""
        if self.inflight <= 0:
            return
        self._drained = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drained), timeout)

    # ---- control destinations (ocamlmq) -----------------------------------------------------
    async def _control(self, frame: Frame, ctl: Control) -> None:
        """``/control/count-msgs/...`` and ``/control/count-subscribers/...``: the count goes
        in the RECEIPT (``num-messages`` / ``num-subscribers``); without a receipt header
        there is nothing to answer."""
        session = self.session
        session.authorize(Permission.READ, ctl.core)
        client = session.client()
        stats: DestinationStats | None
        try:
            stats = await session.hub.link.guard(client, client.stats(ctl.core))
        except NotFound:
            stats = None  # counted as none
        receipt = frame.get("receipt")
        if receipt is None:
            return
        if ctl.op is ControlOp.COUNT_MESSAGES:
            held = stats.messages if isinstance(stats, QueueStats | StreamStats) else 0
            session.receipt(receipt, ("num-messages", str(held)))
        else:
            count = (
                stats.subscribers if isinstance(stats, QueueStats | StreamStats | TopicStats) else 0
            )
            session.receipt(receipt, ("num-subscribers", str(count)))

    # ---- transactions ---------------------------------------------------------------------
    def _tx(self, name: str) -> _Tx:
        tx = self.transactions.get(name)
        if tx is None:
            raise Refused(
                "transaction",
                "Bad transaction",
                f'Invalid transaction identifier: "{name[:100]}"\n',
            )
        return tx

    def _tx_add(self, tx: _Tx, nbytes: int) -> None:
        s = self.session.settings
        tx.frames += 1
        tx.nbytes += nbytes
        if tx.frames > s.stomp_max_tx_frames or tx.nbytes > s.stomp_max_tx_bytes:
            raise Refused(
                "transaction",
                "Transaction too large",
                f"a transaction may hold {s.stomp_max_tx_frames} frames and "
                f"{s.stomp_max_tx_bytes} bytes of bodies",
            )

    def add_ack(self, name: str, sub: StompSubscription, tag: int, outcome: Outcome) -> None:
        tx = self._tx(name)
        self._tx_add(tx, 0)
        tx.acks.append((sub, tag, outcome))

    def _name(self, frame: Frame) -> str:
        name = frame.get("transaction")
        if name is None:
            raise Refused(
                "transaction",
                "Missing transaction",
                f"\"{frame.command.value}\" must include a 'transaction' header\n",
            )
        return name

    def begin(self, frame: Frame) -> None:
        name = self._name(frame)
        if name in self.transactions:
            raise Refused(
                "transaction",
                "Bad transaction",
                f"transaction {name[:100]!r} is already in progress",
            )
        self.transactions[name] = _Tx()
        receipt = frame.get("receipt")
        if receipt is not None:
            self.session.receipt(receipt)

    def abort(self, frame: Frame) -> None:
        name = self._name(frame)
        self._tx(name)
        del self.transactions[name]
        receipt = frame.get("receipt")
        if receipt is not None:
            self.session.receipt(receipt)

    def commit(self, frame: Frame) -> None:
        name = self._name(frame)
        tx = self._tx(name)
        del self.transactions[name]
        self.session.start_busy(self._commit(frame, tx), frame)

    async def _commit(self, frame: Frame, tx: _Tx) -> None:
        session = self.session
        groups: dict[str, list[Message]] = {}
        for core, message in tx.sends:
            groups.setdefault(core, []).append(message)
        client = session.client()
        link = session.hub.link
        futures = {core: client.publish_soon(core, messages) for core, messages in groups.items()}
        subs = session.subscriptions
        for sub, tag, outcome in tx.acks:
            if sub.owes(tag):  # (an ACK outside the transaction may have covered it since)
                subs.settle(sub, tag, outcome)
        results = await link.guard(
            client, asyncio.gather(*futures.values(), return_exceptions=True)
        )
        failed = [
            (c, r) for c, r in zip(futures, results, strict=True) if isinstance(r, BaseException)
        ]
        if failed:
            core, exc = failed[0]
            published = [
                c for c, r in zip(futures, results, strict=True) if not isinstance(r, BaseException)
            ]
            detail = f"COMMIT: the messages for {core} were refused: {exc}"
            if published:
                detail += f"; those for {', '.join(published)} were published"
            raise Refused("core", "Transaction failed", detail)
        if tx.acks:
            await link.guard(client, client.ping())  # the core has the acks
        for done in tx.receipts:
            session.receipt(done)
        receipt = frame.get("receipt")
        if receipt is not None:
            session.receipt(receipt)


def _core_of(session: PublisherSession, stomp_destination: str) -> str:
    return session.subscriptions.reply_target(stomp_destination).core


def _send_frame(batch: _Batch) -> Frame:
    """A stand-in SEND for an ERROR about a batch: it carries the first receipt."""
    first = next((r for r in batch.receipts if r is not None), None)
    return Frame(Command.SEND, (("receipt", first),) if first is not None else ())
