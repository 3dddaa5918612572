"""Tests of ``polymq_core.store.sqlite`` (and the ``polymq_core.store.contract`` contract): what a
shard observes of its SqliteStore.

Durability is checked by reopening the file (and once by killing a writer process with
SIGKILL), never by looking at in-memory state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

import polymq.types
import polymq_core.store.contract
import polymq_core.store.sqlite
from polymq.types import WIRE_FIELDS, Message
from polymq_core.store import writes
from polymq_core.store.contract import DestinationRecord, StoreError
from polymq_core.store.logentry import encode_entry
from polymq_core.store.schema import SCHEMA_VERSION, WriteKind
from polymq_core.store.sqlite import SqliteStore
from polymq_core.store.writes import (
    Append,
    AppendBatch,
    AppendMany,
    DeleteBindings,
    DeleteCursor,
    DeleteDestination,
    DeleteValue,
    ForgetBatches,
    MarkDelivered,
    PurgeMessages,
    Remove,
    SaveBindings,
    SaveCursor,
    SaveDestination,
    SaveValue,
    Write,
)

Q = "queue/orders"
DEADLINE = 10.0  # seconds; a write that takes longer than this is hanging


def full_message(seq: int, destination: str = Q) -> Message:
    """A message with every field away from its default."""
    return Message(
        body=bytes(range(256)) + seq.to_bytes(4, "big"),
        content_type="application/json; charset=utf-8",
        headers={"x-trace": f"t-{seq}", "ünïcode": "✓ \x00"},
        priority=9,
        persistent=True,
        expires=1_900_000_000.25,
        ack_timeout=12.5,
        correlation_id=f"corr-{seq}",
        reply_to="queue/replies",
        id=f"msg-{seq}",
        seq=seq,
        timestamp=1_700_000_000.123456,
        delivery_count=3,
        destination=destination,
    )


def small_message(seq: int, destination: str = Q) -> Message:
    return Message(body=b"x" * 32, persistent=True, seq=seq, destination=destination)


@contextlib.asynccontextmanager
async def opened(path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(path)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shard.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[SqliteStore]:
    async with opened(db) as store:
        yield store


@contextlib.asynccontextmanager
async def writer_held(store: SqliteStore, db: Path) -> AsyncIterator[None]:
    """Keep the store's writer thread waiting for SQLite's write lock, so that every write
    issued inside the block is queued and lands in one batch when the block ends."""
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    plug = store.write(SaveValue("test:plug", b""))
    await asyncio.sleep(0.1)  # the writer takes the plug and waits behind the lock
    try:
        yield
    finally:
        blocker.execute("COMMIT")
        blocker.close()
        await asyncio.gather(plug, return_exceptions=True)


async def settled(*futures: asyncio.Future[None]) -> None:
    await asyncio.wait_for(asyncio.gather(*futures), DEADLINE)


# -- messages -----------------------------------------------------------------------------------


async def test_every_message_field_survives_a_reopen(db: Path) -> None:
    full, bare = full_message(1), Message(body=b"", seq=2)
    for name in WIRE_FIELDS:  # the test is only as good as the fields it varies
        if name != "seq":
            assert getattr(full, name) != getattr(bare, name), name
    async with opened(db) as store:
        await settled(store.write(Append(Q, full)), store.write(Append(Q, bare)))

    async with opened(db) as store:
        loaded = await store.load_messages(Q)

    assert loaded == [full, bare]
    assert type(loaded[0].body) is bytes
    assert loaded[1].expires is None and loaded[1].correlation_id is None


async def test_messages_load_in_seq_order_per_destination(store: SqliteStore) -> None:
    await settled(
        store.write(Append(Q, small_message(5))),
        store.write(Append(Q, small_message(1))),
        store.write(Append("stream/other", small_message(2, "stream/other"))),
        store.write(Append(Q, small_message(3))),
    )

    assert [m.seq for m in await store.load_messages(Q)] == [1, 3, 5]
    assert [m.seq for m in await store.load_messages("stream/other")] == [2]
    assert await store.load_messages("queue/unknown") == []
    assert await store.count_messages(Q) == 3
    assert await store.count_messages("queue/unknown") == 0


async def test_append_many_stores_all_and_an_empty_one_resolves(store: SqliteStore) -> None:
    await settled(store.write(AppendMany(Q, [full_message(s) for s in (3, 1, 2)])))
    await settled(store.write(AppendMany(Q, [])))

    assert await store.load_messages(Q) == [full_message(s) for s in (1, 2, 3)]


async def test_append_of_a_stored_seq_replaces_it(store: SqliteStore) -> None:
    first = full_message(1)
    again = dataclasses.replace(first, delivery_count=4)
    await settled(store.write(Append(Q, first)))
    await settled(store.write(Append(Q, again)))

    assert await store.load_messages(Q) == [again]


async def test_append_stores_the_message_as_it_was_when_called(store: SqliteStore) -> None:
    message = full_message(1)
    future = store.write(Append(Q, message))
    message.delivery_count = 99
    message.headers["late"] = "change"
    await settled(future)

    assert await store.load_messages(Q) == [full_message(1)]


async def test_remove_deletes_the_seqs_and_ignores_missing_ones(store: SqliteStore) -> None:
    await settled(store.write(AppendMany(Q, [small_message(s) for s in range(1, 6)])))

    await settled(store.write(Remove(Q, [2, 4, 99])), store.write(Remove("queue/unknown", [1])))

    assert [m.seq for m in await store.load_messages(Q)] == [1, 3, 5]


async def test_purge_empties_one_destination_and_keeps_its_record(store: SqliteStore) -> None:
    await settled(
        store.write(SaveDestination(Q, {"durable": True}, {"owner": "a"})),
        store.write(AppendMany(Q, [small_message(s) for s in range(1, 4)])),
        store.write(Append("queue/kept", small_message(1, "queue/kept"))),
    )

    await settled(store.write(PurgeMessages(Q)))

    assert await store.count_messages(Q) == 0
    assert await store.count_messages("queue/kept") == 1
    assert await store.load_destinations() == [
        DestinationRecord("queue/kept", {}, {}, last_seq=1),
        DestinationRecord(Q, {"durable": True}, {"owner": "a"}, last_seq=3),
    ]


async def test_delete_destination_forgets_record_messages_and_last_seq(
    store: SqliteStore,
) -> None:
    await settled(
        store.write(SaveDestination(Q, {"durable": True}, {})),
        store.write(AppendMany(Q, [small_message(s) for s in range(1, 4)])),
        store.write(SaveDestination("queue/kept", {}, {})),
        store.write(Append("queue/kept", small_message(7, "queue/kept"))),
    )

    await settled(store.write(DeleteDestination(Q)))

    assert await store.load_messages(Q) == []
    assert await store.load_destinations() == [DestinationRecord("queue/kept", {}, {}, 7)]
    await settled(store.write(SaveDestination(Q, {}, {})))
    assert (await store.load_destinations())[1] == DestinationRecord(Q, {}, {}, last_seq=0)


# -- destinations and kv ------------------------------------------------------------------------


async def test_load_destinations_after_reopen(db: Path) -> None:
    options: dict[str, Any] = {"durable": True, "max_length": 10, "nested": {"a": [1, 2.5]}}
    async with opened(db) as store:
        await settled(
            store.write(SaveDestination(Q, {"old": 1}, {"old": "x"})),
            store.write(SaveDestination("queue/empty", {}, {"k": "v"})),
            store.write(AppendMany(Q, [small_message(s) for s in range(1, 5)])),
            store.write(Append("stream/unsaved", small_message(7, "stream/unsaved"))),
            store.write(Append("queue/acked", small_message(1, "queue/acked"))),
        )
        await settled(
            store.write(SaveDestination(Q, options, {"owner": "alice"})),  # an upsert
            store.write(Remove(Q, [1, 2, 3, 4])),  # last_seq is the highest ever stored
            store.write(Remove("queue/acked", [1])),  # no record and no messages: not listed
        )

    async with opened(db) as store:
        records = await store.load_destinations()

    assert records == [  # ordered by name
        DestinationRecord("queue/empty", {}, {"k": "v"}, last_seq=0),
        DestinationRecord(Q, options, {"owner": "alice"}, last_seq=4),
        DestinationRecord("stream/unsaved", {}, {}, last_seq=7),
    ]


async def test_kv_put_get_delete(db: Path) -> None:
    async with opened(db) as store:
        assert await store.kv_get("k") is None
        await settled(
            store.write(SaveValue("k", b"one")), store.write(SaveValue("bin", b"\x00\xff\x00"))
        )
        assert await store.kv_get("k") == b"one"
        await settled(store.write(SaveValue("k", b"two")))
        assert await store.kv_get("k") == b"two"
        await settled(store.write(DeleteValue("k")), store.write(DeleteValue("never-set")))
        assert await store.kv_get("k") is None

    async with opened(db) as store:
        assert await store.kv_get("bin") == b"\x00\xff\x00"
        assert await store.kv_get("k") is None


# -- bindings -----------------------------------------------------------------------------------


async def test_bindings_are_saved_deleted_and_loaded_after_reopen(db: Path) -> None:
    async with opened(db) as store:
        assert await store.load_bindings() == []
        await settled(
            store.write(SaveBindings(Q, ["orders.#", "orders.*.eu"])),
            store.write(SaveBindings("queue/audit", ["#"])),
            store.write(SaveBindings(Q, ["orders.#"])),  # again: no error, no duplicate
        )
        await settled(
            store.write(DeleteBindings(Q, ["orders.*.eu", "never.bound"])),
            store.write(SaveBindings(Q, ["ord*"])),
        )
    async with opened(db) as store:
        assert await store.load_bindings() == [
            ("queue/audit", "#"),
            (Q, "ord*"),
            (Q, "orders.#"),
        ]


async def test_delete_destination_drops_its_bindings(store: SqliteStore) -> None:
    await settled(
        store.write(SaveDestination(Q, {"durable": True}, {})),
        store.write(SaveBindings(Q, ["a.#", "b"])),
        store.write(SaveBindings("queue/kept", ["a.#"])),
    )
    await settled(store.write(DeleteDestination(Q)))
    assert await store.load_bindings() == [("queue/kept", "a.#")]


_V1_SCHEMA = (
    "CREATE TABLE messages (destination TEXT NOT NULL, seq INTEGER NOT NULL, blob BLOB NOT NULL,"
    " PRIMARY KEY (destination, seq)) WITHOUT ROWID",
    "CREATE TABLE destinations (destination TEXT PRIMARY KEY, options TEXT NOT NULL,"
    " metadata TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE sequences (destination TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)"
    " WITHOUT ROWID",
    "CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID",
    "PRAGMA user_version = 1",
)


async def test_a_version_1_file_is_migrated_and_keeps_its_data(db: Path) -> None:
    """A data file written before bindings existed opens, keeps everything and gains them."""
    message = full_message(3)
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for sql in _V1_SCHEMA:
            conn.execute(sql)
        blob = msgpack.packb(message.to_wire(), use_bin_type=True)
        conn.execute("INSERT INTO messages VALUES (?, 3, ?)", (Q, blob))
        conn.execute("INSERT INTO destinations VALUES (?, ?, '{}')", (Q, '{"durable": true}'))
        conn.execute("INSERT INTO sequences VALUES (?, 3)", (Q,))
        conn.execute("INSERT INTO kv VALUES ('k', x'00ff')")

    async with opened(db) as store:
        assert await store.load_destinations() == [DestinationRecord(Q, {"durable": True}, {}, 3)]
        assert await store.load_messages(Q) == [message]
        assert await store.kv_get("k") == b"\x00\xff"
        assert await store.load_bindings() == []
        await settled(store.write(SaveBindings(Q, ["a.*"])))
    async with opened(db) as store:
        assert await store.load_bindings() == [(Q, "a.*")]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_file_of_a_newer_schema_is_refused(db: Path) -> None:
    newer = SCHEMA_VERSION + 1
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute(f"PRAGMA user_version = {newer}")
    store = SqliteStore(db)
    with pytest.raises(StoreError, match=f"schema version {newer}"):
        await store.open()


# -- group commit and ordering ------------------------------------------------------------------


async def test_concurrent_appends_share_commits(store: SqliteStore) -> None:
    commits: list[tuple[float, int, int]] = []
    store.on_commit = lambda seconds, n: commits.append((seconds, n, threading.get_ident()))

    await settled(*[store.write(Append(Q, small_message(s))) for s in range(1, 1001)])

    assert sum(n for _, n, _ in commits) == 1000
    assert len(commits) < 100, [n for _, n, _ in commits]
    assert {ident for _, _, ident in commits} == {threading.get_ident()}  # on the loop
    assert all(seconds > 0 for seconds, _, _ in commits)
    assert await store.count_messages(Q) == 1000


async def test_one_batch_applies_its_writes_in_issue_order(db: Path, store: SqliteStore) -> None:
    sizes: list[int] = []
    store.on_commit = lambda seconds, n: sizes.append(n)

    async with writer_held(store, db):
        futures = [
            store.write(Append(Q, small_message(1))),
            store.write(Remove(Q, [1])),
            store.write(Append(Q, small_message(2))),
            store.write(Append("queue/gone", small_message(5, "queue/gone"))),
            store.write(DeleteDestination("queue/gone")),
            store.write(Append("queue/gone", small_message(1, "queue/gone"))),
            store.write(AppendMany("queue/p", [small_message(s, "queue/p") for s in (1, 2)])),
            store.write(PurgeMessages("queue/p")),
            store.write(Append("queue/p", small_message(3, "queue/p"))),
            store.write(SaveDestination(Q, {"v": 1}, {})),
            store.write(SaveDestination(Q, {"v": 2}, {})),
            store.write(SaveValue("k", b"v")),
            store.write(DeleteValue("k")),
            store.write(DeleteValue("k2")),
            store.write(SaveValue("k2", b"v2")),
        ]
    await settled(*futures)

    assert max(sizes) >= len(futures)  # they did share one commit
    assert [m.seq for m in await store.load_messages(Q)] == [2]
    assert [m.seq for m in await store.load_messages("queue/gone")] == [1]
    assert [m.seq for m in await store.load_messages("queue/p")] == [3]
    assert await store.kv_get("k") is None
    assert await store.kv_get("k2") == b"v2"
    assert await store.load_destinations() == [
        DestinationRecord("queue/gone", {}, {}, last_seq=1),
        DestinationRecord(Q, {"v": 2}, {}, last_seq=2),
        DestinationRecord("queue/p", {}, {}, last_seq=3),
    ]


async def test_a_cancelled_write_is_made_and_does_not_stall_its_batch(
    db: Path, store: SqliteStore
) -> None:
    async with writer_held(store, db):
        cancelled = store.write(Append(Q, small_message(1)))
        cancelled.cancel()
        after = store.write(Append(Q, small_message(2)))
    await settled(after)

    assert [m.seq for m in await store.load_messages(Q)] == [1, 2]


async def test_a_failing_on_commit_hook_is_logged_and_ignored(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    def hook(seconds: float, n: int) -> None:
        raise RuntimeError("sensor broke")

    store.on_commit = hook
    with caplog.at_level(logging.ERROR, logger=polymq_core.store.sqlite.__name__):
        await settled(store.write(Append(Q, small_message(1))))
        await settled(store.write(Append(Q, small_message(2))))

    assert await store.count_messages(Q) == 2
    assert any("on_commit" in r.getMessage() for r in caplog.records)


# -- lifecycle and failures ---------------------------------------------------------------------


async def test_close_waits_for_pending_writes(db: Path) -> None:
    store = SqliteStore(db)
    await store.open()
    futures = [store.write(Append(Q, small_message(s))) for s in range(1, 501)]
    futures.append(store.write(SaveValue("k", b"v")))

    first = asyncio.create_task(store.close())
    await asyncio.sleep(0)  # the first close is under way
    await asyncio.wait_for(store.close(), DEADLINE)  # a second close waits for the first

    assert all(f.done() and f.result() is None for f in futures)
    await first
    async with opened(db) as store:
        assert await store.count_messages(Q) == 500
        assert await store.kv_get("k") == b"v"


def _calls(store: SqliteStore) -> list[Callable[[], Any]]:
    return [
        *[functools.partial(store.write, write) for write in WRITES],
        lambda: store.kv_get("k"),
        lambda: store.load_destinations(),
        lambda: store.load_messages(Q),
        lambda: store.count_messages(Q),
    ]


async def test_calls_after_close_or_before_open_raise_store_error(db: Path) -> None:
    never_opened = SqliteStore(db)
    closed = SqliteStore(db)
    await closed.open()
    await closed.close()
    await closed.close()  # closing twice is harmless

    for store in (never_opened, closed):
        for call in _calls(store):
            with pytest.raises(StoreError):
                await call()  # raised at once or through the future: either is a refusal

    async with opened(db) as store:
        assert await store.load_destinations() == []
        assert await store.kv_get("k") is None


async def test_a_failing_batch_fails_every_write_in_it_and_later_batches_work(
    db: Path, store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    await settled(store.write(Append(Q, small_message(1))))
    saboteur = sqlite3.connect(db, isolation_level=None)
    saboteur.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON messages"
        " BEGIN SELECT RAISE(ABORT, 'disk is full'); END"
    )

    with caplog.at_level(logging.ERROR, logger=polymq_core.store.sqlite.__name__):
        async with writer_held(store, db):
            doomed = [store.write(Append(Q, small_message(2))), store.write(SaveValue("k", b"v"))]
        results = await asyncio.wait_for(asyncio.gather(*doomed, return_exceptions=True), DEADLINE)

    for result in results:
        assert isinstance(result, StoreError), result
        assert isinstance(result.__cause__, sqlite3.Error)
        assert "disk is full" in str(result)
    assert any(r.levelno == logging.ERROR and "failed" in r.getMessage() for r in caplog.records)
    assert await store.kv_get("k") is None  # the batch was rolled back as a whole

    saboteur.execute("DROP TRIGGER refuse")
    saboteur.close()
    await settled(store.write(Append(Q, small_message(3))))
    assert [m.seq for m in await store.load_messages(Q)] == [1, 3]


async def test_open_creates_the_directory_and_uses_wal(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "shard.db"
    async with opened(db) as store:
        await settled(store.write(Append(Q, small_message(1))))

    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.fixture
def corrupt_db(db: Path) -> Path:
    db.write_bytes(b"this is not a database" * 100)
    return db


async def test_open_of_a_corrupt_file_raises_store_error(corrupt_db: Path) -> None:
    store = SqliteStore(corrupt_db)

    with pytest.raises(StoreError) as info:
        await store.open()

    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


def test_bad_settings_are_refused(db: Path) -> None:
    with pytest.raises(ValueError):
        SqliteStore(db, synchronous="FULL; DROP TABLE kv")
    with pytest.raises(ValueError):
        SqliteStore(db, max_batch=0)


# -- recovery after SIGKILL ---------------------------------------------------------------------

CHILD = """
import asyncio, sys

