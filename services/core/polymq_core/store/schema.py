"""The SQLite side of a shard's store (:mod:`polymq_core.store.sqlite`): the layout of the file,
its versions and their migrations, the statements, and how a batch of queued writes is
applied in one transaction. No threads and no asyncio here: the store's writer thread calls
:func:`apply_batch` between ``BEGIN IMMEDIATE`` and ``COMMIT``.

Layout of the SQLite file (WAL journal, ``PRAGMA user_version = 6``)::

    messages      (destination, seq) -> blob     msgpack of Message.to_wire(); a rowid table
                                                  with a UNIQUE index on (destination, seq)
    deliveries    (destination, seq) -> count    in cluster mode, the delivery count of a
                                                  stored message that a leader delivered (a
                                                  ``DELIVERED`` write), beside its blob rather
                                                  than in it; dropped with the message
    destinations  destination -> options, metadata (JSON)
    sequences     destination -> last_seq         highest seq ever appended; kept by remove
                                                  and purge, dropped by delete_destination
    bindings      (destination, pattern)          a queue's bindings (topic patterns, without
                                                  ``topic/``); dropped by delete_destination
    kv            key -> value
    replication   one row (id 0) -> applied       in cluster mode, the sequence of the last
                                                  entry of the shard's log applied here
    batches       key -> expires, answer          idempotent publishes (batch ids) remembered
                                                  with their messages, until ``expires``
                                                  (wall-clock seconds); see
                                                  polymq_core.destinations.batches
    cursors       id -> destination, record       cursor subscriptions of queues and streams
                                                  (see polymq_core.handlers.cursors)

Schema versions: 1 had no ``bindings`` table, 2 no ``replication`` table, 3 no ``batches``
and ``cursors`` tables, 4 and before kept ``messages`` in a WITHOUT ROWID table (keyed by
(destination, seq)), 5 had no ``deliveries`` table (a mark rewrote the message's blob with the
new count, which a version 6 load still reads: the higher of the two counts wins). Opening an
older file creates what it lacks and sets version 6, in one transaction (:func:`migrate`); a
file of a version newer than this code knows is refused (by the store, which says so).

Why a rowid table for messages (version 5): in a WITHOUT ROWID table a row is a b-tree
*index* entry, whose local payload is at most ~1 KB with 4 KiB pages; a 1 KB message (about
1.1 KB as msgpack) spilled past it into an overflow page of its own, mostly empty: 4.7 KB on
disk per 1 KB message. A rowid table keeps up to ~4 KB of a row in its leaf page and fills
overflow pages whole (1.4 KB per 1 KB message, measured by the ``backlog`` bench), at the
cost of the (destination, seq) index beside it (~30 bytes a message, one more page a
commit). A larger page size would also have fitted 1 KB rows, but every commit writes whole
pages to the WAL (16 KiB pages: three times the bytes of a one-message commit) and it only
moves the spill to larger messages. Version 4's ``messages`` is copied into the new table
when the file is opened (1M 1 KB messages: 7.3 s; the file grows by the new table, 1.4 GB,
and the WAL holds as much until checkpointed; the old pages are freed inside the file, which
keeps its size and reuses them).

Why a table of their own for delivery counts (version 6): every node of a cluster applies
every entry of a shard's log, and a leader marks each message it delivers (so that a new
leader knows which to flag redelivered). Kept in the blob, a mark read the 1 KB message,
decoded and re-encoded it and wrote it back, on every node; kept beside it, a mark is a row
of three small values, and a message that is acked before anything reads its count (most of
them) never has its blob touched twice.

A write is made as a record (:mod:`polymq_core.store.writes`) and encoded to a flat tuple
``(kind, *fields)``, its :class:`WriteKind` listing the fields, each a plain msgpack value
(blobs as bytes, JSON as str); queued to the writer thread it is ``(future, kind, *fields)``
(:data:`Queued`). A replicated log entry (:mod:`polymq_core.store.logentry`) carries the same
tuple, its kind as a number (``WriteKind`` is an ``IntEnum``); :data:`ARITY` says how many
fields each kind has.
"""

from __future__ import annotations

import enum
import functools
import operator
import sqlite3
from collections.abc import Iterator
from typing import Any

