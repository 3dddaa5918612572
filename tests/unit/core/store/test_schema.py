"""apply_batch: a batch applied at once leaves the SQLite file exactly as its writes applied
one at a time, though it never inserts a message that a later write of the batch removes."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from polymq.types import Message
from polymq_core.store.schema import LOAD_MESSAGES, SCHEMA, WriteKind, apply_batch

DESTS = ("queue/a", "queue/b")
SEQS = st.integers(min_value=1, max_value=6)


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for sql in SCHEMA:
        conn.execute(sql)
    return conn


def _dump(conn: sqlite3.Connection) -> dict[str, list[Any]]:
    return {
        table: sorted(conn.execute(f"SELECT * FROM {table}").fetchall())
        for table in ("messages", "deliveries", "sequences", "destinations", "replication")
    }


def _blob(seq: int, count: int = 0) -> bytes:
    message = Message(body=b"m", seq=seq, id=f"id{seq}", delivery_count=count)
    blob: bytes = msgpack.packb(message.to_wire(), use_bin_type=True)
    return blob


def _write() -> st.SearchStrategy[tuple[Any, ...]]:
    dest = st.sampled_from(DESTS)
    # a message's blob (its delivery count raised by a mark) or bytes that are none
    blob = st.one_of(
        st.binary(min_size=1, max_size=4),
        st.builds(_blob, SEQS, st.integers(min_value=0, max_value=3)),
    )
    marks = st.lists(st.tuples(SEQS, st.integers(min_value=1, max_value=4)), max_size=3)
    return st.one_of(
        st.tuples(
            st.none(),
            st.just(WriteKind.DELIVERED),
            dest,
            marks.map(lambda pairs: [n for pair in pairs for n in pair]),
        ),
        st.tuples(st.none(), st.just(WriteKind.APPEND), dest, SEQS, blob),
        st.tuples(
            st.none(),
            st.just(WriteKind.APPEND_MANY),
            dest,
            st.lists(st.tuples(SEQS, blob), min_size=1, max_size=3),
        ),
        st.tuples(st.none(), st.just(WriteKind.REMOVE), dest, st.lists(SEQS, max_size=3)),
        st.tuples(st.none(), st.just(WriteKind.PURGE), dest),
        st.tuples(st.none(), st.just(WriteKind.DELETE_DESTINATION), dest),
        st.tuples(
            st.none(), st.just(WriteKind.SAVE_DESTINATION), dest, st.just("{}"), st.just("{}")
        ),
    )


def _entries(writes: list[tuple[Any, ...]], cut: int) -> list[tuple[Any, ...]]:
    """The same writes as two replicated-log entries (APPLIED), split at ``cut``."""
    cut = min(cut, len(writes))
    return [
        (None, WriteKind.APPLIED, 1, 0, writes[:cut]),
        (None, WriteKind.APPLIED, 2, 1, writes[cut:]),
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(_write(), max_size=12), st.integers(min_value=0, max_value=12))
def test_a_batch_ends_as_its_writes_one_by_one(writes: list[tuple[Any, ...]], cut: int) -> None:
    one_by_one, at_once, as_entries = _db(), _db(), _db()
    for write in writes:
        apply_batch(one_by_one, [write])
    apply_batch(at_once, list(writes))
    assert _dump(at_once) == _dump(one_by_one)
    apply_batch(as_entries, _entries(list(writes), cut))
    expected = _dump(one_by_one)
    expected["replication"] = [(0, 2)]
    assert _dump(as_entries) == expected


def test_an_acked_message_is_never_written_but_its_sequence_is() -> None:
    conn = _db()
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    apply_batch(
        conn,
        [
            (None, WriteKind.APPEND_MANY, "queue/a", [(1, b"one"), (2, b"two")]),
            (None, WriteKind.REMOVE, "queue/a", [1]),
        ],
    )
    assert conn.execute("SELECT seq, blob FROM messages").fetchall() == [(2, b"two")]
    assert conn.execute("SELECT last_seq FROM sequences").fetchall() == [(2,)]
    inserts = [s for s in statements if s.startswith("INSERT OR REPLACE INTO messages")]
    assert len(inserts) == 1 and inserts[0].count("(") == 2  # one row: seq 2
    assert b"one".hex().upper() not in inserts[0].upper()


def test_messages_of_a_queue_purged_later_in_the_batch_are_never_written() -> None:
    conn = _db()
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    apply_batch(
        conn,
        [
            (None, WriteKind.APPEND, "queue/a", 1, b"one"),
            (None, WriteKind.APPEND, "queue/b", 1, b"kept"),
            (None, WriteKind.PURGE, "queue/a"),
            (None, WriteKind.APPEND, "queue/a", 2, b"two"),  # after the purge: written
        ],
    )
    rows = conn.execute("SELECT destination, seq, blob FROM messages ORDER BY destination")
    assert rows.fetchall() == [("queue/a", 2, b"two"), ("queue/b", 1, b"kept")]
    inserts = " ".join(s for s in statements if s.startswith("INSERT OR REPLACE INTO messages"))
    assert b"one".hex().upper() not in inserts.upper()
    assert b"two".hex().upper() in inserts.upper() and b"kept".hex().upper() in inserts.upper()


def _counts(conn: sqlite3.Connection, destination: str = "queue/a") -> dict[int, int]:
    """Each stored message's delivery count as a load reads it: the blob's, or the
    deliveries table's where that is higher."""
    counts = {}
    for seq, blob, marked in conn.execute(LOAD_MESSAGES, (destination, 0)):
        count = Message.from_wire(msgpack.unpackb(blob)).delivery_count
        counts[seq] = count if marked is None else max(count, marked)
    return counts