import msgpack
from polymq.types import Message
from polymq_core.store.sqlite import SqliteStore
from polymq_core.store.writes import Append


async def main() -> None:
    db, messages = sys.argv[1], sys.argv[2]
    with open(messages, "rb") as f:
        wires = msgpack.unpackb(f.read(), raw=False)
    store = SqliteStore(db)
    await store.open()
    await asyncio.gather(*[store.write(Append(w[13], Message.from_wire(w))) for w in wires])
    print("ok", flush=True)
    await asyncio.sleep(3600)


asyncio.run(main())
"""


async def test_acknowledged_appends_survive_sigkill(tmp_path: Path, db: Path) -> None:
    messages = [full_message(seq) for seq in range(1, 2001)]
    (tmp_path / "messages.bin").write_bytes(
        msgpack.packb([m.to_wire() for m in messages], use_bin_type=True)
    )
    (tmp_path / "child.py").write_text(CHILD)
    roots = [
        str(Path(polymq.types.__file__).parents[1]),
        str(Path(polymq_core.store.contract.__file__).parents[2]),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*roots, os.environ.get("PYTHONPATH", "")]))
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(tmp_path / "child.py"),
        str(db),
        str(tmp_path / "messages.bin"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        if line != b"ok\n":
            child.kill()
            await child.wait()
            pytest.fail(f"child did not report ok: {line!r} {await child.stderr.read()!r}")
        child.send_signal(signal.SIGKILL)
        assert await child.wait() == -signal.SIGKILL
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()

    async with opened(db) as store:
        assert await store.load_messages(Q) == messages
        assert await store.load_destinations() == [DestinationRecord(Q, {}, {}, last_seq=2000)]


# -- replication: the encoding a log entry carries, entries applied with their sequence ----------

# Every kind of Store write, as the shard makes it. Applied in this order they touch every
# table, replace, delete and re-create.
WRITES: list[Write] = [
    SaveDestination(Q, {"durable": True, "ttl": 1.5, "n": [1, "x"]}, {"ü": "✓"}),
    Append(Q, full_message(1)),
    AppendMany(Q, [full_message(2), small_message(3), Message(body=b"", seq=4)]),
    AppendMany("queue/empty", []),
    Remove(Q, [2, 99]),
    MarkDelivered(Q, [(1, 2), (3, 1), (99, 1)]),
    SaveBindings(Q, ["a.*", "b.#"]),
    DeleteBindings(Q, ["a.*", "never"]),
    Append("queue/gone", small_message(7, "queue/gone")),
    SaveBindings("queue/gone", ["g.#"]),
    DeleteDestination("queue/gone"),
    AppendMany("queue/p", [small_message(s, "queue/p") for s in (1, 2)]),
    PurgeMessages("queue/p"),
    SaveValue("k", b"\x00\xff"),
    SaveValue("k2", bytearray(b"v2")),
    DeleteValue("k2"),
    DeleteValue("never"),
    AppendBatch("queue/b", [small_message(s, "queue/b") for s in (1, 2)], "k1", 2e9, b"a"),
    AppendBatch("queue/b", [small_message(3, "queue/b")], "k2", 1000.0, b"\x00"),
    AppendBatch("queue/b", [small_message(4, "queue/b")], "k1", 3e9, b"again"),
    ForgetBatches(1500.0),
    SaveCursor("c1", "stream/s", b"\x93\x01\x02\x03"),
    SaveCursor("c2", "queue/q", b"r"),
    DeleteCursor("c2"),
    DeleteCursor("never"),
]


def dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table but ``replication``."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        tables = [
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if name != "replication"
        ]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}


def test_every_kind_of_write_is_in_the_catalogue() -> None:
    """The tests below are only as good as the writes they cover: every record, every kind
    a log entry may carry."""
    records = {getattr(writes, name) for name in writes.__all__}
    records = {
        r for r in records if isinstance(r, type) and issubclass(r, Write) and r is not Write
    }
    assert len(records) == 15
    assert {type(w) for w in WRITES} == records
    kinds = {w.encode(msgpack.Packer(use_bin_type=True).pack)[0] for w in WRITES}
    assert kinds == set(WriteKind) - {WriteKind.APPLIED}


def test_the_log_entry_of_the_catalogue_is_what_earlier_releases_wrote() -> None:
    """Entries already in a cluster's logs must read after an upgrade, and entries written
    now by a node not yet upgraded: the records encode to exactly the bytes of the string
    table they replaced (its digest, taken before it was removed), with the kinds' numbers
    unchanged."""
    pack = msgpack.Packer(use_bin_type=True).pack
    data = encode_entry("node-a", 3, [w.encode(pack) for w in WRITES])
    assert len(data) == 2056
    assert hashlib.sha256(data).hexdigest() == (
        "ab3e07ac480b448960fa7b3052c2bba224e8c6848bfc15637921863761ccf434"
    )
    assert {k.name: k.value for k in WriteKind} == {
        "APPEND": 1,
        "APPEND_MANY": 2,
        "REMOVE": 3,
        "PURGE": 4,
        "SAVE_DESTINATION": 5,
        "DELETE_DESTINATION": 6,
        "SAVE_BINDINGS": 7,
        "DELETE_BINDINGS": 8,
        "KV_PUT": 9,
        "KV_DELETE": 10,
        "APPLIED": 11,
        "APPEND_BATCH": 12,
        "FORGET_BATCHES": 13,
        "SAVE_CURSOR": 14,
        "DELETE_CURSOR": 15,
        "DELIVERED": 16,
    }


async def test_encoded_writes_applied_as_an_entry_make_the_same_rows(tmp_path: Path) -> None:
    """What the leader writes and what a follower applies from the log (each write encoded,
    through msgpack and back) are the same rows."""
    direct_db, replica_db = tmp_path / "direct.db", tmp_path / "replica.db"
    async with opened(direct_db) as direct, opened(replica_db) as replica:
        encoded = []
        for write in WRITES:
            await settled(direct.write(write))
            entry = replica.encode(write)
            assert isinstance(entry[0], int)
            encoded.append(entry)
        wire = msgpack.unpackb(msgpack.packb(encoded, use_bin_type=True), raw=False)
        assert await replica.applied() == 0
        await settled(replica.apply_entry(41, wire[:5]))
        await settled(replica.apply_entry(42, wire[5:]))
        assert await replica.applied() == 42
        assert await direct.applied() == 0
        assert await replica.load_destinations() == await direct.load_destinations()
        assert await replica.load_messages(Q) == await direct.load_messages(Q)

    assert dump(replica_db) == dump(direct_db)
    assert dump(direct_db)["messages"]  # not vacuous
    with contextlib.closing(sqlite3.connect(replica_db)) as conn:
        assert conn.execute("SELECT id, applied FROM replication").fetchall() == [(0, 42)]


async def test_encode_works_before_open_and_refuses_what_cannot_be_serialized(
    db: Path,
) -> None:
    store = SqliteStore(db)
    kind, destination, seqs = store.encode(Remove(Q, (3, 1)))
    assert (kind, destination, seqs) == (WriteKind.REMOVE.value, Q, [3, 1])
    with pytest.raises(TypeError):
        store.encode(SaveDestination(Q, {"x": object()}, {}))
    with pytest.raises(TypeError):
        store.encode(Append(Q, Message(body=b"", headers={"h": object()}, seq=1)))  # type: ignore[dict-item]


async def test_a_write_that_cannot_be_serialized_raises_at_once_and_queues_nothing(
    store: SqliteStore,
) -> None:
    with pytest.raises(TypeError):
        store.write(SaveDestination(Q, {"x": object()}, {}))
    await settled(store.write(SaveValue("k", b"v")))
    assert await store.load_destinations() == []


async def test_an_entry_shares_a_batch_in_order_and_is_applied_whole(
    db: Path, store: SqliteStore
) -> None:
    sizes: list[int] = []
    store.on_commit = lambda seconds, n: sizes.append(n)
    async with writer_held(store, db):
        futures = [
            store.write(SaveValue("k", b"1")),
            store.apply_entry(
                7, [store.encode(SaveValue("k", b"2")), store.encode(Append(Q, small_message(1)))]
            ),
            store.write(SaveValue("k", b"3")),
            store.apply_entry(8, []),  # a takeover: nothing but its sequence
        ]
    await settled(*futures)
    assert 4 in sizes  # one commit, one write per entry
    assert await store.kv_get("k") == b"3"
    assert await store.count_messages(Q) == 1
    assert await store.applied() == 8


async def test_a_malformed_entry_is_refused_at_once_and_nothing_of_it_is_kept(
    store: SqliteStore,
) -> None:
    good = store.encode(SaveValue("k", b"v"))
    for bad in ([99, "x"], [], ["kv_put", "k", b"v"], [good[0], "k"], [*good, "extra"]):
        with pytest.raises(StoreError, match="log entry 5"):
            store.apply_entry(5, [good, bad])
    applied = WriteKind.APPLIED.value
    with pytest.raises(StoreError, match="log entry 5"):
        store.apply_entry(5, [[applied, 4, []]])  # never carried by the log
    await settled(store.apply_entry(6, [good]))
    assert await store.applied() == 6
    assert await store.kv_keys("", 10) == ["k"]


async def test_apply_entry_after_close_raises_store_error(db: Path) -> None:
    store = SqliteStore(db)
    with pytest.raises(StoreError):
        store.apply_entry(1, [])
    await store.open()
    await store.close()
    with pytest.raises(StoreError):
        store.apply_entry(1, [])
    with pytest.raises(StoreError):
        await store.applied()


async def test_batches_are_kept_with_their_messages_and_forgotten_once_expired(
    store: SqliteStore,
) -> None:
    await settled(store.write(AppendBatch(Q, [small_message(1)], "late", 300.0, b"l")))
    await settled(store.write(AppendBatch(Q, [small_message(2)], "soon", 200.0, b"s")))
    await settled(store.write(AppendBatch(Q, [small_message(3)], "gone", 100.0, b"g")))
    assert [m.seq for m in await store.load_messages(Q)] == [1, 2, 3]
    assert await store.load_batches(100.0) == [("soon", 200.0, b"s"), ("late", 300.0, b"l")]
    await settled(store.write(ForgetBatches(200.0)))
    assert await store.load_batches(0.0) == [("late", 300.0, b"l")]
    assert len(await store.load_messages(Q)) == 3  # forgetting a batch keeps its messages


async def test_a_batch_whose_messages_are_acked_in_the_same_commit_is_still_kept(
    store: SqliteStore,
) -> None:
    """In one group commit the acked messages are never written (``apply_batch`` skips
    them); the batch that brought them is, as it is when the ack comes in a later one."""
    first = store.write(AppendBatch(Q, [small_message(1), small_message(2)], "b", 2e9, b"a"))
    second = store.write(Remove(Q, [1, 2]))
    await settled(asyncio.gather(first, second))
    assert await store.load_messages(Q) == []
    assert await store.load_batches(0.0) == [("b", 2e9, b"a")]


_V2_SCHEMA = (
    *_V1_SCHEMA[:-1],
    "CREATE TABLE bindings (destination TEXT NOT NULL, pattern TEXT NOT NULL,"
    " PRIMARY KEY (destination, pattern)) WITHOUT ROWID",
    "PRAGMA user_version = 2",
)


async def test_a_version_2_file_is_migrated_and_keeps_its_data(db: Path) -> None:
    """A data file written before replication existed opens with nothing applied, keeps
    everything and records entries from then on; it remembers batches from then on too."""
    message = full_message(3)
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for sql in _V2_SCHEMA:
            conn.execute(sql)
        blob = msgpack.packb(message.to_wire(), use_bin_type=True)
        conn.execute("INSERT INTO messages VALUES (?, 3, ?)", (Q, blob))
        conn.execute("INSERT INTO destinations VALUES (?, '{}', '{}')", (Q,))
        conn.execute("INSERT INTO sequences VALUES (?, 3)", (Q,))
        conn.execute("INSERT INTO bindings VALUES (?, 'a.*')", (Q,))
        conn.execute("INSERT INTO kv VALUES ('k', x'01')")

    async with opened(db) as store:
        assert await store.applied() == 0
        assert await store.load_messages(Q) == [message]
        assert await store.load_bindings() == [(Q, "a.*")]
        assert await store.kv_get("k") == b"\x01"
        assert await store.load_batches(0.0) == []
        await settled(store.apply_entry(12, [store.encode(DeleteValue("k"))]))
        await settled(store.write(AppendBatch(Q, [small_message(4)], "b", 2e9, b"x")))
    async with opened(db) as store:
        assert await store.applied() == 12
        assert await store.kv_get("k") is None
        assert await store.load_batches(0.0) == [("b", 2e9, b"x")]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_an_entry_queued_behind_one_that_failed_fails_too(store: SqliteStore) -> None:
    """Entries queued without waiting (``after`` names the one before): the first commits,
    the one whose predecessor never committed fails and writes nothing, so the replica
    never has a gap; started again from what was applied, it goes on."""
    await settled(store.apply_entry(3, [store.encode(SaveValue("a", b"1"))], after=0))
    # entry 4 "failed" (never queued): 5 says it follows 4
    with pytest.raises(StoreError, match="follows entry 4, but 3 was applied last"):
        await store.apply_entry(5, [store.encode(SaveValue("b", b"2"))], after=4)
    assert await store.applied() == 3
    assert await store.kv_keys("", 10) == ["a"]
    first = store.apply_entry(4, [store.encode(SaveValue("c", b"3"))], after=3)
    second = store.apply_entry(5, [store.encode(SaveValue("b", b"2"))], after=4)
    await settled(first)
    await settled(second)
    assert await store.applied() == 5
    assert await store.kv_keys("", 10) == ["a", "b", "c"]