SCHEMA_VERSION = 6
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages ("
    " destination TEXT NOT NULL, seq INTEGER NOT NULL, blob BLOB NOT NULL,"
    " UNIQUE (destination, seq))",
    "CREATE TABLE IF NOT EXISTS destinations ("
    " destination TEXT PRIMARY KEY, options TEXT NOT NULL, metadata TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS sequences ("
    " destination TEXT PRIMARY KEY, last_seq INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID",
    # version 2
    "CREATE TABLE IF NOT EXISTS bindings ("
    " destination TEXT NOT NULL, pattern TEXT NOT NULL,"
    " PRIMARY KEY (destination, pattern)) WITHOUT ROWID",
    # version 3
    "CREATE TABLE IF NOT EXISTS replication ("
    " id INTEGER PRIMARY KEY CHECK (id = 0), applied INTEGER NOT NULL)",
    # version 4
    "CREATE TABLE IF NOT EXISTS batches ("
    " key TEXT PRIMARY KEY, expires REAL NOT NULL, answer BLOB NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS batches_expires ON batches (expires)",
    "CREATE TABLE IF NOT EXISTS cursors ("
    " id TEXT PRIMARY KEY, destination TEXT NOT NULL, record BLOB NOT NULL) WITHOUT ROWID",
    # version 6
    "CREATE TABLE IF NOT EXISTS deliveries ("
    " destination TEXT NOT NULL, seq INTEGER NOT NULL, count INTEGER NOT NULL,"
    " PRIMARY KEY (destination, seq)) WITHOUT ROWID",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
# versions 1 to 4: messages in a WITHOUT ROWID table, renamed by migrate() and copied
_OLD_MESSAGES = "messages_v4"


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the file open on ``conn`` (in a write transaction, at a version below
    :data:`SCHEMA_VERSION`) to this version; returns how many messages were copied into
    the version 5 ``messages`` table (0 for a new file or one already laid out so)."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'")
    found = row.fetchone()
    old = found is not None and "WITHOUT ROWID" in str(found[0]).upper()
    if old:
        conn.execute(f"ALTER TABLE messages RENAME TO {_OLD_MESSAGES}")
    for sql in SCHEMA:
        conn.execute(sql)
    if not old:
        return 0
    copied = conn.execute(
        "INSERT INTO messages (destination, seq, blob)"
        f" SELECT destination, seq, blob FROM {_OLD_MESSAGES} ORDER BY destination, seq"
    ).rowcount
    # Not zeroed page by page (SQLite as packaged may default to secure_delete, which wrote
    # every old page to the WAL: 9.0 s and 611 MB of WAL for 100k 1 KB messages, 1.4 s and
    # 141 MB without): their rows live on in the new table.
    (secure,) = conn.execute("PRAGMA secure_delete").fetchone()
    conn.execute("PRAGMA secure_delete = 0")
    try:
        conn.execute(f"DROP TABLE {_OLD_MESSAGES}")
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(secure)}")
    return int(copied)


_INSERT_MESSAGE = "INSERT OR REPLACE INTO messages (destination, seq, blob) VALUES (?, ?, ?)"
_DELETE_MESSAGE = "DELETE FROM messages WHERE destination = ? AND seq = ?"
_DELETE_MESSAGES = "DELETE FROM messages WHERE destination = ?"
_DELETE_DELIVERIES = "DELETE FROM deliveries WHERE destination = ?"
_SAVE_DESTINATION = (
    "INSERT OR REPLACE INTO destinations (destination, options, metadata) VALUES (?, ?, ?)"
)
_DELETE_DESTINATION = "DELETE FROM destinations WHERE destination = ?"
_DELETE_SEQUENCE = "DELETE FROM sequences WHERE destination = ?"
_RAISE_SEQUENCE = (
    "INSERT INTO sequences (destination, last_seq) VALUES (?, ?)"
    " ON CONFLICT (destination) DO UPDATE SET last_seq = max(last_seq, excluded.last_seq)"
)
_SAVE_BINDING = "INSERT OR IGNORE INTO bindings (destination, pattern) VALUES (?, ?)"
_DELETE_BINDING = "DELETE FROM bindings WHERE destination = ? AND pattern = ?"
_DELETE_BINDINGS = "DELETE FROM bindings WHERE destination = ?"
_KV_PUT = "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)"
_KV_DELETE = "DELETE FROM kv WHERE key = ?"
_SAVE_BATCH = "INSERT OR REPLACE INTO batches (key, expires, answer) VALUES (?, ?, ?)"
_FORGET_BATCHES = "DELETE FROM batches WHERE expires <= ?"
LOAD_BATCHES = "SELECT key, expires, answer FROM batches WHERE expires > ? ORDER BY expires"
_SAVE_CURSOR = "INSERT OR REPLACE INTO cursors (id, destination, record) VALUES (?, ?, ?)"
_DELETE_CURSOR = "DELETE FROM cursors WHERE id = ?"
LOAD_CURSORS = "SELECT id, destination, record FROM cursors ORDER BY id"
_SET_APPLIED = "INSERT OR REPLACE INTO replication (id, applied) VALUES (0, ?)"
LOAD_APPLIED = "SELECT applied FROM replication WHERE id = 0"

