"""A shard's store in cluster mode: its replicated log, applied (docs/cluster.md, "Writes"
and "Leaders").

Every node applies every entry of a shard's log (:mod:`polymq_core.replication.jetstream`, entries
as
:mod:`polymq_core.store.logentry` encodes them), in order, to its own SQLite snapshot of the shard
(:meth:`~polymq_core.store.sqlite.SqliteStore.apply_entry`), together with the entry's sequence.

:class:`ReplicatedStore` is the :class:`~polymq_core.store.contract.Store` a shard uses in cluster
mode. Reads go to the local SQLite. Writes are taken only while this node leads the shard
(:meth:`ReplicatedStore.promote`); one entry is in flight at a time, and a write's future
resolves once its entry is in the log (acknowledged by a majority, fsynced). A leader whose
append fails the fence, or that sees an entry it did not write, is deposed: its pending
writes fail and ``on_deposed`` is called. A deposed leader never confirms a write. Every
node, leader or not, holds the entries it appended or tailed for a moment (``_HOLD``) and
then queues them to its SQLite together, without waiting for each: one transaction, in which
a message acked meanwhile is never written. Reads, and a takeover, first wait until what is
held is applied; SQLite sets the pace when it falls behind (``_APPLY_AHEAD``). A store whose
next entry was purged copies the shard from another node (``fetch_snapshot``,
:mod:`polymq_core.cluster.snapshot`), puts it in place of its SQLite file and tails on from there.

It is one class, leadership, writes, the tail, the held entries and the copy from another
node together: each of them reads and moves the same few positions in the log (what was
appended, issued, queued and applied here), which no part could own alone.

:class:`ReplicatedStore` speaks the store's tree (:class:`~polymq_core.store.contract.StoreError`,
its ``__cause__`` the :class:`~polymq_core.store.logentry.LogError`), except
:meth:`ReplicatedStore.promote`, which raises :class:`~polymq_core.store.logentry.LogError`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from polymq.tasks import cancelling
from polymq.types import Message
from polymq_server.resources import give_back_memory

from ..store.contract import DestinationRecord, Store, StoreError
from ..store.filecopy import check_snapshot, install_snapshot
from ..store.logentry import (
    Deposed,
    Entry,
    LogError,
    LogUnavailable,
    NoLeader,
    NotAppended,
    decode_entry,
    encode_entry,
)
from ..store.sqlite import SqliteStore
from ..store.writes import Write
from .jetstream import ShardLog, TailEnd

__all__ = ["ReplicatedStore"]

log = logging.getLogger(__name__)

_APPLY_AHEAD = 256  # entries a node queues to its SQLite before it waits for them
# A node holds the entries it appends or tails this long (at most _HOLD_ENTRIES of them, of
# _HOLD_BYTES in all) before it queues them to its SQLite at once: one transaction, in which
# a message whose ack came within that time is never written.
# (A second: under load a consumer acks a window of messages some 100-300 ms after they
# were published; a shorter hold missed most of those acks and wrote the bodies after all.)
_HOLD = 1.0
_NO_LEADER_PAUSE = (0.05, 1.0)  # pauses between appends nobody took (an election): first, most
_HOLD_ENTRIES = 1024
_HOLD_BYTES = 16 * 1024 * 1024
# bytes of entries applied since heap memory was last handed back: once this many have been
# and nothing more is held or being applied (the log quiet), malloc_trim (the entries were
# freed, but glibc keeps their pages resident; a follower's RSS would stay up to a hold's
# 16 MiB above what it uses, which the memory alarm reads)
_TRIM_AFTER = 4 * 1024 * 1024
_RESTORE_BACKOFF = (0.5, 30.0)  # delays between attempts to copy a snapshot: first, most


async def _stop(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it is done (cancelling again if a cancellation was
    swallowed on the way); what it raised, bar CancelledError, is logged."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())


# -- the store ---------------------------------------------------------------------------------

_Pending = tuple[asyncio.Future[None], tuple[Any, ...]]  # a write's future, its encoding


class Routes(Protocol):
    """What follows a shard's durable bindings
    (:class:`~polymq_core.topics.durableroutes.ShardRoutes`)."""

    def load(self, pairs: Iterable[tuple[str, str]]) -> None: ...
    def apply(self, writes: Sequence[Sequence[Any]]) -> None: ...


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class _Slot:
    """The entry an append in flight fills if it lands: ``seq``, the one after its fence
    (JetStream stores a fenced message there or nowhere). What is learnt meanwhile:
    whether the entry the tail found there is this append's (``found``; None: none yet),
    and that the stream has a new leader to send it to again (``again``). Either ends the
    wait on the old leader's answer (``waiting``, rescheduled to now), which may never
    come; except this append's own entry brought by the tail before its answer, as is
    usual, unless it was sent again (``resent``)."""

    __slots__ = ("again", "found", "payload", "resent", "seq", "waiting")

    def __init__(self, seq: int, payload: bytes) -> None:
        self.seq = seq
        self.payload = payload
        self.found: bool | None = None
        self.again = False
        self.resent = False
        self.waiting: asyncio.Timeout | None = None

    def learn(self, *, entry: bytes | None = None, again: bool = False) -> None:
        if entry is not None and self.found is None:
            self.found = entry == self.payload
            if self.found and not self.resent:
                return  # its answer is on its way
        self.again = self.again or again
        waiting = self.waiting
        if waiting is not None and not waiting.expired():
            waiting.reschedule(asyncio.get_running_loop().time())


class ReplicatedStore(Store):
    """A shard's :class:`~polymq_core.store.contract.Store` in cluster mode: the shard's log,
    applied
    to ``local`` (its snapshot, which this store opens and closes).

    ``applied`` is the sequence of the last entry committed to ``local`` (what a node may
    announce: everything up to it is in its SQLite); ``is_leader`` says whether writes are
    taken.
    ``on_deposed`` is called (on the event loop) when this store stops leading because
    another node appended to the log, or its local snapshot failed.

    ``fetch_snapshot(path)``, if given, is how a store whose next entry was purged gets the
    shard: it writes a copy of another node's SQLite file to ``path`` and returns the
    sequence applied in it. The store retries it (with back-off) until a copy ahead of its own
    is installed, and tails on from there; ``restoring`` is true meanwhile (:meth:`promote`
    waits; reads fail while the copy goes in place). Without it the tail stops for good
    (``tail_error``).

    ``routes``, if given, is told the shard's durable bindings as the local store has them
    when it opens (or a copy goes in place), then every entry's writes as they come, in the
    log's order (:mod:`polymq_core.topics.durableroutes`)."""

    def __init__(
        self,
        local: SqliteStore,
        log: ShardLog,
        node_id: str,
        *,
        on_deposed: Callable[[], None] | None = None,
        max_entry_writes: int = 10_000,
        fetch_snapshot: Callable[[Path], Awaitable[int]] | None = None,
        routes: Routes | None = None,
    ) -> None:
        if max_entry_writes < 1:
            raise ValueError("max_entry_writes must be at least 1")
        self.on_commit = None
        self.local = local
        self.log = log
        self.node_id = node_id
        self.on_deposed = on_deposed
        self.is_leader = False
        self.applied = 0
        self._issued = 0  # the last entry known here: appended by this node, or tailed
        self._queued = 0  # the last entry held or queued to ``local`` (applied once it commits)
        self.last = 0  # as leader: the log's last sequence, as far as this node knows
        self.epoch = 0  # as leader: the sequence of the takeover entry that made it so
        self.tail_error: LogError | None = None  # why the tail stopped for good, if it did
        self.fetch_snapshot = fetch_snapshot
        self.routes = routes
        self.restoring = False  # copying a snapshot: the local store may be closed
        self._swap: asyncio.Task[None] | None = None  # putting a snapshot in place
        self._max_writes = max_entry_writes
        self._state = _State.NEW
        self._pending: list[_Pending] = []
        self._flushing: list[_Pending] = []  # the entry in flight
        self._inflight: asyncio.Future[None] | None = None  # done once its append answered
        self._slot: _Slot | None = None  # where that append lands, if it does
        self._uncertain = False  # an append's outcome is unknown: catch up before the next
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()  # set (and replaced) whenever ``applied`` moves
        self._promoting = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._follower: asyncio.Task[None] | None = None
        self._tail: asyncio.Task[None] | None = None
        self._restart_tail = False
        self._applying = 0  # entries queued to ``local`` that have not committed
        self._last_applying: asyncio.Future[None] | None = None  # the last of those
        # entries received, not yet queued to ``local``: (seq, writes, the one before)
        self._held: list[tuple[int, Sequence[Sequence[Any]], int]] = []
        self._held_bytes = 0
        self._untrimmed = 0  # bytes of entries queued to SQLite since the heap was last trimmed
        self._hold_timer: asyncio.TimerHandle | None = None
        self._waiting = 0  # callers of _wait_applied: held entries are queued at once
        log.on_new_leader = self._new_stream_leader

    def __repr__(self) -> str:
        role = "leader" if self.is_leader else "follower"
        state = self._state.value
        return f"<ReplicatedStore {self.log.stream} {state} {role} applied={self.applied}>"

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        if self._state is not _State.NEW:
            raise StoreError(f"replicated store {self.log.stream} was already opened")
        await self.local.open()
        try:
            self.applied = self.last = self._issued = await self.local.applied()
            self._queued = self.applied
            if self.routes is not None:
                self.routes.load(await self.local.load_bindings())
        except BaseException:
            await self.local.close()
            raise
        loop = asyncio.get_running_loop()
        self._state = _State.OPEN
        self._flusher = loop.create_task(self._flush_loop(), name=f"flush {self.log.stream}")
        self._follower = loop.create_task(self._follow(), name=f"follow {self.log.stream}")
        log.info("%s: opened at entry %d, tailing", self.log.stream, self.applied)

    async def close(self) -> None:
        if self._state is _State.CLOSED:
            return
        was_open = self._state is _State.OPEN
        self._state = _State.CLOSED
        self.is_leader = False
        for task in (self._flusher, self._follower):
            if task is not None:
                task.cancel()
        await _stop(self._flusher)
        await _stop(self._follower)
        if self._swap is not None:  # a snapshot going in place: let it, then close that
            await asyncio.wait([self._swap])
        if self._hold_timer is not None:  # held entries stay in the log: applied on reopening
            self._hold_timer.cancel()
            self._hold_timer = None
        self._held.clear()
        self._fail(self._flushing, StoreError(f"replicated store {self.log.stream} closed"))
        self._fail_pending(f"replicated store {self.log.stream} closed")
        if was_open:
            await self.local.close()

    # -- leadership --------------------------------------------------------------------------

    async def promote(self, timeout: float = 10.0) -> int:
        """Lead the shard: wait until everything in the log is applied here (this node can
        follow it), append a takeover entry fenced on the log's last sequence, then wait
        until everything up to it is applied (if somebody appended before it or after it
        meanwhile, start over, appending before applying: a rival that is still writing
        then has only a round trip to slip in, not the time to apply its entries). Returns
        the takeover entry's sequence, this leader's epoch.
        :class:`LogUnavailable` if that did not succeed within ``timeout`` seconds."""
        if self._state is not _State.OPEN:
            raise StoreError(f"replicated store {self.log.stream} is {self._state.value}, not open")
        async with self._promoting:
            if self.is_leader:
                return self.epoch
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            backoff = 0.05
            followed = False  # the log was applied up to its end once: the tail works
            hint: int | None = None  # the last sequence a failed fence named
            while True:
                try:
                    if hint is None:
                        _, last = await self.log.info()
                    else:
                        last, hint = hint, None
                    if not followed:
                        await self._read_ahead(last)
                    await self._wait_applied(0 if followed else last, deadline)
                    followed = True
                    payload = encode_entry(self.node_id, last + 1, [], takeover=True)
                    seq = await self.log.append(payload, expected_last=last)
                    if self._issued == seq - 1:  # (the tail may have brought it already)
                        await self._on_entry(seq, payload)
                    await self._wait_applied(seq, deadline)
                except (Deposed, LogUnavailable) as exc:
                    if loop.time() >= deadline:
                        raise LogUnavailable(
                            f"{self.log.stream}: no takeover within {timeout:.1f} s: {exc}"
                        ) from exc
                    if isinstance(exc, Deposed):
                        if followed and exc.last is not None:
                            # the stream's leader named its last entry: fence on that at once
                            # (a rival still appending leaves only a round trip to win)
                            hint = exc.last
                            continue
                        # a stale look at the log (a minority's replica) can fail the fence
                        # again and again: back off, and say so once per try
                        log.info("%s: takeover raced another append (%s)", self.log.stream, exc)
                    pause = min(backoff, max(0.0, deadline - loop.time()))
                    backoff = min(backoff * 2, 1.0)
                    await asyncio.sleep(pause)
                    continue
                if self._issued > seq:  # somebody appended after our takeover already
                    continue
                self.epoch = self.last = seq
                self._uncertain = False
                self.is_leader = True
                log.info("%s: this node leads from entry %d on", self.log.stream, seq)
                return seq

    async def _read_ahead(self, seq: int) -> None:
        """While taking over: take the entries up to ``seq`` the tail has not brought yet,
        read one by one from the stream's leader (this node). The tail's consumer may have
        lived on the server that died (JetStream places it on any replica), and a new one
        is made through JetStream's meta leader: when the dead server led that too, its
        election (4-9 s) came on top of the stream's. Entries the tail brings later are
        skipped as applied (``_on_entry`` takes each sequence once, in order: before this
        node leads, nothing in it awaits until the entry is taken)."""
        while self._issued < seq and not self.is_leader:
            if self.restoring or self._state is not _State.OPEN:
                return  # (a snapshot being copied in place: what comes after is the tail's)
            nxt = self._issued + 1
            try:
                data = await self.log.get(nxt)
            except LogError as exc:  # (purged, say: the tail ends, a snapshot follows)
                log.debug("%s: reading entry %d for the takeover: %s", self.log.stream, nxt, exc)
                return
            if self.restoring or self._issued + 1 != nxt:
                continue  # the tail took it meanwhile (or a snapshot came)
            await self._on_entry(nxt, data)
            if self._issued < nxt:
                return  # (not taken: leave it to the tail)

    def demote(self) -> None:
        """Stop leading: writes not yet sent fail with StoreError (one being appended
        completes either way)."""
        if self.is_leader:
            log.info("%s: no longer leading", self.log.stream)
        self.is_leader = False
        self._fail_pending(f"{self.log.stream}: this node no longer leads the shard")

    async def written(self) -> None:
        """Return once no write is waiting or being appended (each was committed or
        failed): what was issued before is in the log, or never will be. A stopping leader
        waits for this before it steps down (its last acks' removals among them)."""
        while self._pending or self._flushing or self._inflight is not None:
            if self._state is not _State.OPEN:
                return
            await asyncio.sleep(0.01)

    def _deposed(self, reason: str) -> None:
        if not self.is_leader:
            return
        log.warning("%s: deposed: %s", self.log.stream, reason)
        self.is_leader = False
        self._fail_pending(f"{self.log.stream}: deposed ({reason})")
        if self.on_deposed is not None:
            try:
                self.on_deposed()
            except Exception:
                log.exception("%s: the on_deposed hook failed", self.log.stream)

    async def _wait_applied(self, seq: int, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        self._waiting += 1  # meanwhile, entries are queued as they come, not held
        try:
            while self.applied < seq or self.restoring:
                self._release()
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise LogUnavailable(
                        f"{self.log.stream}: applied {self.applied} of {seq} entries in time"
                        + (f" (the tail stopped: {self.tail_error})" if self.tail_error else "")
                        + (" (copying a snapshot from another node)" if self.restoring else "")
                    )
                try:
                    async with asyncio.timeout(remaining):
                        await self._progress.wait()
                except TimeoutError:
                    pass
        finally:
            self._waiting -= 1

    def _advance(self, seq: int) -> None:
        """Entries up to ``seq`` are committed to ``local``."""
        self.applied = seq
        self._issued = max(self._issued, seq)
        self._progress.set()
        self._progress = asyncio.Event()

    # -- writes --------------------------------------------------------------------------------

    def write(self, write: Write) -> asyncio.Future[None]:
        """Pend ``write``, encoded now (:meth:`~polymq_core.store.sqlite.SqliteStore.encode`):
        that tuple is what the entry carries and what every node applies."""
        if self._state is not _State.OPEN:
            raise StoreError(f"replicated store {self.log.stream} is {self._state.value}, not open")
        if not self.is_leader:
            raise StoreError(f"{self.log.stream}: not the leader")
        encoded = self.local.encode(write)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((future, encoded))
        self._wake.set()
        return future

    @staticmethod
    def _fail(batch: list[_Pending], error: StoreError) -> None:
        for future, _ in batch:
            if not future.done():
                failure = StoreError(str(error))
                failure.__cause__ = error.__cause__
                future.set_exception(failure)
        batch.clear()

    def _fail_pending(self, reason: str) -> None:
        """Fail the writes waiting for an entry: none of them went to the log."""
        pending, self._pending = self._pending, []
        self._fail(pending, _store_error(reason, NotAppended(reason)))

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                if not self.is_leader:
                    self._fail_pending(f"{self.log.stream}: this node no longer leads the shard")
                    break
                taken = self._take()
                if taken is not None:
                    await self._flush(*taken)

    def _take(self) -> tuple[list[_Pending], bytes] | None:
        """The next entry: as many pending writes as fit, in order."""
        limit = self.log.max_entry
        n = min(len(self._pending), self._max_writes)
        while True:
            batch = self._pending[:n]
            payload = encode_entry(self.node_id, self.epoch, [w for _, w in batch])
            if len(payload) <= limit or n == 1:
                break
            n //= 2
        del self._pending[:n]
        if len(payload) > limit:
            self._fail(
                batch,
                StoreError(
                    f"{self.log.stream}: a write of {len(payload)} bytes is more than the log"
                    f" takes in one entry ({limit} bytes)"
                ),
            )
            return None
        return batch, payload

    async def _flush(self, batch: list[_Pending], payload: bytes) -> None:
        """Append one entry, apply it locally, resolve its writes."""
        self._flushing = batch
        started = time.perf_counter()
        writes = [write for _, write in batch]
        epoch = self.epoch  # the payload says it: never append it under another
        rechecked = False
        waited = 0.0  # for the stream to have a leader (an election: nothing was appended)
        pause = _NO_LEADER_PAUSE[0]
        while True:
            try:
                if self._uncertain:
                    await self._catch_up(None)
                if not self.is_leader or self.epoch != epoch:  # demoted meanwhile
                    reason = f"{self.log.stream}: this node no longer leads the shard"
                    self._fail(batch, StoreError(reason))
                    return
                seq = await self._append(payload)
            except Deposed as exc:
                # The fence failed. If every entry past the one we expected is ours (appends
                # whose answers were lost), nobody else appended: catch up and try again.
                if not rechecked and self.is_leader:
                    rechecked = True
                    try:
                        await self._catch_up(exc.last)
                        continue
                    except LogError as again:
                        exc = again if isinstance(again, Deposed) else exc
                self._fail(batch, _store_error(f"{self.log.stream}: deposed ({exc})", exc))
                self._deposed(str(exc))
                return
            except NoLeader as exc:
                # Nobody took it (the stream is electing): certainly not in the log, so it
                # is tried again, for as long as the log's own timeout, while this node leads.
                if waited < self.log.timeout:
                    await asyncio.sleep(pause)
                    waited += pause
                    pause = min(2 * pause, _NO_LEADER_PAUSE[1])
                    continue
                self._fail(batch, _store_error(f"{self.log.stream}: no leader: {exc}", exc))
                return
            except LogError as exc:
                self._uncertain = True
                self._fail(batch, _store_error(f"{self.log.stream}: log unavailable: {exc}", exc))
                return
            break
        # Committed: in the log, on a majority, fsynced. The local SQLite is a snapshot of
        # the log, so it takes the entry later, held with the others for a moment (a
        # message acked meanwhile is never written); reads wait for it (sync).
        pace = self._hold(seq, writes, len(payload))
        for future, _ in batch:
            if not future.done():
                future.set_result(None)
        batch.clear()
        if self.on_commit is not None:
            try:
                self.on_commit(time.perf_counter() - started, len(writes))
            except Exception:
                log.exception("%s: the on_commit hook failed", self.log.stream)
        if pace is not None:  # too many queued: SQLite sets the pace
            try:
                await pace
            except StoreError:
                pass  # the entry is committed; _entry_applied saw to the local failure

    async def _append(self, payload: bytes) -> int:
        """Append after ``self.last``; the tail waits meanwhile before it judges an entry
        of ours (it is this append's, applied here once answered)."""
        inflight: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight = inflight
        self._slot = slot = _Slot(self.last + 1, payload)
        try:
            seq = await self._landed(slot)
            self.last = seq
            self._issued = max(self._issued, seq)
            return seq
        finally:
            self._inflight = self._slot = None
            inflight.set_result(None)

    async def _landed(self, slot: _Slot) -> int:
        """The sequence ``slot``'s entry landed at: the log's answer, or the entry found at
        ``slot.seq``. A stream leader that steps down or dies may never answer (nats-server
        drops the proposals it had not committed, and answers none that it commits as a
        follower), so when JetStream names a new leader the entry is sent again, the same
        payload on the same fence (it lands once at most: JetStream stores a fenced message
        at the sequence after its fence or nowhere), and the entry the tail brings at
        ``slot.seq`` settles it either way: ours, or another's (:class:`Deposed`: certainly
        not in the log). :class:`LogUnavailable` if nothing settled it within the log's
        timeout (it may or may not be in the log)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.log.timeout
        failed: LogError | None = None  # a resend's error: the tail may still settle it
        while slot.found is None:
            try:
                async with asyncio.timeout_at(deadline) as slot.waiting:
                    if failed is None:
                        return await self.log.append(slot.payload, expected_last=slot.seq - 1)
                    await loop.create_future()  # until the tail or a new leader says more
            except TimeoutError:
                if slot.found is not None:
                    break
                if not slot.again:  # the deadline, and nothing learnt: unknown (after a
                    # resend, even a refused one: the place may hold the first try)
                    raise LogUnavailable(
                        f"appending to {self.log.stream} after {slot.seq - 1}: no answer"
                        f" within {self.log.timeout:.1f} s"
                        + (f" (sent again: {failed})" if failed is not None else "")
                    ) from failed
                slot.again, slot.resent, failed = False, True, None
            except LogError as exc:
                if not slot.resent:
                    raise  # (a refused first try, Deposed, is in no log)
                # a resend refused (entry slot.seq is taken: by the first try or another
                # node's, maybe not applied yet: the leader counts the entries it has not
                # committed) or unanswered: the tail may still bring what is there
                failed = exc
            finally:
                slot.waiting = None
        if not slot.found:
            raise Deposed(
                f"{self.log.stream}: entry {slot.seq} was appended by another node",
                last=slot.seq,
            )
        log.info("%s: entry %d landed, unanswered by the old leader", self.log.stream, slot.seq)
        return slot.seq

    def _new_stream_leader(self) -> None:
        """JetStream named a new leader for the stream: an append waiting on the old one
        is sent again (see :meth:`_landed`)."""
        if self._slot is not None:
            self._slot.learn(again=True)

    async def _catch_up(self, last: int | None) -> None:
        """After an append whose outcome is unknown, or a fence that failed: learn the log's
        last sequence (``last`` if the log said it) and wait until the tail has applied it.
        An entry of ours that did land is applied then; one of another node's deposes us
        (:class:`Deposed`)."""
        if last is None:
            _, last = await self.log.info()
        loop = asyncio.get_running_loop()
        await self._wait_applied(last, loop.time() + self.log.timeout)
        if not self.is_leader:
            raise Deposed(f"{self.log.stream}: this node no longer leads the shard")
        self.last = max(self.last, last)
        self._uncertain = False

    def _local_failed(self, exc: StoreError) -> None:
        """The local snapshot failed to apply an entry: stop leading, and tail again from
        what it has."""
        log.error("%s: applying to the local store failed: %s", self.log.stream, exc)
        self._deposed(f"the local store failed: {exc}")
        self._restart_tail = True
        if self._tail is not None:
            self._tail.cancel()

    # -- following the log -------------------------------------------------------------------------

    async def _follow(self) -> None:
        """Tail the log from ``applied + 1``, again after a local failure."""
        while True:
            self._restart_tail = False
            self._tail = self.log.tail(self.applied + 1, self._on_entry)
            try:
                await self._tail
            except asyncio.CancelledError:
                if cancelling() or not self._restart_tail:
                    raise
            except StoreError as exc:
                self._local_failed(exc)
            except LogError as exc:
                if isinstance(exc, TailEnd) and self.fetch_snapshot is not None:
                    await self._settled()
                    await self._restore(exc)
                    continue
                self.tail_error = exc
                log.error("%s: stopped tailing the log: %s", self.log.stream, exc)
                return
            finally:
                self._tail = None
                await self._settled()
            await asyncio.sleep(1.0)
            while True:
                try:
                    self.applied = self._issued = self._queued = await self.local.applied()
                    break
                except StoreError as exc:
                    log.error("%s: reading the local store failed: %s", self.log.stream, exc)
                    await asyncio.sleep(1.0)

    async def _settled(self) -> None:
        """Queue the held entries, then wait until every entry queued to ``local`` has
        committed or failed."""
        self._release()
        applying, self._last_applying = self._last_applying, None
        if applying is not None:
            await asyncio.wait([applying])

    async def _on_entry(self, seq: int, data: bytes) -> None:
        if seq <= self._issued:
            return  # this leader's own entry, held when its append was answered
        try:
            entry: Entry | None = decode_entry(data)
        except LogError as exc:
            log.error("%s: entry %d is unreadable, applied as empty: %s", self.log.stream, seq, exc)
            entry = None
        slot = self._slot
        if slot is not None and seq == slot.seq and self._inflight is not None:
            slot.learn(entry=data)  # the append in flight landed here, or never will
            if slot.found:
                await asyncio.shield(self._inflight)  # the flusher applies it
                if seq <= self._issued:
                    return
        if self.is_leader:
            ours = (
                entry is not None
                and not entry.takeover
                and entry.node_id == self.node_id
                and entry.epoch == self.epoch
            )
            if ours and self._inflight is not None:
                await asyncio.shield(self._inflight)  # the flusher applies it
                if seq <= self._issued:
                    return
            if ours:  # an append of ours whose answer was lost
                self.last = max(self.last, seq)
            else:
                writer = entry.node_id if entry is not None else "an unknown writer"
                self._deposed(f"entry {seq} was appended by {writer}")
        self._issued = seq
        pace = self._hold(seq, entry.writes if entry is not None else [], len(data))
        if pace is not None:
            await pace

    def _hold(
        self, seq: int, writes: Sequence[Sequence[Any]], size: int
    ) -> asyncio.Future[None] | None:
        """Hold entry ``seq`` (``size`` bytes in the log) for _HOLD seconds (at most
        _HOLD_ENTRIES entries of _HOLD_BYTES), then queue it to ``local`` with the others;
        at once when somebody waits for ``applied``. Returns what to await before going
        on, if anything: when too many entries are queued (_APPLY_AHEAD), the commit of the
        last one queued (StoreError if it failed)."""
        after, self._queued = self._queued, seq
        self._held.append((seq, writes, after))
        if self.routes is not None and writes:
            self.routes.apply(writes)
        self._held_bytes += size
        if self._waiting or len(self._held) >= _HOLD_ENTRIES or self._held_bytes >= _HOLD_BYTES:
            self._release()
        elif self._hold_timer is None:
            self._hold_timer = asyncio.get_running_loop().call_later(_HOLD, self._release)
        last = self._last_applying
        if last is not None and self._applying >= _APPLY_AHEAD:
            return asyncio.shield(last)
        return None

    def _release(self) -> None:
        """Queue the held entries to ``local``. The writer applies them in the order they
        are queued (one thread), taking those queued meanwhile into one transaction, so
        the tail need not wait for each (at most _APPLY_AHEAD are queued at once); each
        names the one before it, so none commits behind one that failed (the tail then
        starts again from what was applied)."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        self._untrimmed += self._held_bytes
        held, self._held, self._held_bytes = self._held, [], 0
        for seq, writes, after in held:
            try:
                applying = self.local.apply_entry(seq, writes, after=after)
            except StoreError as exc:
                if self._state is _State.OPEN:
                    self._local_failed(exc)
                return
            self._applying += 1
            self._last_applying = applying
            applying.add_done_callback(partial(self._entry_applied, seq))

    def _entry_applied(self, seq: int, applying: asyncio.Future[None]) -> None:
        self._applying -= 1
        if applying.cancelled():
            return
        exc = applying.exception()
        if exc is not None:
            if isinstance(exc, StoreError) and self._state is _State.OPEN:
                self._local_failed(exc)
            return
        if seq > self.applied:
            self._advance(seq)
        if self._untrimmed >= _TRIM_AFTER and not self._applying and not self._held:
            self._untrimmed = 0
            give_back_memory()

    # -- snapshots ---------------------------------------------------------------------------------

    async def snapshot(self, path: Path) -> int:
        """A consistent copy of the local SQLite in the new file ``path``
        (:meth:`~polymq_core.store.sqlite.SqliteStore.backup`); the sequence applied in it.
        :class:`StoreError` while this store is not open or is copying a snapshot itself."""
        if self._state is not _State.OPEN or self.restoring:
            state = "copying a snapshot itself" if self.restoring else self._state.value
            raise StoreError(f"replicated store {self.log.stream} is {state}")
        await self.sync()  # what this node holds goes in too
        return await self.local.backup(path)

    async def _restore(self, why: LogError) -> None:
        """The tail found its next entry purged. If it is really past ``applied + 1`` (the
        tail's position may lag behind entries applied on appending), copy the shard from
        another node until a copy ahead of ``applied`` is in place of the local store."""
        assert self.fetch_snapshot is not None
        target = self.local.path.with_name(self.local.path.name + ".snapshot")
        delay = _RESTORE_BACKOFF[0]
        try:
            while True:
                try:
                    first, _ = await self.log.span()
                    if self.applied + 1 >= first:
                        return  # nothing this node needs was purged: tail on
                    if not self.restoring:
                        log.warning(
                            "%s: %s; this node applied %d: copying the shard from another node",
                            self.log.stream,
                            why,
                            self.applied,
                        )
                        self.restoring = True
                        self._deposed(f"entry {self.applied + 1} was purged from its log")
                    target.unlink(missing_ok=True)
                    said = await self.fetch_snapshot(target)
                    found = await asyncio.to_thread(check_snapshot, target)
                    if found != said:
                        raise StoreError(f"the copy holds entry {found}, its node said {said}")
                    if found > self.applied:
                        self._swap = asyncio.get_running_loop().create_task(
                            self._install(target), name=f"install {self.log.stream}"
                        )
                        await asyncio.shield(self._swap)  # close() waits for it
                        log.info("%s: copied the shard at entry %d", self.log.stream, found)
                        return
                    log.warning(
                        "%s: the copy is at entry %d, no further than this node",
                        self.log.stream,
                        found,
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(
                        "%s: copying the shard failed (%s); trying again in %.1f s",
                        self.log.stream,
                        exc,
                        delay,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RESTORE_BACKOFF[1])
        finally:
            if self.restoring:
                self.restoring = False
                self._advance(self.applied)  # wakes promote()

    async def _install(self, snapshot: Path) -> None:
        """Put the copy ``snapshot`` in place of the local store's file and open it (the old
        file again if that failed); ``applied`` is the copy's."""
        old = self.local
        try:
            await old.close()
            fresh = old.reopened()
            try:
                await asyncio.to_thread(install_snapshot, snapshot, old.path)
            finally:
                await fresh.open()
                self.local = fresh
            applied = await fresh.applied()
            if self.routes is not None:
                self.routes.load(await fresh.load_bindings())
            self.last = self._queued = applied
            self.restoring = False
            self._advance(applied)
        finally:
            self._swap = None

    # -- reads -------------------------------------------------------------------------------------

    async def sync(self) -> int:
        """Queue the entries held here and wait until they are in the local store (every
        read does so first); the sequence applied."""
        if self.applied < self._queued:
            loop = asyncio.get_running_loop()
            try:
                await self._wait_applied(self._queued, loop.time() + self.log.timeout)
            except LogError as exc:
                raise _store_error(f"{self.log.stream}: applying: {exc}", exc) from exc
        return self.applied

    async def kv_get(self, key: str) -> bytes | None:
        await self.sync()
        return await self.local.kv_get(key)

    async def kv_keys(self, prefix: str, limit: int) -> list[str]:
        await self.sync()
        return await self.local.kv_keys(prefix, limit)

    async def load_destinations(self) -> list[DestinationRecord]:
        await self.sync()
        return await self.local.load_destinations()

    async def load_messages(self, destination: str) -> list[Message]:
        await self.sync()
        return await self.local.load_messages(destination)

    async def load_bindings(self) -> list[tuple[str, str]]:
        await self.sync()
        return await self.local.load_bindings()

    async def load_batches(self, now: float) -> list[tuple[str, float, bytes]]:
        await self.sync()
        return await self.local.load_batches(now)

    async def load_cursors(self) -> list[tuple[str, str, bytes]]:
        await self.sync()
        return await self.local.load_cursors()

    async def count_messages(self, destination: str) -> int:
        await self.sync()
        return await self.local.count_messages(destination)

    async def load_page(self, destination: str, after: int, limit: int) -> list[Message]:
        """A queue's page (paging.py), read once every entry committed so far is applied
        here: the local store is written a step behind the log, and a message the leader
        counted as paged is committed, so held here (``_hold`` runs before a write's
        future resolves) and applied by ``sync``."""
        await self.sync()
        return await self.local.load_page(destination, after, limit)

    async def measure_messages(self, destination: str, after: int) -> tuple[int, int]:
        await self.sync()
        return await self.local.measure_messages(destination, after)


def _store_error(text: str, cause: BaseException) -> StoreError:
    error = StoreError(text)
    error.__cause__ = cause
    return error