def test_a_delivery_mark_raises_the_stored_count_and_skips_what_is_acked() -> None:
    conn = _db()
    apply_batch(
        conn,
        [
            (None, WriteKind.APPEND_MANY, "queue/a", [(s, _blob(s)) for s in (1, 2)]),
            (None, WriteKind.APPEND, "queue/a", 3, _blob(3, 5)),
            # 1 delivered and still out, 2 delivered and acked in the same batch, 3 marked
            # with a lower count than it has, 9 not stored
            (None, WriteKind.DELIVERED, "queue/a", [1, 1, 2, 1, 3, 2, 9, 1]),
            (None, WriteKind.REMOVE, "queue/a", [2]),
        ],
    )
    assert _counts(conn) == {1: 1, 3: 5}
    assert conn.execute("SELECT seq, count FROM deliveries").fetchall() == [(1, 1), (3, 2)]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    apply_batch(
        conn,
        [
            (None, WriteKind.DELIVERED, "queue/a", [1, 2]),
            (None, WriteKind.DELIVERED, "queue/a", [3, 6]),
            (None, WriteKind.REMOVE, "queue/a", [3]),  # acked: its mark is never applied
        ],
    )
    assert _counts(conn) == {1: 2}
    marks = [s for s in statements if s.startswith("INSERT INTO deliveries")]
    assert len(marks) == 1 and "VALUES (1,2)" in marks[0]  # one row: 3's mark skipped
    # a mark writes its count beside the message, never the message again
    assert not [s for s in statements if s.startswith(("UPDATE messages", "INSERT OR REPLACE"))]
    assert conn.execute("SELECT seq, count FROM deliveries").fetchall() == [(1, 2)]


def test_a_count_kept_in_the_blob_by_schema_5_still_counts() -> None:
    conn = _db()
    apply_batch(conn, [(None, WriteKind.APPEND_MANY, "queue/a", [(1, _blob(1, 4)), (2, _blob(2))])])
    apply_batch(conn, [(None, WriteKind.DELIVERED, "queue/a", [1, 2, 2, 1])])
    assert _counts(conn) == {1: 4, 2: 1}  # the higher of the blob's and the mark's


