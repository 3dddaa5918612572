"""A shard's durable writes: the one place a change leaves a shard for its store.

:class:`DurableWrites` is the part of :class:`~polymq_core.destinations.shard.Shard` that

- makes each durable change (:meth:`~DurableWrites.commit`, a record of
  :mod:`polymq_core.store.writes` given to the store)
  and turns its failure into ``unavailable`` (one node: not written; a cluster: not
  committed by a majority of the shard's log);
- appends a publish's persistent messages, and enqueues them (and any transient publish
  behind them, so a queue keeps its publishers' order) only once they are durable;
- forgets the messages that leave a queue for good, every removal of one turn of the loop
  in one write per destination, tried again every second while the store refuses them.

It is a mixin, not a part the shard calls through: these run for every persistent message,
so the shard's own methods call them with no layer between. The shard holds the state
(its store, loop and destinations, and the tables below), declared here, and creates it.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
from typing import TYPE_CHECKING, Any

from polymq.errors import Unavailable
from polymq.types import Message

from ..store.contract import Store, StoreError
from ..store.logentry import Deposed, NoLeader, NotAppended
from ..store.writes import AppendBatch, AppendMany, Remove, Write
from .batches import pack_answer

if TYPE_CHECKING:
    from .queue import Queue
    from .stream import Stream


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark a failure as seen: nobody may be waiting for this write (those who are still
    get the exception)."""
    if not fut.cancelled():
        fut.exception()


