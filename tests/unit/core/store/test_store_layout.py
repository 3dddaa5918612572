"""The SQLite layout of the messages table (schema version 5: a rowid table): what a 1 KB
message takes on disk, and the migration of a version 4 file (WITHOUT ROWID) to it."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import msgpack
import pytest

from polymq.types import Message
from polymq_core.store.contract import DestinationRecord
from polymq_core.store.schema import SCHEMA_VERSION
from polymq_core.store.writes import Append, AppendMany, MarkDelivered, Remove

from .test_store import _V2_SCHEMA, Q, full_message, opened, settled, small_message

OTHER = "queue/other"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shard.db"


def kilobyte_message(seq: int, destination: str = Q) -> Message:
    return Message(
        body=seq.to_bytes(8, "big") + b"x" * 1016, persistent=True, seq=seq, destination=destination
    )


def big_message(seq: int, destination: str = Q) -> Message:
    """Past a 4 KiB page: its row overflows in either layout."""
    return Message(body=b"b" * 5000, persistent=True, seq=seq, destination=destination)


def _messages_sql(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()
        return str(row[0])


async def test_a_1_kb_message_takes_less_than_2_kb_on_disk(db: Path) -> None:
    """A WITHOUT ROWID table (version 4) put each such row's tail in an overflow page of its
    own: 4.7 KB a message."""
    count = 2000
    async with opened(db) as store:
        for lo in range(1, count + 1, 500):
            await settled(
                store.write(AppendMany(Q, [kilobyte_message(s) for s in range(lo, lo + 500)]))
            )
        assert len(await store.load_page(Q, 0, count)) == count
    assert _file_bytes(db) / count < 2000


def _file_bytes(db: Path) -> int:
    """The store's size once closed: the WAL was checkpointed into the file and removed."""
    assert not db.with_name(db.name + "-wal").exists()
    return db.stat().st_size


_V4_SCHEMA = (  # version 2's tables and those of versions 3 and 4
    *_V2_SCHEMA[:-1],
    "CREATE TABLE replication (id INTEGER PRIMARY KEY CHECK (id = 0), applied INTEGER NOT NULL)",
    "CREATE TABLE batches (key TEXT PRIMARY KEY, expires REAL NOT NULL, answer BLOB NOT NULL)"
    " WITHOUT ROWID",
    "CREATE INDEX batches_expires ON batches (expires)",
    "CREATE TABLE cursors (id TEXT PRIMARY KEY, destination TEXT NOT NULL, record BLOB NOT NULL)"
    " WITHOUT ROWID",
    "PRAGMA user_version = 4",
)


async def test_a_version_4_file_is_migrated_and_keeps_its_data(db: Path) -> None:
    """Its messages (of every size, in two queues) are copied into the rowid table in seq
    order; everything else stays; the store then appends, removes and pages as usual."""
    ours = [full_message(3), kilobyte_message(5), big_message(9)]
    theirs = [kilobyte_message(s, OTHER) for s in (1, 2)]
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for sql in _V4_SCHEMA:
            conn.execute(sql)
        for m in ours + theirs:
            blob = msgpack.packb(m.to_wire(), use_bin_type=True)
            conn.execute("INSERT INTO messages VALUES (?, ?, ?)", (m.destination, m.seq, blob))
        conn.execute("INSERT INTO destinations VALUES (?, '{}', '{}')", (Q,))
        conn.execute("INSERT INTO sequences VALUES (?, 9), (?, 2)", (Q, OTHER))
        conn.execute("INSERT INTO bindings VALUES (?, 'a.*')", (Q,))
        conn.execute("INSERT INTO replication VALUES (0, 7)")
        conn.execute("INSERT INTO batches VALUES ('b', 2e9, x'01')")
        conn.execute("INSERT INTO cursors VALUES ('c', ?, x'02')", (Q,))

    async with opened(db) as store:
        assert await store.load_messages(Q) == ours
        assert await store.load_messages(OTHER) == theirs
        assert await store.load_destinations() == [
            DestinationRecord(Q, {}, {}, 9),
            DestinationRecord(OTHER, {}, {}, 2),
        ]
        assert await store.load_bindings() == [(Q, "a.*")]
        assert await store.applied() == 7
        assert await store.load_batches(0.0) == [("b", 2e9, b"\x01")]
        assert await store.load_cursors() == [("c", Q, b"\x02")]
        assert await store.measure_messages(Q, 3) == (
            2,
            sum(len(msgpack.packb(m.to_wire(), use_bin_type=True)) for m in ours[1:]),
        )
        await settled(store.write(Append(Q, small_message(10))), store.write(Remove(Q, [5])))
        await settled(store.write(Append(Q, small_message(10))))  # replaced, not doubled
    assert "WITHOUT ROWID" not in _messages_sql(db).upper()
    async with opened(db) as store:
        assert await store.load_page(Q, 3, 10) == [big_message(9), small_message(10)]
        assert await store.count_messages(OTHER) == 2
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "messages_v4" not in names