def test_a_message_taken_away_takes_its_delivery_count_with_it() -> None:
    conn = _db()
    rows = [(s, _blob(s)) for s in (1, 2, 3)]
    for dest in ("queue/a", "queue/b", "queue/c"):
        apply_batch(conn, [(None, WriteKind.APPEND_MANY, dest, rows)])
        apply_batch(conn, [(None, WriteKind.DELIVERED, dest, [1, 1, 2, 1, 3, 1])])
    apply_batch(conn, [(None, WriteKind.REMOVE, "queue/a", [1, 3])])
    apply_batch(conn, [(None, WriteKind.PURGE, "queue/b")])
    apply_batch(conn, [(None, WriteKind.DELETE_DESTINATION, "queue/c")])
    left = conn.execute("SELECT destination, seq FROM deliveries").fetchall()
    assert left == [("queue/a", 2)]


def test_removals_do_not_look_for_delivery_counts_where_none_was_written() -> None:
    """A single node never marks a delivery: its acks delete from messages alone."""
    conn = _db()
    apply_batch(conn, [(None, WriteKind.APPEND_MANY, "queue/a", [(1, _blob(1)), (2, _blob(2))])])
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    apply_batch(conn, [(None, WriteKind.REMOVE, "queue/a", [1])])
    assert not [s for s in statements if s.startswith("DELETE FROM deliveries")]
    apply_batch(conn, [(None, WriteKind.DELIVERED, "queue/a", [2, 1])])
    apply_batch(conn, [(None, WriteKind.REMOVE, "queue/a", [2])])
    assert [s for s in statements if s.startswith("DELETE FROM deliveries")]
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)


def test_the_highest_of_two_marks_of_a_message_in_one_write_is_kept() -> None:
    conn = _db()
    apply_batch(conn, [(None, WriteKind.APPEND, "queue/a", 1, _blob(1))])
    apply_batch(conn, [(None, WriteKind.DELIVERED, "queue/a", [1, 3, 1, 2])])
    assert _counts(conn) == {1: 3}


def test_a_run_of_acks_is_removed_as_one_range_and_exactly_it() -> None:
    """Consecutive seqs (acks in delivery order) are deleted by one range per run, with
    their delivery counts; seqs around the runs, other queues' and a run too short for a
    range are removed one by one, and nothing else is."""
    conn = _db()
    appends = [(seq, _blob(seq)) for seq in range(1, 101)]
    apply_batch(
        conn,
        [
            (None, WriteKind.APPEND_MANY, "queue/a", appends),
            (None, WriteKind.APPEND_MANY, "queue/b", appends),
            (None, WriteKind.DELIVERED, "queue/a", [21, 1, 22, 1, 50, 2, 90, 1]),
        ],
    )
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    gone_a = [*range(40, 20, -1), 30, 45, *range(60, 70), *range(70, 91)]  # (out of order)
    apply_batch(
        conn,
        [
            (None, WriteKind.REMOVE, "queue/a", gone_a[:25]),
            (None, WriteKind.REMOVE, "queue/b", [5, *range(10, 30)]),
            (None, WriteKind.REMOVE, "queue/a", gone_a[25:]),
        ],
    )
    ranges = [s for s in statements if "BETWEEN" in s]
    assert sorted(ranges) == sorted(
        [
            "DELETE FROM messages WHERE destination = 'queue/a' AND seq BETWEEN 21 AND 40",
            "DELETE FROM deliveries WHERE destination = 'queue/a' AND seq BETWEEN 21 AND 40",
            "DELETE FROM messages WHERE destination = 'queue/a' AND seq BETWEEN 60 AND 90",
            "DELETE FROM deliveries WHERE destination = 'queue/a' AND seq BETWEEN 60 AND 90",
            "DELETE FROM messages WHERE destination = 'queue/b' AND seq BETWEEN 10 AND 29",
            "DELETE FROM deliveries WHERE destination = 'queue/b' AND seq BETWEEN 10 AND 29",
        ]
    )
    left = conn.execute("SELECT destination, seq FROM messages ORDER BY destination, seq")
    assert left.fetchall() == [
        *(("queue/a", s) for s in range(1, 101) if s not in gone_a),
        *(("queue/b", s) for s in range(1, 101) if s != 5 and not 10 <= s < 30),
    ]
    marks = conn.execute("SELECT destination, seq, count FROM deliveries").fetchall()
    assert marks == [("queue/a", 50, 2)]