class DurableWrites:
    """A shard's durable writes (see the module's docstring)."""

    # what the shard holds (Shard.__init__ makes it)
    store: Store
    loop: asyncio.AbstractEventLoop
    replicated: bool  # a cluster's log: a write is done once a majority committed it
    leading: bool
    holders: dict[str, Queue | Stream]
    _closed: bool
    _removes: dict[str, list[int]]  # removals gathered since the last flush, per key
    # resolves when the removals gathered since the last flush are durable (or fails)
    _removed: asyncio.Future[None] | None
    _retry_removes: asyncio.TimerHandle | None
    _stored_batches: list[float]  # heap: when each batch in the store expires
    # publishes waiting for a write before they are enqueued, per key, and the last write
    # they wait for (see _enqueue_after)
    _committing: dict[str, int]
    _tails: dict[str, asyncio.Future[None]]

    if TYPE_CHECKING:

        def get(self, key: str, *, create: bool = True) -> Queue | Stream: ...

    def commit(self, write: Write) -> asyncio.Future[None]:
        """Make one durable change (``PurgeMessages(key)``); resolves once it is durable (in a
        cluster: committed by a majority of the shard's log and applied here)."""
        try:
            fut = self.store.write(write)
        except StoreError as exc:
            fut = self.loop.create_future()
            fut.set_exception(Unavailable(f"store failed: {exc}"))
            fut.add_done_callback(_retrieved)
            return fut
        # A write can fail: a full disk (one node), no majority or a deposed leader (a
        # cluster). The client is told "unavailable" (retry); a write nobody waits for
        # (an ack's removal) is tried again (:meth:`flush_removes`) or, in a cluster,
        # fails quietly: its message comes back, at least once. In a cluster only a fence
        # that failed (deposed), an append nobody took (no stream leader, past the store's
        # retries) or a write that never went to the log (its node stopped leading while
        # it waited for an entry) says for sure that the entry is not in the log; a log
        # that did not answer, or a store closed with the entry on its way, may have
        # taken it.
        out: asyncio.Future[None] = self.loop.create_future()
        replicated = self.replicated

        def done(f: asyncio.Future[None]) -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
            elif (exc := f.exception()) is not None:
                if not replicated:
                    failed = "not written"
                elif isinstance(exc.__cause__, (Deposed, NoLeader, NotAppended)):
                    failed = "not committed"
                else:
                    failed = "may not have been committed"
                out.set_exception(Unavailable(f"{failed}: {exc}"))
            else:
                out.set_result(None)

        fut.add_done_callback(done)
        out.add_done_callback(_retrieved)
        return out

    def _append(
        self,
        key: str,
        messages: list[Message],
        durable: list[Message],
        batch: tuple[str, float] | None,
    ) -> asyncio.Future[None]:
        if batch is None:
            return self.commit(AppendMany(key, durable))
        batch_key, expires = batch
        heapq.heappush(self._stored_batches, expires)
        answer = pack_answer(messages)
        return self.commit(AppendBatch(key, durable, batch_key, expires, answer))

    def _enqueue_after(
        self,
        holder: Queue | Stream,
        messages: list[Message],
        fut: asyncio.Future[None],
        *,
        written_only: bool,
    ) -> None:
        """Enqueue (and so deliver) ``messages`` once ``fut`` is done. A publish holding
        persistent messages waits for its own write (in a cluster: committed by a
        majority) and, ``written_only``, is dropped if that fails: its messages were never
        there. A transient publish behind it waits for the same write, then is enqueued
        either way, so a queue keeps its publishers' order. Writes finish in the order
        they were made, and so do these callbacks."""
        key = holder.key
        committing = self._committing
        committing[key] = committing.get(key, 0) + 1
        self._tails[key] = fut

        def done(f: asyncio.Future[None]) -> None:
            left = committing.get(key, 1) - 1
            if left:
                committing[key] = left
            else:
                committing.pop(key, None)
                self._tails.pop(key, None)
            if not self.leading:
                return
            if written_only and (f.cancelled() or f.exception() is not None):
                return
            current = self.holders.get(key)
            if current is None:  # evicted or deleted meanwhile
                current = self.get(key)
            for m in messages:
                current.put(m)
            current.pump()

        fut.add_done_callback(done)

    def settled(self, queue: Queue, msg: Message) -> asyncio.Future[None] | None:
        """A message left the queue for good: forget it durably (batched). The future
        resolves once that is written (see :meth:`forget`); None: nothing to write."""
        if (msg.persistent or msg.stored) and queue.durable:
            return self.forget(queue.key, [msg.seq])
        return None

    def settled_many(self, queue: Queue, msgs: list[Message]) -> None:
        """:meth:`settled` of each of ``msgs``, their removals in one list (a failed one is
        tried again as :meth:`forget` says; nobody waits for these)."""
        if queue.durable:
            seqs = [m.seq for m in msgs if m.persistent or m.stored]
            if seqs:
                self.forget(queue.key, seqs)

    def forget(self, key: str, seqs: list[int]) -> asyncio.Future[None]:
        """Remove messages from the store, with every other removal of this turn of the
        loop in one write per destination. The future fails if that write does (a full
        disk); the removals are then tried again every second until they are written
        (:meth:`flush_removes`), so the store catches up once space returns, and until
        then a restart would deliver those messages again (at least once)."""
        self._removes.setdefault(key, []).extend(seqs)
        if self._removed is None:
            self._removed = self.loop.create_future()
            self._removed.add_done_callback(_retrieved)
            if self._retry_removes is None:
                self.loop.call_soon(self.flush_removes)
        return self._removed

    def unforget(self, key: str, seq: int) -> bool:
        """Take back a removal not yet flushed; False if it already went to the store."""
        seqs = self._removes.get(key)
        if seqs and seq in seqs:
            seqs.remove(seq)
            return True
        return False

    def flush_removes(self) -> None:
        self._retry_removes = None
        removes, self._removes = self._removes, {}
        removed, self._removed = self._removed, None
        writes = {key: self._remove(key, seqs) for key, seqs in removes.items() if seqs}
        if not writes:
            if removed is not None and not removed.done():
                removed.set_result(None)
            return
        left = len(writes)
        errors: list[BaseException] = []

        def written(key: str, f: asyncio.Future[None]) -> None:
            nonlocal left
            left -= 1
            exc = None if f.cancelled() else f.exception()
            if exc is not None:
                errors.append(exc)
                self._retry_remove(key, removes[key])
            if left or removed is None or removed.done():
                return
            if errors:
                removed.set_exception(errors[0])
            else:
                removed.set_result(None)

        for key, fut in writes.items():
            fut.add_done_callback(functools.partial(written, key))

    def _remove(self, key: str, seqs: list[int]) -> asyncio.Future[None]:
        return self.commit(Remove(key, seqs))

    def _retry_remove(self, key: str, seqs: list[int]) -> None:
        """A removal was not written: on one node (a full disk) try it again in a second,
        with whatever comes meanwhile. A cluster's leader that failed to commit one may be
        deposed: the next leader delivers those messages again (at least once)."""
        if self.replicated or self._closed:
            return
        self._removes.setdefault(key, [])[:0] = seqs
        if self._retry_removes is None:
            self._retry_removes = self.loop.call_later(1.0, self.flush_removes)


__all__ = ["DurableWrites"]