# a destination's messages after a seq, in order, with their delivery counts (or None)
LOAD_MESSAGES = (
    "SELECT m.seq, m.blob, d.count FROM messages m"
    " LEFT JOIN deliveries d ON d.destination = m.destination AND d.seq = m.seq"
    " WHERE m.destination = ? AND m.seq > ? ORDER BY m.seq"
)
# the same without delivery counts (None), for a store that has none (a single node's):
# half the cost of the read, which does not look up each message's count in vain
LOAD_MESSAGES_UNMARKED = (
    "SELECT seq, blob, NULL FROM messages WHERE destination = ? AND seq > ? ORDER BY seq"
)
ANY_DELIVERY = "SELECT 1 FROM deliveries LIMIT 1"
LOAD_DESTINATIONS = """
    SELECT d.destination, d.options, d.metadata, coalesce(s.last_seq, 0)
      FROM destinations d LEFT JOIN sequences s ON s.destination = d.destination
    UNION ALL
    SELECT s.destination, NULL, NULL, s.last_seq
      FROM sequences s
     WHERE NOT EXISTS (SELECT 1 FROM destinations d WHERE d.destination = s.destination)
       AND EXISTS (SELECT 1 FROM messages m WHERE m.destination = s.destination)
    ORDER BY 1
"""


class WriteKind(enum.IntEnum):
    """What a write does; the fields after it in the write's tuple are listed. Its number
    is what a log entry carries (they never change: logs written before must read)."""

    APPEND = enum.auto()  # destination, seq, blob
    APPEND_MANY = enum.auto()  # destination, [(seq, blob), ...]
    REMOVE = enum.auto()  # destination, [seq, ...]
    PURGE = enum.auto()  # destination
    SAVE_DESTINATION = enum.auto()  # destination, options JSON, metadata JSON
    DELETE_DESTINATION = enum.auto()  # destination
    SAVE_BINDINGS = enum.auto()  # destination, [pattern, ...]
    DELETE_BINDINGS = enum.auto()  # destination, [pattern, ...]
    KV_PUT = enum.auto()  # key, value
    KV_DELETE = enum.auto()  # key
    # seq, after, [write, ...]: one entry of the replicated log, its writes queued as (None,
    # kind, *fields), then ``replication.applied = seq``, all in one transaction; ``after``
    # (or None) is the entry that must be the last applied before it. Never in the log.
    APPLIED = enum.auto()
    # destination, [(seq, blob), ...], batch key, expires, answer: APPEND_MANY and the
    # idempotent batch it answers, which is remembered exactly when its messages are kept
    APPEND_BATCH = enum.auto()
    FORGET_BATCHES = enum.auto()  # before: drop the batches that expire by then
    SAVE_CURSOR = enum.auto()  # id, destination, record
    DELETE_CURSOR = enum.auto()  # id
    # destination, [seq, delivery count, seq, delivery count, ...]: messages delivered and
    # not yet settled, with their counts (a new leader flags them redelivered, and only
    # them); a message no longer stored (or removed later in the batch) is skipped
    DELIVERED = enum.auto()


# How many fields follow the kind, for the kinds a log entry may carry.
ARITY = {
    WriteKind.APPEND: 3,
    WriteKind.APPEND_MANY: 2,
    WriteKind.REMOVE: 2,
    WriteKind.PURGE: 1,
    WriteKind.SAVE_DESTINATION: 3,
    WriteKind.DELETE_DESTINATION: 1,
    WriteKind.SAVE_BINDINGS: 2,
    WriteKind.DELETE_BINDINGS: 2,
    WriteKind.KV_PUT: 2,
    WriteKind.KV_DELETE: 1,
    WriteKind.APPEND_BATCH: 5,
    WriteKind.FORGET_BATCHES: 1,
    WriteKind.SAVE_CURSOR: 3,
    WriteKind.DELETE_CURSOR: 1,
    WriteKind.DELIVERED: 2,
}


