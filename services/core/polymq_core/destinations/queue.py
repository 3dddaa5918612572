"""A queue: point to point, competing consumers, FIFO within a priority, priorities 0-9.

A queue declared with ``max_priority`` orders by the levels 0..max_priority only: a message
above it counts as that level (and keeps its priority); ``max_priority=0`` is a strictly FIFO
queue (AMQP's queues without ``x-max-priority``).

Ready messages sit in one deque per level, in sequence order; a message that comes back
(nack, ack timeout, a consumer gone) goes into a per-priority heap by sequence, so it is
delivered again before anything published after it. Unacked deliveries are held in
``inflight`` by sequence, each with its own delivery id so that a late ack of a delivery that
already timed out is told apart from the ack of its redelivery.

Consumers are served round robin among those with credit (prefetch window open, socket
draining); pull waiters (the HTTP frontend's long polls) are served first. Once a consumer
with a subscription ``priority`` is attached, the consumers are kept in order of priority
and served round robin among those of the highest priority with credit: a lower one gets
what the higher ones have no room for (AMQP's consumer priorities). A queue never waits
on a slow consumer: the session applies the slow-consumer policy instead.

Durable state changes (enqueue of a persistent message, its removal) go to the owning shard,
the one place that writes the store and will later replicate. A durable queue (on one
node, or on a replicated core's leader) keeps a bounded window of ready messages in memory
and the rest in the store only (:mod:`polymq_core.destinations.paging`).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from polymq.errors import Conflict, NotFound, QueueFull
from polymq.types import MAX_PRIORITY, DeclareOptions, Message, Outcome, Overflow

from ..store.writes import AppendMany
from .paging import Pages, Pressure
from .subscription import Subscription, kind_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..metrics import Sensors
    from ..store.writes import Write

_LEVELS = MAX_PRIORITY + 1


class QueueHost(Protocol):
    """What a queue needs of the shard that holds it (a protocol, so that this module need
    not import ``shard.py``, which imports it): its durable writes, the end of a message
    (acked, or discarded to the dead letters), delivery ids and ack-timeout timers, paging
    reads, and two figures of the core (bindings to it, the frame size)."""

    sensors: Sensors

    @property
    def max_frame(self) -> int: ...

    def commit(self, write: Write) -> asyncio.Future[None]: ...
    def settled(self, queue: Queue, msg: Message) -> asyncio.Future[None] | None: ...
    def settled_many(self, queue: Queue, msgs: list[Message]) -> None: ...
    def discard(self, queue: Queue, msg: Message, reason: str) -> asyncio.Future[None] | None: ...
    def unforget(self, key: str, seq: int) -> bool: ...
    def new_delivery_id(self) -> int: ...
    def delivered(self, queue: Queue, msg: Message) -> None: ...
    def schedule(self, deadline: float, holder: Queue, seq: int, delivery_id: int) -> None: ...
    def read_page(
        self, key: str, after: int, limit: int, done: Callable[[list[Message] | None], None]
    ) -> None: ...
    def binding_count(self, key: str) -> int: ...


class Delivery:
    """One outstanding delivery of a message: to a subscription, or a pull lease."""

    __slots__ = ("deadline", "delivery_id", "message", "sub")

    def __init__(
        self, message: Message, sub: Subscription | None, delivery_id: int, deadline: float | None
    ) -> None:
        self.message = message
        self.sub = sub
        self.delivery_id = delivery_id
        self.deadline = deadline


class Waiter:
    __slots__ = ("future", "max", "visibility")

    def __init__(self, future: asyncio.Future[list[tuple[str, Message]]], max_: int, vis: float):
        self.future = future
        self.max = max_
        self.visibility = vis


class Queue:
    __slots__ = (
        "_next_consumer",
        "_prioritized",
        "_seq",
        "_top_priority",
        "acked",
        "consumers",
        "count",
        "delivered",
        "durable",
        "inflight",
        "key",
        "last_used",
        "metadata",
        "nbytes",
        "options",
        "pages",
        "pressure",
        "published",
        "ready",
        "redelivered",
        "requeued",
        "shard",
        "waiters",
    )

    def __init__(
        self,
        shard: QueueHost,
        key: str,
        options: DeclareOptions,
        *,
        last_seq: int = 0,
        window: tuple[int, int] | None = None,
        pressure: Pressure | None = None,
    ) -> None:
        """``window``: (messages, bytes) of ready messages kept in memory, past which
        the queue pages (paging.py), squeezed while ``pressure`` is on; None: it keeps
        them all."""
        self.shard = shard
        self.key = key
        self.options = options
        self.durable: bool = options.durable
        self.metadata: dict[str, str] = {}
        self.ready: list[deque[Message]] = [deque() for _ in range(_LEVELS)]
        self.requeued: list[list[tuple[int, Message]]] = [[] for _ in range(_LEVELS)]
        self.count = 0  # ready messages
        self.nbytes = 0  # ready bytes
        self.inflight: dict[int, Delivery] = {}
        self.consumers: list[Subscription] = []
        self.waiters: deque[Waiter] = deque()
        self._next_consumer = 0
        self._prioritized = False  # consumers in order of priority: see pump()
        self._top_priority = 0  # highest priority level that may hold a ready message
        self._seq = last_seq
        self.last_used = time.monotonic()
        self.published = self.delivered = self.acked = self.redelivered = 0
        # what stays in the store only (paging.py), or None: everything in memory
        self.pressure = pressure
        self.pages = None if window is None else Pages(*window, pressure)

    # ---- state ---------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """Nothing in memory worth keeping: may be evicted (it is reloaded on demand)."""
        return not (
            self.count
            or self.inflight
            or self.consumers
            or self.waiters
            or self.metadata
            or self.paged
        )

    @property
    def kind(self) -> str:
        """The kind its subscribers name: "queue", or "channel" for a channel's inbox."""
        return kind_text(self.key)

    @property
    def paged(self) -> int:
        """Ready messages in the store only."""
        return 0 if self.pages is None else self.pages.count

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def last_seq(self) -> int:
        return self._seq

    def stats(self) -> dict[str, Any]:
        return {
            "destination": self.key,
            "messages": self.count + self.paged,
            "bytes": self.nbytes + (0 if self.pages is None else self.pages.nbytes),
            "paged": self.paged,
            "in_flight": len(self.inflight),
            "subscribers": len(self.consumers),
            "published": self.published,
            "delivered": self.delivered,
            "acked": self.acked,
            "redelivered": self.redelivered,
            "bindings": self.shard.binding_count(self.key),
            "options": self.options.to_dict(),
        }

    # ---- enqueue -------------------------------------------------------------------------
    def check_room(self, n: int, nbytes: int) -> None:
        """Raise QueueFull if ``n`` more messages would pass a bound under ``reject``."""
        opts = self.options
        if opts.overflow is not Overflow.REJECT:
            return
        pages = self.pages
        count, size = self.count, self.nbytes
        if pages is not None:
            count, size = count + pages.count, size + pages.nbytes
        if opts.max_length is not None and count + n > opts.max_length:
            raise QueueFull(f"{self.key} is full ({opts.max_length} messages)")
        if opts.max_bytes is not None and size + nbytes > opts.max_bytes:
            raise QueueFull(f"{self.key} is full ({opts.max_bytes} bytes)")

    def set_window(self, window: tuple[int, int] | None) -> None:
        """Declared with other options: page within ``window`` from now on (None: keep
        everything in memory; refused while messages are paged, which only the store
        holds: a queue that is not durable would lose them)."""
        if window is None:
            if self.pages is not None and self.pages.count:
                raise Conflict(
                    f"{self.key} holds {self.pages.count} messages kept in the store only "
                    "(paged): declare it durable and without drop-head, or purge it first"
                )
            self.pages = None
        elif self.pages is None:
            self.pages = Pages(*window, self.pressure)

    def pages_out(self) -> bool:
        """Would a message that comes now stay in the store only? (The shard then writes
        a transient one too.)"""
        return self.pages is not None and self.pages.full(self.count, self.nbytes)

    def put(self, message: Message) -> None:
        """Add a message that already has its seq (new, or recovered from the store);
        past the window, a stored one is only counted (paging.py)."""
        pages = self.pages
        if (
            pages is not None
            and (message.persistent or message.stored)
            and pages.full(self.count, self.nbytes)
        ):
            pages.add(message)
            self.published += 1
            return
        self._ready(message)
        self.published += 1
        opts = self.options
        if opts.overflow is Overflow.DROP_OLDEST:
            while (opts.max_length is not None and self.count > opts.max_length) or (
                opts.max_bytes is not None and self.nbytes > opts.max_bytes and self.count > 1
            ):
                self._drop_oldest()

    def _level(self, message: Message) -> int:
        """The priority level a message sits at: its priority, capped by max_priority."""
        p = message.priority
        cap = self.options.max_priority
        return p if cap is None or p <= cap else cap

    def _ready(self, message: Message) -> None:
        """Append to the ready messages of its level."""
        p = self._level(message)
        self.ready[p].append(message)
        if p > self._top_priority:
            self._top_priority = p
        self.count += 1
        self.nbytes += len(message.body)

    def _drop_oldest(self) -> None:
        best: tuple[int, int, bool] | None = None  # (seq, level, from_heap)
        for level in range(_LEVELS):
            if self.requeued[level]:
                seq = self.requeued[level][0][0]
                if best is None or seq < best[0]:
                    best = (seq, level, True)
            if self.ready[level]:
                seq = self.ready[level][0].seq
                if best is None or seq < best[0]:
                    best = (seq, level, False)
        if best is None:
            return
        _, level, heap = best
        msg = heapq.heappop(self.requeued[level])[1] if heap else self.ready[level].popleft()
        self._took(msg)
        self.shard.discard(self, msg, "max-length")

    def _took(self, msg: Message) -> None:
        self.count -= 1
        self.nbytes -= len(msg.body)

    def _pop(self, now: float) -> Message | None:
        """The next ready message by priority then sequence; expired ones are discarded."""
        ready = self.ready
        requeued = self.requeued
        while self.count:
            level = self._top_priority  # no message sits above it
            while True:
                heap = requeued[level]
                dq = ready[level]
                if heap:
                    msg = (
                        heapq.heappop(heap)[1] if not dq or heap[0][0] < dq[0].seq else dq.popleft()
                    )
                    break
                if dq:
                    msg = dq.popleft()
                    break
                level -= 1  # count > 0 means some level at or below holds one
            self._top_priority = level
            self.count -= 1
            self.nbytes -= len(msg.body)
            if msg.expires is not None and msg.expires <= now:
                self.shard.discard(self, msg, "expired")
                continue
            return msg
        return None

    def _unpop(self, msg: Message) -> None:
        """Put back a message just popped, at the head of its level."""
        p = self._level(msg)
        heapq.heappush(self.requeued[p], (msg.seq, msg))
        if p > self._top_priority:
            self._top_priority = p
        self.count += 1
        self.nbytes += len(msg.body)

    def requeue(self, msg: Message) -> None:
        self._unpop(msg)  # back in sequence order: before anything published after it
        self.redelivered += 1

    # ---- consumers ------------------------------------------------------------------------
    def attach(self, sub: Subscription) -> None:
        priority = sub.options.priority
        if priority or self._prioritized:
            self._prioritized = True
            consumers = self.consumers
            i = len(consumers)  # after those of the same or a higher priority
            while i and consumers[i - 1].options.priority < priority:
                i -= 1
            consumers.insert(i, sub)
        else:
            self.consumers.append(sub)
        self.last_used = time.monotonic()
        self.pump()

    def detach(self, sub: Subscription, *, requeue: list[Message]) -> None:
        """Remove a consumer; its unacked deliveries (and unsent ones) come back in order."""
        if sub in self.consumers:
            self.consumers.remove(sub)
            if self._prioritized and not any(c.options.priority for c in self.consumers):
                self._prioritized = False  # all of one priority again: plain round robin
        self.last_used = time.monotonic()
        back = [
            self.inflight.pop(seq).message for seq in sub.inflight.values() if seq in self.inflight
        ]
        sub.inflight.clear()
        back.extend(requeue)
        for msg in back:
            self._return(msg, "disconnect")
        if back:
            self.pump()

    def _return(self, msg: Message, reason: str, *, forgotten: bool = False) -> None:
        """A delivery came back unacked: requeue, or dead-letter past max deliveries.

        A requeued message is written to the store again when it had been forgotten there
        (``forgotten``: an auto-ack delivery taken back), and, under ``max_deliveries``,
        when it is persistent in a durable queue: with its delivery count, so that a
        restart or a new leader goes on counting (a consumer that dies of a poison message
        is what the limit is for); a delivery under way when the core stops is counted from
        the last return."""
        limit = self.options.max_deliveries
        if limit is not None and msg.delivery_count >= limit:
            self.shard.discard(self, msg, "max-deliveries")
            return
        if forgotten or (limit is not None and (msg.persistent or msg.stored) and self.durable):
            self.shard.commit(AppendMany(self.key, [msg]))
        self.requeue(msg)
        self.shard.sensors.on_redeliver(reason, 1)

    def pump(self) -> None:
        """Deliver ready messages to waiters and consumers with credit; then read the next
        page back if the window has room for one (asked once per pump, not per message:
        the read starts on a later turn of the loop either way)."""
        self._pump()
        self._page_in()

    def _pump(self) -> None:
        if not self.count:
            return
        now = time.time()
        while self.waiters and self.count:
            w = self.waiters.popleft()
            if w.future.done():
                continue
            w.future.set_result(self.lease(w.max, w.visibility, now))
        consumers = self.consumers
        if not consumers:
            return
        if self._prioritized:
            delivered = self._pump_by_priority(now)
            if delivered:
                self.delivered += delivered
                self.shard.sensors.on_deliver(delivered)
            return
        n = len(consumers)
        if n == 1 and consumers[0].session.writable and self.count:
            sub = consumers[0]
            self._next_consumer = 1  # where the round robin below leaves it after this one
            if sub.auto and not sub.closed:
                delivered = self._pump_to_one(sub, now)
            elif not (sub.options.ack_timeout or self.options.ack_timeout):
                delivered = self._pump_window(sub, now)
            else:
                delivered = -1
            if delivered >= 0:
                if delivered:
                    self.delivered += delivered
                    self.shard.sensors.on_deliver(delivered)
                return
        idle = 0
        rr = self._next_consumer
        delivered = 0
        pop = self._pop
        deliver = self._deliver
        while self.count and idle < n:
            if rr >= n:
                rr = 0
            sub = consumers[rr]
            rr += 1
            if not sub.has_credit():
                idle += 1
                continue
            msg = pop(now)
            if msg is None:
                break
            deliver(sub, msg, now)
            delivered += 1
            idle = 0
            n = len(consumers)  # a delivery may cut a slow consumer off: it left the list
        self._next_consumer = rr
        if delivered:
            self.delivered += delivered
            self.shard.sensors.on_deliver(delivered)

    def _pump_to_one(self, sub: Subscription, now: float) -> int:
        """Every ready message to ``sub``, the one consumer, which takes them all now (auto
        mode, open, its session writing: not holding each delivery to the subscription's
        buffer against a slow socket): handed over in one call (``Subscription.send_all``),
        settled first, as :meth:`_deliver` does each."""
        pop = self._pop
        msgs: list[Message] = []
        nbytes = 0
        while self.count:
            msg = pop(now)
            if msg is None:
                break
            msg.delivery_count += 1
            msgs.append(msg)
            nbytes += len(msg.body)
        if msgs:
            self.shard.settled_many(self, msgs)  # settled first, as _deliver does
            sub.send_all(msgs, nbytes)
        return len(msgs)

    def _pump_window(self, sub: Subscription, now: float) -> int:
        """As many ready messages as ``sub``, the one consumer, has room for (it acks; no
        ack timeout applies but a message's own), each checked out to it as
        :meth:`_deliver` does, then handed over in one call
        (``Subscription.deliver_window``). A message with an ack timeout of its own goes
        alone, in its turn."""
        room = sub.room()
        pop = self._pop
        shard = self.shard
        inflight = self.inflight
        marked = self.durable
        msgs: list[Message] = []
        nbytes = 0
        taken = 0
        while self.count and taken != room:
            msg = pop(now)
            if msg is None:
                break
            taken += 1
            if msg.ack_timeout:  # its own deadline: delivered alone, after those before it
                if msgs:
                    sub.deliver_window(msgs, nbytes)
                    msgs, nbytes = [], 0
                self._deliver(sub, msg, now)
                continue
            msg.delivery_count += 1
            if marked and (msg.persistent or msg.stored):
                shard.delivered(self, msg)
            inflight[msg.seq] = Delivery(msg, sub, shard.new_delivery_id(), None)
            msgs.append(msg)
            nbytes += len(msg.body)
        if msgs:
            sub.deliver_window(msgs, nbytes)
        return taken

    def _pump_by_priority(self, now: float) -> int:
        """Each message to a consumer with credit of the highest priority that has one,
        round robin among those of that priority."""
        consumers = self.consumers
        delivered = 0
        while self.count:
            sub = None
            n = len(consumers)
            i = 0
            while i < n and sub is None:
                priority = consumers[i].options.priority
                j = i + 1
                while j < n and consumers[j].options.priority == priority:
                    j += 1
                size = j - i
                for k in range(size):
                    candidate = consumers[i + (self._next_consumer + k) % size]
                    if candidate.has_credit():
                        sub = candidate
                        break
                i = j
            if sub is None:
                break
            msg = self._pop(now)
            if msg is None:
                break
            self._next_consumer += 1
            self._deliver(sub, msg, now)
            delivered += 1
        return delivered

    def _deliver(self, sub: Subscription, msg: Message, now: float) -> None:
        msg.delivery_count += 1
        if sub.auto:
            # settled first: if this delivery cuts a slow consumer off, unsent() takes it back
            self.shard.settled(self, msg)
            sub.deliver(msg, msg.seq)
            return
        seq = msg.seq
        timeout = msg.ack_timeout or sub.options.ack_timeout or self.options.ack_timeout
        shard = self.shard
        if (msg.persistent or msg.stored) and self.durable:
            shard.delivered(self, msg)
        delivery_id = shard.new_delivery_id()
        if timeout:
            deadline = now + timeout
            self.inflight[seq] = Delivery(msg, sub, delivery_id, deadline)
            sub.deliver(msg, seq)
            shard.schedule(deadline, self, seq, delivery_id)
        else:
            self.inflight[seq] = Delivery(msg, sub, delivery_id, None)
            sub.deliver(msg, seq)

    def claim(self, sub: Subscription, claims: dict[str, int]) -> list[int]:
        """A subscription moved here from another leader holds deliveries it has not
        settled (``claims``: message id -> its delivery tag): those of them ready here are
        checked out to it again under the same tags, not delivered a second time (as a
        quorum queue's consumer keeps its checked-out messages). Returns the tags taken."""
        if sub.auto or not claims:
            return []
        found: list[Message] = []
        for level in range(_LEVELS):
            dq = self.ready[level]
            if any(m.id in claims for m in dq):
                found.extend(m for m in dq if m.id in claims)
                self.ready[level] = deque(m for m in dq if m.id not in claims)
            heap = self.requeued[level]
            if any(m.id in claims for _, m in heap):
                found.extend(m for _, m in heap if m.id in claims)
                kept = [(seq, m) for seq, m in heap if m.id not in claims]
                heapq.heapify(kept)
                self.requeued[level] = kept
        now = time.time()
        shard = self.shard
        tags = []
        for msg in sorted(found, key=lambda m: claims[m.id]):
            self._took(msg)
            tag = claims[msg.id]
            timeout = msg.ack_timeout or sub.options.ack_timeout or self.options.ack_timeout
            delivery_id = shard.new_delivery_id()
            deadline = now + timeout if timeout else None
            self.inflight[msg.seq] = Delivery(msg, sub, delivery_id, deadline)
            sub.adopt(tag, msg.seq)
            if deadline is not None:
                shard.schedule(deadline, self, msg.seq, delivery_id)
            tags.append(tag)
        return tags

    def unsent(self, sub: Subscription, msg: Message) -> None:
        """An auto-ack delivery never left the core (its consumer was cut): take it back
        (written again if settled() had already forgotten it in the store)."""
        stored = (msg.persistent or msg.stored) and self.durable
        forgotten = stored and not self.shard.unforget(self.key, msg.seq)
        self._return(msg, "disconnect", forgotten=forgotten)

    def settle(
        self, sub: Subscription, keys: list[Any], outcome: Outcome
    ) -> asyncio.Future[None] | None:
        """Ack, requeue or dead-letter (reject) deliveries. Returns the write that removes
        them from the store, if there is one."""
        inflight = self.inflight
        written: asyncio.Future[None] | None = None
        if outcome is Outcome.ACK:  # the common case, in one loop
            settled = self.shard.settled
            acked = 0
            for seq in keys:
                d = inflight.get(seq)
                if d is None or d.sub is not sub:
                    continue
                del inflight[seq]
                acked += 1
                written = settled(self, d.message) or written
            self.acked += acked
        else:
            for seq in keys:
                d = inflight.get(seq)
                if d is None or d.sub is not sub:
                    continue
                del inflight[seq]
                written = self._settle_one(d.message, outcome) or written
        self.pump()
        return written

    def _settle_one(self, msg: Message, outcome: Outcome) -> asyncio.Future[None] | None:
        if outcome is Outcome.ACK:
            self.acked += 1
            return self.shard.settled(self, msg)
        if outcome is Outcome.REQUEUE:
            self._return(msg, "nack")
            return None
        return self.shard.discard(self, msg, "rejected")

    def expire_delivery(self, seq: int, delivery_id: int) -> None:
        """An ack timeout fired: redeliver, preferring another subscriber."""
        d = self.inflight.get(seq)
        if d is None or d.delivery_id != delivery_id:
            return
        del self.inflight[seq]
        if d.sub is not None:
            d.sub.forget(seq)
            self._rotate_past(d.sub)
        self._return(d.message, "ack-timeout")
        self.pump()

    def _rotate_past(self, sub: Subscription) -> None:
        """Make round robin start after ``sub`` so another subscriber gets the redelivery."""
        if sub in self.consumers and len(self.consumers) > 1:
            self._next_consumer = self.consumers.index(sub) + 1

    # ---- pull with visibility timeout (leases) ------------------------------------------
    def lease(self, max_: int, visibility: float, now: float) -> list[tuple[str, Message]]:
        """Up to ``max_`` messages, and no more bytes than half a frame (at least one)."""
        out: list[tuple[str, Message]] = []
        budget = self.shard.max_frame // 2
        while len(out) < max_:
            msg = self._pop(now)
            if msg is None:
                break
            budget -= len(msg.body) + 512
            if budget < 0 and out:
                self._unpop(msg)
                break
            msg.delivery_count += 1
            if (msg.persistent or msg.stored) and self.durable:
                self.shard.delivered(self, msg)
            delivery_id = self.shard.new_delivery_id()
            deadline = now + visibility
            self.inflight[msg.seq] = Delivery(msg, None, delivery_id, deadline)
            self.shard.schedule(deadline, self, msg.seq, delivery_id)
            out.append((f"{self.key}|{msg.seq}|{delivery_id}", msg))
        if out:
            self.delivered += len(out)
            self.shard.sensors.on_deliver(len(out))
        self._page_in()
        return out

    def settle_lease(
        self, seq: int, delivery_id: int, outcome: Outcome
    ) -> asyncio.Future[None] | None:
        """Settle a pulled message; returns the write that removes it, if there is one."""
        d = self.inflight.get(seq)
        if d is None or d.delivery_id != delivery_id or d.sub is not None:
            raise NotFound("lease is unknown or expired (the message may have been redelivered)")
        del self.inflight[seq]
        written = self._settle_one(d.message, outcome)
        self.pump()
        return written

    # ---- paging ------------------------------------------------------------------------
    def _page_in(self) -> None:
        """Read the next page back from the store if there is one and the window has room
        for it."""
        pages = self.pages
        if pages is None or not pages.count:
            return
        n = pages.wanted(self.count, self.nbytes)
        if n:
            pages.reading = True
            done = functools.partial(self._paged_in, generation=pages.generation)
            self.shard.read_page(self.key, pages.first - 1, n, done)

    def _paged_in(self, page: list[Message] | None, *, generation: int) -> None:
        """A page asked for at ``generation`` came back (None: the read failed; it is
        tried again on the next pump)."""
        pages = self.pages
        assert pages is not None
        pages.reading = False
        if page is None or generation != pages.generation:  # failed, or purged meanwhile
            return
        pages.took(page)
        for msg in page:
            self._ready(msg)
        self.pump()

    # ---- administration ----------------------------------------------------------------
    def purge(self) -> list[Message]:
        """Drop every ready message (not those in flight); returns those in memory (the
        paged ones are counted by :attr:`paged` before, and gone from the store with the
        shard's purge)."""
        if self.pages is not None:
            self.pages.clear()
        out: list[Message] = []
        for level in range(_LEVELS):
            out.extend(self.ready[level])
            out.extend(m for _, m in self.requeued[level])
            self.ready[level].clear()
            self.requeued[level].clear()
        self.count = 0
        self.nbytes = 0
        return out

    def close(self, reason: str) -> None:
        """The queue is deleted: cancel consumers and waiters."""
        for w in self.waiters:
            if not w.future.done():
                w.future.set_exception(NotFound(f"{self.key} was deleted"))
        self.waiters.clear()
        for sub in list(self.consumers):
            sub.inflight.clear()
            sub.session.cancel(sub, "not-found", reason)
        self.consumers.clear()
        self.inflight.clear()
