"""A shard's :class:`~polymq_core.store.contract.Store` in one SQLite file: :class:`SqliteStore`,
with one writer thread and one reader thread.

Writes
    Writes issued close together share one transaction and one fsync (group commit): a single
    writer thread takes everything that is queued, applies it, commits and then resolves all
    the futures at once, so throughput does not cost one fsync per message. If a commit fails,
    every write in that batch fails with :class:`~polymq_core.store.contract.StoreError` and none of
    it
    is kept; later batches are tried afresh.

Reads
    run on a thread of their own with a separate connection, so they never block the event
    loop.

Replication
    In cluster mode (:mod:`polymq_core.replication.replicatedstore`) a :class:`SqliteStore` is the
    snapshot of a
    shard's replicated log. :meth:`SqliteStore.encode` turns a write
    (:mod:`polymq_core.store.writes`) into the plain tuple a log entry carries, the one
    :meth:`SqliteStore.write` queues; :meth:`SqliteStore.apply_entry` applies one entry's
    writes together with its log sequence, and :meth:`SqliteStore.applied` reads that
    sequence back.

Snapshots
    A node whose next log entry was purged copies the shard from another node:
    :meth:`SqliteStore.backup` makes a consistent copy of the open store (SQLite's online
    backup, writes going on meanwhile); checking a received copy and putting it in place of a
    closed store's file are :mod:`polymq_core.store.filecopy`'s.

The SQLite file, its schema versions and how a batch of writes is applied are in
:mod:`polymq_core.store.schema`; this module is the store's threads and what crosses them.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgpack

from polymq.types import Message

from .contract import DestinationRecord, Store, StoreError
from .filecopy import copy_store
from .schema import (
    ANY_DELIVERY,
    ARITY,
    LOAD_APPLIED,
    LOAD_BATCHES,
    LOAD_CURSORS,
    LOAD_DESTINATIONS,
    LOAD_MESSAGES,
    LOAD_MESSAGES_UNMARKED,
    SCHEMA_VERSION,
    Queued,
    WriteKind,
    apply_batch,
    migrate,
)
from .writes import Write

__all__ = ["SqliteStore"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


_SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
_COUNT_AFTER = "SELECT count(*) FROM messages WHERE destination = ? AND seq > ?"
_MEASURED = 1000  # records whose size measure_messages sums
_MEASURE_AFTER = (
    "SELECT count(*), coalesce(sum(length(blob)), 0) FROM (SELECT blob FROM messages"
    " WHERE destination = ? AND seq > ? ORDER BY seq LIMIT ?)"
)


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


def _decode(destination: str, rows: Iterable[tuple[int, bytes, int | None]]) -> list[Message]:
    """Stored messages from their rows ``(seq, blob, delivered)``; ``delivered``: the
    count in the deliveries table (None if the message has no row there), which wins over
    the blob's when higher (a file of schema 5 kept it in the blob). Each is marked
    ``stored``: its row is removed when it leaves its queue, even a transient one. (A message is an
    array, unpacked as a tuple: a fifth cheaper than as a list.)"""
    unpack, from_wire = msgpack.unpackb, Message.from_wire
    out = []
    for seq, blob, delivered in rows:
        try:
            msg = from_wire(unpack(blob, raw=False, use_list=False))
        except Exception as exc:
            raise StoreError(f"stored message {destination} #{seq} is corrupt: {exc}") from exc
        if delivered is not None and delivered > msg.delivery_count:
            msg.delivery_count = delivered
        msg.stored = True  # (a transient one is here because its queue paged)
        out.append(msg)
    return out


def _load(conn: sqlite3.Connection, destination: str, after: int, limit: int) -> list[Message]:
    """``destination``'s messages after seq ``after`` (``limit`` at most, -1: all), in
    order. Their delivery counts are looked up only if the store has any (in one read
    transaction with the messages: none is written in between)."""
    conn.execute("BEGIN")
    try:
        marked = conn.execute(ANY_DELIVERY).fetchone() is not None
        sql = LOAD_MESSAGES if marked else LOAD_MESSAGES_UNMARKED
        return _decode(destination, conn.execute(f"{sql} LIMIT ?", (destination, after, limit)))
    finally:
        conn.commit()


class SqliteStore(Store):
    """A :class:`Store` in one SQLite file, with one writer thread and one reader thread."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        max_batch: int = 10_000,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {', '.join(sorted(_SYNCHRONOUS))}")
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.on_commit = None
        self._path = Path(path)
        self._synchronous = synchronous.upper()
        self._max_batch = max_batch
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[Queued | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._writer_done: asyncio.Future[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._rconn: sqlite3.Connection | None = None
        # packs the messages of each write as it is issued (Write.encode), on the loop
        self._pack = msgpack.Packer(use_bin_type=True).pack
        # the writer thread's failed commits: logged when they start, then once a minute
        # with their count, and when writes succeed again (a full disk fails every one)
        self._failing_since: float | None = None
        self._failures = 0
        self._failure_logged = 0.0

    def __repr__(self) -> str:
        return f"<SqliteStore {str(self._path)!r} {self._state.value}>"

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    def reopened(self) -> SqliteStore:
        """A new, unopened store on the same file, with the same settings and commit hook
        (a closed store does not open again)."""
        store = SqliteStore(self._path, synchronous=self._synchronous, max_batch=self._max_batch)
        store.on_commit = self.on_commit
        return store

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._state is not _State.NEW:
            raise StoreError(f"store {self._path} was already opened")
        loop = asyncio.get_running_loop()
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polymq-store-read")
        wconn: sqlite3.Connection | None = None
        try:
            wconn = await loop.run_in_executor(reader, self._connect_writer)
            self._rconn = await loop.run_in_executor(reader, self._connect_reader)
        except Exception as exc:
            if wconn is not None:
                wconn.close()
            reader.shutdown(wait=False)
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"cannot open store {self._path}: {exc}") from exc
        self._loop = loop
        self._reader = reader
        self._writer_done = loop.create_future()
        self._writer = threading.Thread(
            target=self._run_writer,
            args=(wconn,),
            name=f"polymq-store-write {self._path.name}",
            daemon=True,
        )
        self._state = _State.OPEN
        self._writer.start()

    async def close(self) -> None:
        if self._closing is None:
            if self._state is not _State.OPEN:
                self._state = _State.CLOSED
                return
            self._state = _State.CLOSED
            self._closing = asyncio.ensure_future(self._shut_down())
        # Shielded: a cancelled close() must not cut short the writes being committed, and
        # a second close() waits for the first.
        await asyncio.shield(self._closing)

    async def _shut_down(self) -> None:
        assert self._writer is not None and self._writer_done is not None
        assert self._reader is not None and self._rconn is not None
        self._queue.put(None)
        await self._writer_done
        self._writer.join()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._reader, self._rconn.close)
        finally:
            self._reader.shutdown(wait=False)

    def _connect_writer(self) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"store {self._path} cannot use WAL (journal_mode is {mode})")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"store {self._path} has schema version {version}; this polymq knows "
                    f"{SCHEMA_VERSION} at most (written by a newer release?)"
                )
            if version < SCHEMA_VERSION:
                # (only then: an up-to-date store opens without writing, so a node restarts
                # on a full disk, serves what it has and writes again once space returns)
                started = time.monotonic()
                conn.execute("BEGIN IMMEDIATE")
                copied = migrate(conn)
                conn.execute("COMMIT")
                if copied:
                    logger.info(
                        "store %s: schema version %d -> %d, %d messages copied in %.1f s",
                        self._path,
                        version,
                        SCHEMA_VERSION,
                        copied,
                        time.monotonic() - started,
                    )
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, check_same_thread=False)
        conn.execute("PRAGMA query_only = ON")
        return conn

    # -- writes (event loop side) -------------------------------------------------------------

    def _not_open(self) -> StoreError:
        return StoreError(f"store {self._path} is {self._state.value}, not open")

    def _submit(self, *write: Any) -> asyncio.Future[None]:
        if self._state is not _State.OPEN:
            raise self._not_open()
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        self._queue.put((future, *write))
        return future

    def write(self, write: Write) -> asyncio.Future[None]:
        # The hot path (every publish's messages): _submit inlined.
        if self._state is not _State.OPEN:
            raise self._not_open()
        encoded = write.encode(self._pack)
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        self._queue.put((future, *encoded))
        return future

    def encode(self, write: Write) -> tuple[Any, ...]:
        """``write`` as a log entry carries it (:meth:`Write.encode
        <polymq_core.store.writes.Write.encode>`, with this store's packer). Works whether
        or not the store is open."""
        return write.encode(self._pack)

    def apply_entry(
        self, seq: int, writes: Sequence[Sequence[Any]], *, after: int | None = None
    ) -> asyncio.Future[None]:
        """Queue one log entry: ``writes`` (as :meth:`encode` made them, possibly after a
        msgpack round trip) and ``replication.applied = seq``, all in one transaction and in
        order with every other write. The future resolves as a write's does. A write that is
        not well formed is a :class:`StoreError` at once, and nothing of the entry is queued.
        With ``after``, the entry commits only if entry ``after`` (0: none) is then the last
        applied; otherwise it fails as a failed commit does: a caller that queues entries
        without waiting for each never leaves a gap behind one that failed."""
        if self._state is not _State.OPEN:
            raise self._not_open()
        queued: list[Queued] = []
        for write in writes:
            try:
                kind = WriteKind(write[0])
                arity = ARITY[kind]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise StoreError(f"log entry {seq}: not a write: {write!r:.200}") from exc
            if len(write) != arity + 1:
                raise StoreError(
                    f"log entry {seq}: a {kind.name} write has {arity} fields, not {len(write) - 1}"
                )
            queued.append((None, kind, *write[1:]))
        return self._submit(WriteKind.APPLIED, seq, after, queued)

    def _settle(
        self, futures: list[asyncio.Future[None]], error: Exception | None, elapsed: float
    ) -> None:
        """On the loop: resolve one batch's futures, then tell the observability hook."""
        for future in futures:
            if future.done():  # cancelled by its waiter; the write was made all the same
                continue
            if error is None:
                future.set_result(None)
            else:
                failure = StoreError(str(error))
                failure.__cause__ = error.__cause__
                future.set_exception(failure)
        if error is None and self.on_commit is not None:
            try:
                self.on_commit(elapsed, len(futures))
            except Exception:
                logger.exception("store %s: the on_commit hook failed", self._path)

    # -- the writer thread --------------------------------------------------------------------

    def _run_writer(self, conn: sqlite3.Connection) -> None:
        try:
            stopping = False
            while not stopping:
                batch: list[Queued] = []
                item = self._queue.get()
                while item is not None:
                    batch.append(item)
                    if len(batch) >= self._max_batch:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                else:
                    stopping = True
                if batch:
                    self._commit(conn, batch)
        finally:
            try:
                conn.close()
            except sqlite3.Error as exc:
                logger.error("store %s: closing the writer connection failed: %s", self._path, exc)
            self._call_soon(self._writer_finished)

    def _writer_finished(self) -> None:
        assert self._writer_done is not None
        if not self._writer_done.done():
            self._writer_done.set_result(None)

    def _commit(self, conn: sqlite3.Connection, batch: list[Queued]) -> None:
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                apply_batch(conn, batch)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error as exc:
                        logger.error("store %s: rollback failed: %s", self._path, exc)
                raise
        except Exception as exc:
            self._failed(exc, len(batch))
            error = StoreError(f"commit of {len(batch)} writes to {self._path} failed: {exc}")
            error.__cause__ = exc
            self._call_soon(self._settle, [write[0] for write in batch], error, 0.0)
            return
        if self._failing_since is not None:
            logger.warning(
                "store %s: writes succeed again (%d commits failed in %.1f s)",
                self._path,
                self._failures,
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None
        elapsed = time.perf_counter() - started
        self._call_soon(self._settle, [write[0] for write in batch], None, elapsed)

    def _failed(self, exc: Exception, writes: int) -> None:
        """(Writer thread) A commit failed: the first of a run with its traceback, the
        rest counted, once a minute."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since, self._failures, self._failure_logged = now, 0, now
            logger.error(
                "store %s: a commit of %d writes failed: %s",
                self._path,
                writes,
                exc,
                exc_info=exc,
            )
        elif now - self._failure_logged >= 60.0:
            self._failure_logged = now
            logger.error(
                "store %s: commits still fail (%d in %.0f s): %s",
                self._path,
                self._failures,
                now - self._failing_since,
                exc,
            )
        self._failures += 1

    def _call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            logger.warning("store %s: event loop closed before a commit was reported", self._path)

    # -- reads --------------------------------------------------------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._state is not _State.OPEN:
            raise self._not_open()
        assert self._reader is not None and self._rconn is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._reader, fn, self._rconn)
        except sqlite3.Error as exc:
            raise StoreError(f"read from store {self._path} failed: {exc}") from exc

    async def kv_get(self, key: str) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else bytes(row[0])

        return await self._read(read)

    async def kv_keys(self, prefix: str, limit: int) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            if not prefix:
                rows = conn.execute("SELECT key FROM kv ORDER BY key LIMIT ?", (limit,))
            else:  # a range scan on the primary key: [prefix, prefix with its last char + 1)
                upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
                sql = "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?"
                rows = conn.execute(sql, (prefix, upper, limit))
            return [str(key) for (key,) in rows]

        return await self._read(read)

    async def load_destinations(self) -> list[DestinationRecord]:
        def read(conn: sqlite3.Connection) -> list[DestinationRecord]:
            records = []
            for destination, options, metadata, last_seq in conn.execute(LOAD_DESTINATIONS):
                try:
                    opts = {} if options is None else json.loads(options)
                    meta = {} if metadata is None else json.loads(metadata)
                except ValueError as exc:
                    raise StoreError(f"stored destination {destination} is corrupt") from exc
                records.append(DestinationRecord(destination, opts, meta, last_seq))
            return records

        return await self._read(read)

    async def load_messages(self, destination: str) -> list[Message]:
        return await self._read(lambda conn: _load(conn, destination, -1, -1))

    async def load_page(self, destination: str, after: int, limit: int) -> list[Message]:
        return await self._read(lambda conn: _load(conn, destination, after, limit))

    async def measure_messages(self, destination: str, after: int) -> tuple[int, int]:
        """The count from the (destination, seq) index alone; the bytes: the stored records'
        size, of the first ``_MEASURED`` only, scaled to the count. Summing every record
        reads the whole backlog: 1.8 s for 2M records of 1.1 KB with the file in the page
        cache, where the count takes 0.07 s (a restart ready 23 s after its start over 10M)."""

        def read(conn: sqlite3.Connection) -> tuple[int, int]:
            key = (destination, after)
            (count,) = conn.execute(_COUNT_AFTER, key).fetchone()
            measured, size = conn.execute(_MEASURE_AFTER, (*key, _MEASURED)).fetchone()
            if not measured:
                return 0, 0
            return int(count), int(size) * int(count) // int(measured)

        return await self._read(read)

    async def load_bindings(self) -> list[tuple[str, str]]:
        def read(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            sql = "SELECT destination, pattern FROM bindings ORDER BY destination, pattern"
            return [(str(d), str(p)) for d, p in conn.execute(sql)]

        return await self._read(read)

    async def load_batches(self, now: float) -> list[tuple[str, float, bytes]]:
        def read(conn: sqlite3.Connection) -> list[tuple[str, float, bytes]]:
            rows = conn.execute(LOAD_BATCHES, (now,))
            return [(str(k), float(e), bytes(a)) for k, e, a in rows]

        return await self._read(read)

    async def load_cursors(self) -> list[tuple[str, str, bytes]]:
        def read(conn: sqlite3.Connection) -> list[tuple[str, str, bytes]]:
            return [(str(i), str(d), bytes(r)) for i, d, r in conn.execute(LOAD_CURSORS)]

        return await self._read(read)

    async def count_messages(self, destination: str) -> int:
        def read(conn: sqlite3.Connection) -> int:
            sql = "SELECT count(*) FROM messages WHERE destination = ?"
            count: int = conn.execute(sql, (destination,)).fetchone()[0]
            return count

        return await self._read(read)

    async def applied(self) -> int:
        """The log sequence of the last entry applied (:meth:`apply_entry`); 0 if none."""

        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute(LOAD_APPLIED).fetchone()
            return 0 if row is None else int(row[0])

        return await self._read(read)

    async def backup(self, target: str | os.PathLike[str]) -> int:
        """A consistent copy of the store in the new file ``target`` (replaced if there),
        made by SQLite's online backup on a connection of its own, on a thread of its own:
        the writer goes on meanwhile, the copy is the store as of one commit. The copy is a
        single file (no ``-wal``). Returns the log sequence applied in the copy (0 if none)."""
        if self._state is not _State.OPEN:
            raise self._not_open()
        try:
            return await asyncio.to_thread(copy_store, self._path, Path(target))
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"copying store {self._path} to {target} failed: {exc}") from exc