# A queued write is a flat tuple ``(future, kind, *fields)``, not an object: with tens of
# thousands in flight, every extra container per write is work for the garbage collector.
Queued = tuple[Any, ...]

APPEND = WriteKind.APPEND
APPEND_MANY = WriteKind.APPEND_MANY
APPEND_BATCH = WriteKind.APPEND_BATCH
REMOVE = WriteKind.REMOVE


# Messages are inserted and deleted with multi-row statements rather than ``executemany``:
# the sqlite3 module lets go of the GIL around every step, and with one step per row the
# writer thread and the event loop would hand the GIL to each other once per message.
_CHUNK = 256  # rows per statement at most (768 parameters, far below SQLite's limit)


@functools.cache
def _insert_sql(rows: int) -> str:
    values = ",".join(["(?,?,?)"] * rows)
    return f"INSERT OR REPLACE INTO messages (destination, seq, blob) VALUES {values}"


@functools.cache
def _mark_sql(rows: int) -> str:
    """Delivery counts for ``rows`` (seq, count) pairs, then the destination: a row for each
    message still stored, raised (never lowered) where there is one."""
    values = ",".join(["(?,?)"] * rows)
    return (
        "INSERT INTO deliveries (destination, seq, count)"
        f" SELECT m.destination, m.seq, v.column2 FROM (VALUES {values}) AS v"
        " JOIN messages m ON m.destination = ? AND m.seq = v.column1"
        " WHERE true"  # (an upsert's SELECT needs a WHERE: SQLite's parsing ambiguity)
        " ON CONFLICT (destination, seq) DO UPDATE SET count = max(count, excluded.count)"
    )


@functools.cache
def _delete_sql(seqs: int, table: str = "messages") -> str:
    return f"DELETE FROM {table} WHERE destination = ? AND seq IN ({','.join('?' * seqs)})"


_DELETE_RANGE = {
    table: f"DELETE FROM {table} WHERE destination = ? AND seq BETWEEN ? AND ?"
    for table in ("messages", "deliveries")
}
_RANGE = 16  # consecutive seqs at least, deleted as one range rather than in a list