_V5_SCHEMA = (  # version 4's tables, messages in a rowid table
    *(sql for sql in _V4_SCHEMA[:-1] if not sql.startswith("CREATE TABLE messages")),
    "CREATE TABLE messages (destination TEXT NOT NULL, seq INTEGER NOT NULL,"
    " blob BLOB NOT NULL, UNIQUE (destination, seq))",
    "PRAGMA user_version = 5",
)


async def test_a_version_5_file_gets_its_deliveries_table_and_keeps_its_counts(db: Path) -> None:
    """Version 5 kept a delivery count in the message's blob: still read, and a mark after
    the migration raises it (never lowers it)."""
    marked = [kilobyte_message(s) for s in (1, 2, 3)]
    for m, count in zip(marked, (2, 0, 5), strict=True):
        m.delivery_count = count
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for sql in _V5_SCHEMA:
            conn.execute(sql)
        for m in marked:
            blob = msgpack.packb(m.to_wire(), use_bin_type=True)
            conn.execute("INSERT INTO messages VALUES (?, ?, ?)", (m.destination, m.seq, blob))
        conn.execute("INSERT INTO sequences VALUES (?, 3)", (Q,))
    async with opened(db) as store:
        assert await store.load_messages(Q) == marked
        await settled(store.write(MarkDelivered(Q, [(1, 1), (2, 1), (3, 6)])))
        assert [m.delivery_count for m in await store.load_messages(Q)] == [2, 1, 6]
        assert [m.delivery_count for m in await store.load_page(Q, 1, 1)] == [1]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        rows = conn.execute("SELECT seq, count FROM deliveries ORDER BY seq").fetchall()
        assert rows == [(1, 1), (2, 1), (3, 6)]


async def test_a_long_backlog_is_counted_and_its_size_estimated_from_its_start(db: Path) -> None:
    """measure_messages (a restart, past a queue's window) counts every message but sums
    the size of the first 1000 only (reading every record is reading the whole backlog)."""
    async with opened(db) as store:
        await settled(store.write(AppendMany(Q, [small_message(s) for s in range(1, 1101)])))
        await settled(store.write(AppendMany(Q, [kilobyte_message(s) for s in range(1101, 1601)])))
        count, size = await store.measure_messages(Q, 100)
        first = sum(len(_blob(small_message(s))) for s in range(101, 1101))
        assert (count, size) == (1500, first * 1500 // 1000)
        last = sum(len(_blob(kilobyte_message(s))) for s in range(1591, 1601))
        assert await store.measure_messages(Q, 1590) == (10, last)  # all measured
        assert await store.measure_messages(Q, 1600) == (0, 0)


def _blob(message: Message) -> bytes:
    return bytes(msgpack.packb(message.to_wire(), use_bin_type=True))
