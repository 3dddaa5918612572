"""A shard: the unit of ownership and storage.

Queues, streams and channels live in shards (a destination's shard is a hash of its name).
A shard owns their in-memory state and one :class:`~polymq_core.store.contract.Store`, and every
durable change it makes goes through :meth:`Shard.commit`: the one place a change leaves
the shard, for a local fsync or a majority of a replicated log. That path (commits, a
publish's messages enqueued once durable, the batched removals of settled messages) is
:class:`~polymq_core.destinations.shardwrites.DurableWrites`, a mixin of the shard.

A queue's bindings (see :mod:`polymq_core.topics.bindings`) live in the core-wide index of the
broker,
for routing; the shard keeps those of its durable queues in its store, loads them when it
opens and drops them with the queue.

A shard also runs the timers of its destinations: ack timeouts and pull leases (one heap,
lazily cancelled), idle TTL, and eviction of idle destinations from memory so that memory
does not grow with the number of idle queues (a durable one is read back from the store).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from polymq.errors import Conflict, NotFound, Unavailable
from polymq.types import ChannelRole, DeclareOptions, Destination, Message, Overflow

from ..store.contract import Store, StoreError
from ..store.writes import (
    DeleteBindings,
    DeleteDestination,
    ForgetBatches,
    MarkDelivered,
    PurgeMessages,
    SaveBindings,
    SaveDestination,
)
from .batches import BatchWindow, unpack_answer
from .paging import Pressure
from .queue import Queue
from .shardwrites import DurableWrites
from .stream import Stream

if TYPE_CHECKING:
    from ..config import CoreSettings
    from ..metrics import Sensors
    from ..topics.bindings import BindingTable

log = logging.getLogger(__name__)

FORGET_BATCHES_EVERY = 60.0  # seconds between drops of expired batches from the store
# seconds a delivery waits before its mark goes to the log (cluster): one settled by then has none
MARK_AFTER = 0.05

# What holds a destination's messages in a shard: a queue or a stream (a topic holds none,
# a channel is two queues). Not Destination, polymq.types' name of a parsed destination.
Holder = Queue | Stream
_DEFAULTS = DeclareOptions()
# The options of a destination declared with the defaults (or read from the store) while it
# is dormant: equal to _DEFAULTS but not the same object, which only destinations that were
# never declared have (made by a publish or a subscribe): see Shard._remember_dormant.
_DECLARED = DeclareOptions()


def shard_index(key: str, shards: int) -> int:
    """The index of the shard of ``key`` among ``shards`` (a channel's two inboxes share
    their channel's)."""
    return zlib.crc32(key.partition(">")[0].encode()) % shards


def _chain(src: asyncio.Future[None], dst: asyncio.Future[None]) -> None:
    """Resolve ``dst`` as ``src`` did."""
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
        dst.exception()
    else:
        dst.set_result(None)


def channel_inbox(name: str, role: str) -> str:
    """The key of the queue a channel member with ``role`` reads from."""
    return f"channel/{name}>{role}"


class ShardHost(Protocol):
    """What a shard needs of the broker that holds it: the settings, the core-wide index of
    bindings, the memory pressure, the shard of another key, and three calls back (the
    broker's cursor subscriptions and dead-lettering span shards)."""

    settings: CoreSettings
    bindings: BindingTable

    @property
    def pressure(self) -> Pressure:
        """Memory pressure, which shrinks the queues' windows (paging.py)."""

    def shard_for(self, key: str) -> Shard: ...
    def restore_cursors(self, shard: Shard, records: list[tuple[str, str, bytes]]) -> None: ...
    def drop_cursors(self, shard: Shard) -> None: ...
    def dead_letter(
        self, msg: Message, target: str, reason: str, source: str, by: str | None
    ) -> asyncio.Future[None] | None: ...


class Shard(DurableWrites):
    def __init__(
        self,
        host: ShardHost,
        index: int,
        store: Store,
        sensors: Sensors,
        *,
        replicated: bool = False,
    ) -> None:
        self.host = host
        # replicated: the store is a replicated log that this node may or may not lead; a
        # message is then delivered only once its write is committed. A single node leads
        # all of its shards.
        self.replicated = replicated
        self.leading = not replicated
        self.index = index
        self.store = store
        self.sensors = sensors
        self.holders: dict[str, Holder] = {}
        # declared durable destinations not in memory: key -> options (shared when default)
        # Destinations not in memory that must come back as they were: key -> (options,
        # last seq, a queue's counters). Declared ones keep their options (and so go on
        # answering stats, empty or not) and a queue its counters (published, delivered,
        # acked, redelivered); streams keep their last seq so that replay from a sequence
        # number stays meaningful. An idle queue that was never declared leaves no trace
        # (its ids stay unique: they carry a boot id and a counter).
        self.dormant: dict[str, tuple[DeclareOptions, int, tuple[int, ...] | None]] = {}
        self.loop = asyncio.get_event_loop()
        self._timers: list[tuple[float, int, str, int]] = []  # (deadline, delivery_id, key, seq)
        self._did = 0
        self._mid = 0  # message ids: boot id, shard, counter; unique across restarts
        self._boot = format(time.time_ns() // 1_000_000, "x")
        self._id_prefix = f"{self._boot}.{self.index}."  # (+ the counter: half an f-string's cost)
        self._removes: dict[str, list[int]] = {}
        # deliveries to mark in the log (cluster), gathered for MARK_AFTER: key -> {seq: count}
        self._marks: dict[str, dict[int, int]] = {}
        self._marking: asyncio.TimerHandle | None = None
        # resolves when the removals gathered since the last flush are durable (or fails)
        self._removed: asyncio.Future[None] | None = None
        self._retry_removes: asyncio.TimerHandle | None = None
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self.batches = BatchWindow()  # idempotent publishes to this shard's destinations
        self._stored_batches: list[float] = []  # heap: when each batch in the store expires
        self._batches_forgotten = time.monotonic()
        # publishes waiting for a write before they are enqueued, per key, and the last
        # write they wait for (see _enqueue_after)
        self._committing: dict[str, int] = {}
        self._tails: dict[str, asyncio.Future[None]] = {}
        self._reads: set[asyncio.Task[None]] = set()  # queues' page reads (paging.py)

    # ---- life cycle ----------------------------------------------------------------------
    async def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.store.open()
        self.store.on_commit = self.sensors.on_commit
        if self.leading:
            await self._load()
        self._task = self.loop.create_task(self._run_timers(), name=f"shard-{self.index}")

    async def _load(self) -> None:
        """Read the shard's destinations, messages and bindings back from the store. A new
        leader's load finds the delivery counts of the messages the old leader delivered
        and had not seen settled (:meth:`delivered`): those, and only those, come back
        flagged as redeliveries."""
        for rec in await self.store.load_destinations():
            try:
                options = DeclareOptions.from_dict(rec.options) if rec.options else _DEFAULTS
            except Exception:  # an option this version no longer knows: keep the defaults
                log.warning(
                    "shard %d: ignoring unreadable options of %s", self.index, rec.destination
                )
                options = _DECLARED
            paging = self._window(rec.destination, options)
            window = 0 if paging is None else paging[0]
            if window:  # a queue that pages: one window now, the rest counted
                messages = await self.store.load_page(rec.destination, 0, window)
            else:
                messages = await self.store.load_messages(rec.destination)
            # an idle TTL only runs for destinations in memory (the sweep never sees dormant ones)
            if not messages and not rec.metadata and options.idle_ttl is None:
                self._remember_dormant(rec.destination, options, rec.last_seq)
                continue
            holder = self._make(rec.destination, options, rec.last_seq)
            holder.metadata = dict(rec.metadata)
            for m in messages:  # (a message delivered by the old leader has its count)
                holder.put(m)
            if isinstance(holder, Queue):
                holder.published = 0
                if window and len(messages) == window and holder.pages is not None:
                    last = messages[-1].seq
                    count, size = await self.store.measure_messages(rec.destination, last)
                    holder.pages.add_stored(count, size, last)
        bindings = self.host.bindings
        for key, pattern in await self.store.load_bindings():
            try:
                bindings.add(pattern, key)
            except ValueError:
                log.warning("shard %d: ignoring binding %s -> %s", self.index, pattern, key)
        self.host.restore_cursors(self, await self.store.load_cursors())
        for key, expires, blob in await self.store.load_batches(time.time()):
            heapq.heappush(self._stored_batches, expires)
            try:
                self.batches.restore(key, expires, unpack_answer(blob))
            except ValueError as exc:
                log.warning("shard %d: ignoring stored batch %r: %s", self.index, key, exc)

    def delivered(self, queue: Queue, msg: Message) -> None:
        """A persistent message of a durable queue went to a consumer that acks: in a
        cluster, mark it so in the log, so that a new leader knows it was delivered (it
        comes back flagged redelivered, and a message never delivered does not). The marks
        of :data:`MARK_AFTER` seconds go in one write per queue, waited for by nobody, and
        only for the deliveries not settled meanwhile (:meth:`forget`): a consumer that
        acks within that time costs the log no mark, where a mark per delivery was a
        write applied on every node and undone by the ack. A mark not written or not
        committed when the leader died is lost: that delivery comes back unflagged. A
        planned hand-over writes the marks it holds first (:meth:`demote`)."""
        if not self.replicated:
            return
        pending = self._marks.get(queue.key)
        if pending is None:
            pending = self._marks[queue.key] = {}
            if self._marking is None:
                self._marking = self.loop.call_later(MARK_AFTER, self._flush_marks)
        pending[msg.seq] = msg.delivery_count

    def forget(self, key: str, seqs: list[int]) -> asyncio.Future[None]:
        pending = self._marks.get(key)
        if pending:
            for seq in seqs:
                pending.pop(seq, None)
        return super().forget(key, seqs)

    def _flush_marks(self) -> None:
        """Write the pending marks now (their timer's end, a hand-over, a close)."""
        if self._marking is not None:
            self._marking.cancel()  # (a no-op once it fired)
            self._marking = None
        marks, self._marks = self._marks, {}
        if not self.leading:
            return
        for key, pending in marks.items():
            if pending:
                self.commit(MarkDelivered(key, [*pending.items()]))

    # ---- leadership (cluster mode) -----------------------------------------------------------
    async def promote(self) -> None:
        """This node now leads the shard: fence the log (the store's takeover), then load
        the shard as the log has it. Until this returns, requests for it are refused."""
        if self.leading:
            return
        await self.store.promote()
        await self._load()
        self.leading = True
        self.sensors.on_leadership("promoted")
        for holder in self.holders.values():
            holder.pump()
        log.info(
            "shard %d: this node leads it now (%d destinations)", self.index, len(self.holders)
        )

    def demote(self, reason: str, *, writes_go_on: bool = False) -> None:
        """This node no longer leads the shard: writes still pending fail, subscribers are
        moved (their sessions resubscribe through the new leader), memory is dropped.
        ``writes_go_on``: a planned hand-over (``ShardLeadership.hand``): the writes
        already made go on into the log (none is made after), and the caller demotes the
        store once they are there."""
        if not self.leading:
            return
        if writes_go_on:
            self._flush_marks()  # (they go on into the log with the other writes)
        elif self._marking is not None:
            self._marking.cancel()
            self._marking = None
            self._marks.clear()
        self.leading = False
        self.sensors.on_leadership("demoted")
        if not writes_go_on:
            self.store.demote()
        for holder in list(self.holders.values()):
            if isinstance(holder, Queue):
                for w in holder.waiters:
                    if not w.future.done():
                        w.future.set_exception(Unavailable(f"{holder.key}: {reason}"))
                holder.waiters.clear()
                subs = list(holder.consumers)
                holder.consumers.clear()
                # what each consumer holds unacked goes with it (its session claims those
                # messages from the new leader: Queue.claim)
                out = holder.inflight
                held = [
                    {tag: out[seq].message.id for tag, seq in sub.inflight.items() if seq in out}
                    for sub in subs
                ]
                holder.inflight.clear()
                reads_on: list[int | None] = [None] * len(subs)
            else:
                subs = list(holder.cursors)
                # a stream's reader reads on at its cursor (the seq after what it was given)
                reads_on = list(holder.cursors.values())
                holder.cursors.clear()
                held = [{} for _ in subs]
            for sub, its, seq in zip(subs, held, reads_on, strict=True):
                sub.inflight.clear()
                sub.session.moved(sub, reason, its, seq)
        self.host.drop_cursors(self)
        bindings = self.host.bindings
        for key in bindings.bound_queues():
            if self.host.shard_for(key) is self:
                bindings.drop_queue(key)
        self.sensors.on_destinations(-len(self.holders))
        self.holders.clear()
        self.dormant.clear()
        self._timers.clear()
        self._removes.clear()
        if self._retry_removes is not None:
            self._retry_removes.cancel()
            self._retry_removes = None
        self.batches = BatchWindow()
        self._stored_batches.clear()
        log.warning("shard %d: no longer led by this node (%s)", self.index, reason)

    def _window(self, key: str, options: DeclareOptions) -> tuple[int, int] | None:
        """(messages, bytes) a queue keeps in memory, past which it pages (paging.py);
        None: it keeps everything (streams, queues that are not durable or drop their
        head). A replicated core's leader pages too: it reads its pages from the local
        store once the log is applied up to them (ReplicatedStore.load_page)."""
        settings = self.host.settings
        if key.startswith("stream/") or not settings.queue_window_messages:
            return None
        if not options.durable or options.overflow is Overflow.DROP_OLDEST:
            return None
        return settings.queue_window_messages, settings.queue_window_bytes

    def read_page(
        self, key: str, after: int, limit: int, done: Callable[[list[Message] | None], None]
    ) -> None:
        """Read a queue's paged messages back (paging.py): ``done(page)``, with None if
        the read failed (logged)."""

        async def read() -> None:
            try:
                page = await self.store.load_page(key, after, limit)
            except StoreError as exc:
                log.warning("shard %d: reading %s back from the store: %s", self.index, key, exc)
                done(None)
            else:
                done(page)

        task = self.loop.create_task(read(), name=f"page-{key}")
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._reads):
            task.cancel()
        if self._retry_removes is not None:
            self._retry_removes.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._flush_marks()
        self.flush_removes()
        await self.store.close()

    def wake_waiters(self) -> None:
        """Answer every waiting pull now, with nothing (shutdown)."""
        for holder in self.holders.values():
            if isinstance(holder, Queue):
                while holder.waiters:
                    w = holder.waiters.popleft()
                    if not w.future.done():
                        w.future.set_result([])

    # ---- destinations ----------------------------------------------------------------------
    def _make(self, key: str, options: DeclareOptions, last_seq: int = 0) -> Holder:
        holder: Holder
        if key.startswith("stream/"):
            holder = Stream(self, key, options, last_seq=last_seq)
        else:
            window = self._window(key, options)
            pressure = self.host.pressure
            holder = Queue(self, key, options, last_seq=last_seq, window=window, pressure=pressure)
        self.holders[key] = holder
        self.sensors.on_destinations(1)
        return holder

    def get(self, key: str, *, create: bool = True) -> Holder:
        holder = self.holders.get(key)
        if holder is not None:
            return holder
        dormant = self.dormant.pop(key, None)
        if dormant is not None:
            options, last_seq, counters = dormant
            holder = self._make(key, options, last_seq)
            if counters is not None and isinstance(holder, Queue):
                holder.published, holder.delivered, holder.acked, holder.redelivered = counters
            return holder
        if not create:
            raise NotFound(f"{key} does not exist")
        return self._make(key, _DEFAULTS)

    def _remember_dormant(
        self,
        key: str,
        options: DeclareOptions,
        last_seq: int,
        counters: tuple[int, ...] | None = None,
    ) -> None:
        """Remember what an evicted destination needs to come back as it was: a declared
        one (its options are not the _DEFAULTS object) its options and counters."""
        if options is not _DEFAULTS:
            self.dormant[key] = (_DECLARED if options == _DEFAULTS else options, last_seq, counters)
        elif last_seq and key.startswith("stream/"):
            self.dormant[key] = (options, last_seq, None)

    def exists(self, key: str) -> bool:
        """In memory, dormant, or a queue known by its bindings (it takes what they route)."""
        return key in self.holders or key in self.dormant or self.host.bindings.count(key) > 0

    def declare(self, key: str, options: DeclareOptions) -> asyncio.Future[Any] | None:
        holder = self.holders.get(key)
        current = holder.options if holder is not None else self.dormant.get(key, (None,))[0]
        if current is not None and current != options:
            if current != _DEFAULTS:
                raise Conflict(
                    f"{key} exists with other options {current.to_dict()}; delete it first"
                )
        if holder is None:
            holder = self.get(key)
        if isinstance(holder, Queue):
            holder.set_window(self._window(key, options))
        holder.options = options
        holder.durable = options.durable
        if not (options.durable or self.replicated):
            return None
        # (in a cluster a queue that is not durable is declared in the log too, with its
        # bindings, so that a new leader has it; its messages stay in memory)
        stored, metadata = options.to_dict(), holder.metadata
        fut = self.commit(SaveDestination(key, stored, metadata))
        patterns = self.host.bindings.of(key)
        if not patterns:
            return fut
        # bindings made before the queue was declared durable become durable with it
        return asyncio.gather(fut, self.commit(SaveBindings(key, patterns)))

    def delete(self, key: str) -> asyncio.Future[None] | None:
        holder = self.holders.pop(key, None)
        dormant = self.dormant.pop(key, None)
        bound = self.host.bindings.drop_queue(key)
        if holder is None and dormant is None and not bound:
            raise NotFound(f"{key} does not exist")
        if holder is not None:
            holder.close(f"{key} was deleted")
            self.sensors.on_destinations(-1)
        self._removes.pop(key, None)
        return self.commit(DeleteDestination(key))

    def purge(self, key: str) -> int:
        holder = self.get(key, create=False)
        paged = holder.paged if isinstance(holder, Queue) else 0
        dropped = holder.purge()
        if (paged or any(m.persistent or m.stored for m in dropped)) and holder.durable:
            self.commit(PurgeMessages(key))
        return len(dropped) + paged

    def set_metadata(self, key: str, metadata: dict[str, str]) -> asyncio.Future[None]:
        holder = self.get(key)
        holder.metadata = kept = dict(metadata)
        options = holder.options.to_dict()
        return self.commit(SaveDestination(key, options, kept))

    def keeps_bindings(self, key: str) -> bool:
        """Are the bindings of ``key`` stored? A durable queue's are; in a cluster every
        queue's are (a new leader has the queues that are not durable too, empty)."""
        return self.replicated or self.is_durable(key)

    def is_durable(self, key: str) -> bool:
        """Is ``key`` declared durable (in memory or dormant)?"""
        holder = self.holders.get(key)
        if holder is not None:
            return holder.durable
        dormant = self.dormant.get(key)
        return dormant is not None and dormant[0].durable

    # ---- bindings (the index is the broker's; durable ones are stored here) ---------------
    def bind(self, key: str, pattern: str) -> tuple[bool, asyncio.Future[None] | None]:
        """Bind queue ``key`` to ``pattern``: (whether it is new, the future of its write).

        A durable queue's binding is written even when it existed (the write is idempotent),
        so that a repeated bind is answered only once the first is durable too."""
        added = self.host.bindings.add(pattern, key)
        if self.keeps_bindings(key):
            return added, self.commit(SaveBindings(key, [pattern]))
        return added, None

    def unbind(self, key: str, pattern: str) -> tuple[bool, asyncio.Future[None] | None]:
        removed = self.host.bindings.remove(pattern, key)
        if removed and self.keeps_bindings(key):
            return True, self.commit(DeleteBindings(key, [pattern]))
        return removed, None

    # ---- messages ------------------------------------------------------------------------
    def publish(
        self,
        key: str,
        messages: list[Message],
        *,
        routed: bool = False,
        batch: tuple[str, float] | None = None,
        handed: bool = False,
    ) -> asyncio.Future[None] | None:
        """Append messages to a queue or stream; the future resolves when durable.

        ``routed``: the messages came through a binding from the topic in their
        ``destination``, which they keep (a consumer sees where they were published).
        ``batch``: (key, expires) of an idempotent batch (see
        :mod:`polymq_core.destinations.batches`),
        stored with the messages when any of them is.
        ``handed``: a leaving node hands its transient messages to this one (see
        :mod:`polymq_core.forwarding.handover`): they keep their id, time, destination and delivery
        count (one delivered and not acked there comes back flagged redelivered)."""
        holder = self.get(key)
        now = time.time()
        # past a queue's memory window everything is kept in the store only, so transient
        # messages are written too, marked ``stored`` (paging.py); they stay transient
        paged = False
        if isinstance(holder, Queue):
            holder.check_room(len(messages), sum(len(m.body) for m in messages))
            paged = holder.pages_out()
        ttl = holder.options.message_ttl
        durable: list[Message] = []
        # a publish holding persistent messages is enqueued as a whole once written (in a
        # cluster: committed), so that a message whose write failed is never delivered
        # (its transient ones wait with them, so the order stays)
        later = holder.durable and (paged or any(m.persistent for m in messages))
        # an earlier publish still waiting for its write: this one queues behind it
        behind = self._tails.get(key)
        prefix = self._id_prefix
        for m in messages:
            m.seq = holder.next_seq()
            kept = handed and bool(m.id)
            if not kept:
                self._mid += 1
                m.id = prefix + str(self._mid)
                m.timestamp = now
                m.delivery_count = 0
            if not (routed or kept):
                m.destination = key
            if ttl is not None and m.expires is None:
                m.expires = now + ttl
            if paged:
                m.stored = True
                durable.append(m)
            elif m.persistent and holder.durable:
                durable.append(m)
            if not later and behind is None:
                holder.put(m)
        holder.last_used = time.monotonic()
        if not durable:
            if behind is not None:
                self._enqueue_after(holder, messages, behind, written_only=False)
            else:
                holder.pump()
            return None
        fut = self._append(key, messages, durable, batch)
        self._enqueue_after(holder, messages, fut, written_only=True)
        return fut

    def discard(self, queue: Queue, msg: Message, reason: str) -> asyncio.Future[None] | None:
        """A message leaves unacked (expired, rejected, too many deliveries, overflow);
        returns the write that removes it, if there is one. With a dead-letter target, a
        stored message is removed only once its dead letter is durable there (in a
        cluster: committed by the target's leader, on whatever node): should that fail,
        the message stays in the store, and comes back with the next leader or restart (at
        least once, never lost)."""
        self.sensors.on_discard(reason, 1)
        target, by = queue.options.dead_letter, queue.options.dead_letter_by
        sent = self.host.dead_letter(msg, target, reason, queue.key, by) if target else None
        if sent is None or not ((msg.persistent or msg.stored) and queue.durable):
            return self.settled(queue, msg)
        removed: asyncio.Future[None] = self.loop.create_future()

        def then_remove(f: asyncio.Future[None]) -> None:
            if f.cancelled() or f.exception() is not None:
                why = "cancelled" if f.cancelled() else f.exception()
                removed.set_exception(Unavailable(f"{queue.key}: dead-lettering failed: {why}"))
                removed.exception()  # (seen: a nack's answer may not wait for it)
                return
            written = self.settled(queue, msg)
            if written is None:
                removed.set_result(None)
            else:
                written.add_done_callback(lambda w: _chain(w, removed))

        sent.add_done_callback(then_remove)
        return removed

    # ---- timers ------------------------------------------------------------------------
    # ---- what a queue asks of its shard (queue.QueueHost) ---------------------------------
    @property
    def max_frame(self) -> int:
        return self.host.settings.max_frame

    def binding_count(self, key: str) -> int:
        return self.host.bindings.count(key)

    def new_delivery_id(self) -> int:
        self._did += 1
        return self._did

    def schedule(self, deadline: float, holder: Queue, seq: int, delivery_id: int) -> None:
        heapq.heappush(self._timers, (deadline, delivery_id, holder.key, seq))

    async def _run_timers(self) -> None:
        last_sweep = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.time()
            timers = self._timers
            while timers and timers[0][0] <= now:
                _, delivery_id, key, seq = heapq.heappop(timers)
                holder = self.holders.get(key)
                if isinstance(holder, Queue):
                    holder.expire_delivery(seq, delivery_id)
            mono = time.monotonic()
            if mono - last_sweep >= 0.5:
                last_sweep = mono
                self._sweep(mono)
                self._forget_batches(mono, now)

    def _forget_batches(self, mono: float, now: float) -> None:
        """Now and then, drop the batches that have expired from the store."""
        expiries = self._stored_batches
        if not (self.leading and expiries and expiries[0] <= now):
            return
        if mono - self._batches_forgotten < FORGET_BATCHES_EVERY:
            return
        self._batches_forgotten = mono
        while expiries and expiries[0] <= now:
            heapq.heappop(expiries)
        self.commit(ForgetBatches(now))

    def _sweep(self, mono: float) -> None:
        """Idle TTL expiry, and eviction of idle destinations from memory."""
        for key, holder in list(self.holders.items()):
            ttl = holder.options.idle_ttl
            if isinstance(holder, Queue):
                unused = not holder.consumers and not holder.waiters
            else:
                unused = not holder.cursors
            if ttl is not None:
                if unused and mono - holder.last_used >= ttl:
                    log.info("shard %d: %s idle for %.0fs, deleting", self.index, key, ttl)
                    self.delete(key)
                continue
            if not holder.idle or key in self._committing:
                continue  # (publishes waiting for their commit are enqueued into this holder)
            if holder.options != _DEFAULTS and not holder.options.durable:
                continue  # non-durable options live only in this object: keep it
            counters = None
            if (
                isinstance(holder, Queue)
                and holder.published | holder.delivered | holder.redelivered
            ):
                counters = (holder.published, holder.delivered, holder.acked, holder.redelivered)
            self._remember_dormant(key, holder.options, holder.last_seq, counters)
            del self.holders[key]
            self.sensors.on_destinations(-1)

    # ---- introspection -----------------------------------------------------------------
    def stats(self, key: str) -> dict[str, Any]:
        holder = self.holders.get(key)
        if holder is None:
            if not self.exists(key):
                raise NotFound(f"{key} does not exist")
            holder = self.get(key)
        return holder.stats()

    def describe(self) -> dict[str, Any]:
        return {
            "shard": self.index,
            "leading": self.leading,
            "in_memory": len(self.holders),
            "dormant": len(self.dormant),
            "messages": sum(
                b.count if isinstance(b, Queue) else len(b.entries) for b in self.holders.values()
            ),
        }

    @staticmethod
    def key_of(dest: Destination, role: str | None = None) -> str:
        if dest.kind.value == "channel":
            if role is None or not ChannelRole.named(role):
                raise NotFound("a channel needs role 'server' or 'client'")
            return channel_inbox(dest.name, role)
        return str(dest)