def _ranges(seqs: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """``seqs`` as (first, last) runs of at least ``_RANGE`` consecutive seqs, and the
    seqs left over. Acks mostly come in the order of delivery, which is the queue's: one
    range (an index seek, then a scan) deletes what a list looks up one by one, at 60% of
    its cost (native_transient_queue's paging)."""
    ordered = sorted(set(seqs))
    if ordered and ordered[-1] - ordered[0] + 1 == len(ordered) >= _RANGE:
        return [(ordered[0], ordered[-1])], []  # (the common case: one run)
    runs: list[tuple[int, int]] = []
    rest: list[int] = []
    i, n = 0, len(ordered)
    while i < n:
        j = i + 1
        while j < n and ordered[j] == ordered[j - 1] + 1:
            j += 1
        if j - i >= _RANGE:
            runs.append((ordered[i], ordered[j - 1]))
        else:
            rest.extend(ordered[i:j])
        i = j
    return runs, rest


def _chunk_sizes(total: int) -> Iterator[int]:
    """Split ``total`` rows into statements of at most ``_CHUNK`` rows whose sizes are powers
    of two, so that only a few distinct statements are ever prepared."""
    size = _CHUNK
    while total:
        while size > total:
            size //= 2
        yield size
        total -= size


class _Run:
    """Neighbouring statements of one kind from a batch, executed together when the kind
    changes, so that the batch is applied in the order it was issued."""

    __slots__ = ("_conn", "_marked", "_rows", "_sql")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._sql: str | None = None
        self._rows: list[Any] = []
        # whether the deliveries table may have rows (None: not asked yet); a single node
        # never writes one, and its removals need not look there
        self._marked: bool | None = None

    def marked(self) -> None:
        """A delivery count was written: removals from now on drop theirs too."""
        self._marked = True

    def insert(self, destination: str, seq: int, blob: bytes) -> None:
        if self._sql != _INSERT_MESSAGE:
            self._switch(_INSERT_MESSAGE)
        rows = self._rows  # flat: destination, seq, blob, destination, ...
        rows.append(destination)
        rows.append(seq)
        rows.append(blob)

    def remove(self, destination: str, seqs: list[int]) -> None:
        if self._sql != _DELETE_MESSAGE:
            self._switch(_DELETE_MESSAGE)
        self._rows.append((destination, seqs))

    @property
    def conn(self) -> sqlite3.Connection:
        return self._conn

    def execute(self, sql: str, params: tuple[Any, ...]) -> None:
        if self._sql != sql:
            self._switch(sql)
        self._rows.append(params)

    def _switch(self, sql: str) -> None:
        self.flush()
        self._sql = sql

    def flush(self) -> None:
        sql, rows, conn = self._sql, self._rows, self._conn
        if sql is None:
            return
        if sql == _INSERT_MESSAGE:
            start = 0
            for size in _chunk_sizes(len(rows) // 3):
                conn.execute(_insert_sql(size), rows[start : start + 3 * size])
                start += 3 * size
        elif sql == _DELETE_MESSAGE:
            # Deletes commute, so a run of them may be regrouped by destination and range.
            by_destination: dict[str, list[int]] = {}
            for destination, seqs in rows:
                by_destination.setdefault(destination, []).extend(seqs)
            if self._marked is None:
                self._marked = conn.execute(ANY_DELIVERY).fetchone() is not None
            tables = ("messages", "deliveries") if self._marked else ("messages",)
            for destination, removed in by_destination.items():
                runs, seqs = _ranges(removed)
                for first, last in runs:
                    for table in tables:
                        conn.execute(_DELETE_RANGE[table], (destination, first, last))
                start = 0
                for size in _chunk_sizes(len(seqs)):
                    chunk = [destination, *seqs[start : start + size]]
                    for table in tables:
                        conn.execute(_delete_sql(size, table), chunk)
                    start += size
        else:
            conn.executemany(sql, rows)
        self._sql, self._rows = None, []


def apply_batch(conn: sqlite3.Connection, batch: list[Queued]) -> None:
    """Apply a batch in issue order; the sequence high-water marks go in last, one row per
    destination. A message that a later write of the same batch removes (its ack, a purge,
    its destination's deletion) is never inserted: the outcome is the same, without writing
    its body (acks often follow publishes within one group commit, and in a cluster within
    the entries a follower applies at once)."""
    run = _Run(conn)
    high: dict[str, int] = {}
    _apply(run, high, batch, _doomed(batch), _Applied(conn))
    run.flush()
    if high:
        conn.executemany(_RAISE_SEQUENCE, high.items())


def _flat(batch: list[Queued]) -> Iterator[Queued]:
    for write in batch:
        if write[1] is WriteKind.APPLIED:
            yield from _flat(write[4])
        else:
            yield write


# per write in a batch (by ``id()``), the seqs it names that a later write removes
Doomed = dict[int, set[int]]
_FIRST = operator.itemgetter(0)


def _doomed(batch: list[Queued]) -> Doomed:
    """The appends (and delivery marks) in ``batch`` of messages removed later in it, by id
    of the write: the seqs of each; empty at once when the batch removes nothing (the common
    case of a publish-only batch: no scan). Walked backwards, the removals seen so far are those
    after the write looked at, as one set of seqs per destination: a write that appends
    none of them costs one ``isdisjoint`` (a follower's batch removes older messages than
    those it appends), not a lookup per message."""
    writes = list(_flat(batch))
    for write in writes:
        kind = write[1]
        if kind is REMOVE or kind is WriteKind.PURGE or kind is WriteKind.DELETE_DESTINATION:
            break
    else:
        return {}
    doomed: Doomed = {}
    gone: dict[str, set[int]] = {}  # per destination: seqs removed after the write looked at
    wiped: set[str] = set()  # destinations purged or deleted after the write looked at
    for write in reversed(writes):
        kind = write[1]
        if kind is REMOVE:
            seqs = gone.get(write[2])
            if seqs is None:
                gone[write[2]] = set(write[3])
            else:
                seqs.update(write[3])
            continue
        if kind is WriteKind.PURGE or kind is WriteKind.DELETE_DESTINATION:
            wiped.add(write[2])
            continue
        if kind is APPEND:
            named: list[int] = [write[3]]
        elif kind is APPEND_MANY or kind is APPEND_BATCH:
            named = list(map(_FIRST, write[3]))
        elif kind is WriteKind.DELIVERED:
            named = write[3][::2]
        else:
            continue
        destination = write[2]
        if destination in wiped:
            doomed[id(write)] = set(named)
            continue
        seqs = gone.get(destination)
        if seqs is not None and not seqs.isdisjoint(named):
            doomed[id(write)] = seqs.intersection(named)
    return doomed


def _mark_delivered(run: _Run, destination: str, marks: dict[int, int]) -> None:
    """Raise the delivery counts of stored messages (a ``DELIVERED`` write, ``marks``: seq
    -> count) in the deliveries table, one statement per chunk; a message no longer stored
    (acked) gets none."""
    pairs: list[int] = []
    for seq, count in marks.items():
        pairs.append(seq)
        pairs.append(count)
    conn = run.conn
    start = 0
    for size in _chunk_sizes(len(marks)):
        conn.execute(_mark_sql(size), [*pairs[start : start + 2 * size], destination])
        start += 2 * size
    run.marked()


class _Applied:
    """The last log entry applied, as a batch of entries advances it: an entry that names
    the one it must follow (``after``) fails the batch if another was applied last, so a
    replica that failed to apply an entry never applies those queued behind it (no gap)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._seq: int | None = None

    def advance(self, seq: int, after: int | None) -> None:
        if after is not None:
            if self._seq is None:
                row = self._conn.execute(LOAD_APPLIED).fetchone()
                self._seq = 0 if row is None else int(row[0])
            if self._seq != after:
                raise sqlite3.IntegrityError(
                    f"log entry {seq} follows entry {after}, but {self._seq} was applied last"
                )
        self._seq = seq


def _apply(
    run: _Run,
    high: dict[str, int],
    batch: list[Queued],
    doomed: Doomed,
    applied: _Applied,
) -> None:
    for write in batch:
        kind = write[1]
        if kind is APPEND:
            _, _, destination, seq, blob = write
            skip = doomed.get(id(write))
            if skip is None or seq not in skip:
                run.insert(destination, seq, blob)
            if seq > high.get(destination, -1):
                high[destination] = seq
        elif kind is APPEND_MANY or kind is APPEND_BATCH:
            destination, rows = write[2], write[3]
            skip = doomed.get(id(write))
            for seq, blob in rows:
                if skip is None or seq not in skip:
                    run.insert(destination, seq, blob)
            if rows:
                top = max(map(_FIRST, rows))
                if top > high.get(destination, -1):
                    high[destination] = top
            if kind is APPEND_BATCH:
                run.execute(_SAVE_BATCH, write[4:])
        elif kind is REMOVE:
            run.remove(write[2], write[3])
        elif kind is WriteKind.PURGE:
            run.execute(_DELETE_MESSAGES, (write[2],))
            run.execute(_DELETE_DELIVERIES, (write[2],))
        elif kind is WriteKind.SAVE_DESTINATION:
            run.execute(_SAVE_DESTINATION, write[2:])
        elif kind is WriteKind.DELETE_DESTINATION:
            key = (write[2],)
            high.pop(write[2], None)
            run.execute(_DELETE_MESSAGES, key)
            run.execute(_DELETE_DELIVERIES, key)
            run.execute(_DELETE_DESTINATION, key)
            run.execute(_DELETE_SEQUENCE, key)
            run.execute(_DELETE_BINDINGS, key)
        elif kind is WriteKind.SAVE_BINDINGS:
            for pattern in write[3]:
                run.execute(_SAVE_BINDING, (write[2], pattern))
        elif kind is WriteKind.DELETE_BINDINGS:
            for pattern in write[3]:
                run.execute(_DELETE_BINDING, (write[2], pattern))
        elif kind is WriteKind.KV_PUT:
            run.execute(_KV_PUT, write[2:])
        elif kind is WriteKind.KV_DELETE:
            run.execute(_KV_DELETE, write[2:])
        elif kind is WriteKind.FORGET_BATCHES:
            run.execute(_FORGET_BATCHES, write[2:])
        elif kind is WriteKind.SAVE_CURSOR:
            run.execute(_SAVE_CURSOR, write[2:])
        elif kind is WriteKind.DELETE_CURSOR:
            run.execute(_DELETE_CURSOR, write[2:])
        elif kind is WriteKind.DELIVERED:
            marks = write[3]
            skip = doomed.get(id(write))
            wanted: dict[int, int] = {}
            for seq, count in zip(marks[::2], marks[1::2], strict=True):
                if (skip is None or seq not in skip) and count > wanted.get(seq, -1):
                    wanted[seq] = count
            if wanted:
                run.flush()  # (the messages' appends before it are in the table)
                _mark_delivered(run, write[2], wanted)
        elif kind is WriteKind.APPLIED:
            _, _, seq, after, writes = write
            applied.advance(seq, after)
            _apply(run, high, writes, doomed, applied)
            run.execute(_SET_APPLIED, (seq,))
        else:
            raise AssertionError(f"unknown write {kind!r}")
