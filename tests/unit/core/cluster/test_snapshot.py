"""Tests of ``polymq_core.cluster.snapshot`` and the snapshot parts of the store and the replicated
store, without sockets: where a leader purges its log (pure), which nodes a shard is copied
from (pure), SQLite copies made, checked and put in place, and a ReplicatedStore whose next
entry was purged copying the shard over an in-memory log (the real stream and admin HTTP are
in tests/integration/core/test_snapshot.py)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from polymq.types import Message
from polymq_core.cluster.membership import LEAVING, PeerInfo
from polymq_core.cluster.snapshot import (
    kept_entries,
    lowest_applied,
    purge_point,
    snapshot_sources,
    snapshot_url,
)
from polymq_core.replication.jetstream import TailEnd
from polymq_core.replication.replicatedstore import ReplicatedStore
from polymq_core.store.contract import StoreError
from polymq_core.store.filecopy import check_snapshot, install_snapshot
from polymq_core.store.logentry import Deposed, LogError
from polymq_core.store.sqlite import SqliteStore
from polymq_core.store.writes import Append, AppendMany, Remove, SaveDestination, SaveValue

Q = "queue/q"
DEADLINE = 5.0

# -- where to purge -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lowest", "first", "last", "keep", "most", "expected"),
    [
        (50, 1, 100, 0, None, 51),  # every node has 1..50: they go
        (50, 1, 100, 10, None, 51),  # the last 10 (91..100) are kept anyway
        (95, 1, 100, 10, None, 91),  # ... even when every node has them
        (100, 1, 100, 0, None, 101),  # keep nothing: everything goes
        (50, 51, 100, 0, None, 0),  # already purged there
        (50, 60, 100, 0, None, 0),  # purged further (by a former leader): never back
        (0, 1, 100, 0, None, 0),  # a node has applied nothing (a wiped one, joining)
        (None, 1, 100, 0, None, 0),  # nobody known: nothing goes
        (0, 1, 100, 10, 50, 51),  # too long: cut to the last 50 past a node that lags
        (None, 1, 100, 10, 50, 51),
        (80, 1, 100, 10, 50, 81),  # not too long once every node's entries go
        (0, 1, 0, 0, None, 0),  # an empty log
        (7, 8, 7, 0, None, 0),  # a log purged empty
    ],
)
def test_purge_point(
    lowest: int | None, first: int, last: int, keep: int, most: int | None, expected: int
) -> None:
    assert purge_point(lowest, first=first, last=last, keep=keep, most=most) == expected


def test_purge_point_never_drops_the_last_kept_entries_nor_an_unapplied_one() -> None:
    for lowest in range(0, 40):
        for last in range(lowest, 40):
            for keep in range(0, 12):
                point = purge_point(lowest, first=1, last=last, keep=keep, most=None)
                if point:
                    assert point <= lowest + 1  # nothing a node still needs
                    assert last - point + 1 >= keep  # the last `keep` stay
                    assert point > 1


@pytest.mark.parametrize(
    ("keep", "keep_bytes", "entries", "nbytes", "expected"),
    [
        (10_000, 64 << 20, 400, 600 << 20, 42),  # 1.5 MB entries: 64 MiB of them
        (10_000, 64 << 20, 50_000, 50 << 20, 10_000),  # 1 KB entries: the count bounds
        (10, 64 << 20, 400, 600 << 20, 10),  # fewer than fit: the count
        (10_000, 1, 400, 600 << 20, 1),  # one entry larger than the bytes: kept
        (0, 64 << 20, 400, 600 << 20, 0),  # keep nothing: nothing
        (10_000, 64 << 20, 0, 0, 10_000),  # an empty log
    ],
)
def test_kept_entries_are_bounded_by_bytes_too(
    keep: int, keep_bytes: int, entries: int, nbytes: int, expected: int
) -> None:
    assert kept_entries(keep, keep_bytes, entries=entries, nbytes=nbytes) == expected


def test_purge_point_refuses_a_nonsense_window() -> None:
    with pytest.raises(ValueError):
        purge_point(1, first=1, last=9, keep=-1)
    with pytest.raises(ValueError):
        purge_point(1, first=1, last=9, keep=10, most=5)


def peer(node: str, applied: dict[int, int], state: str = "ready", url: str = "") -> PeerInfo:
    return PeerInfo(node_id=node, applied=applied, state=state, admin_url=url)


def test_lowest_applied_counts_every_node_heard_but_those_leaving() -> None:
    peers = [
        peer("a", {0: 90, 1: 7}),
        peer("b", {0: 80, 1: 9}),
        peer("c", {0: 20, 1: 1}, state=LEAVING),  # said goodbye: not waited for
        peer("d", {0: 60, 1: 8}, state="joining"),  # a state other than leaving counts
    ]
    assert lowest_applied(peers, 0) == 60
    assert lowest_applied(peers, 1) == 7
    assert lowest_applied(peers, 2) == 0  # nobody announced shard 2: nothing is known applied
    assert lowest_applied(peers[2:3], 0) is None
    assert lowest_applied([], 0) is None


def test_snapshot_sources_are_the_leader_then_the_furthest_ahead() -> None:
    peers = [
        peer("me", {0: 500}, url="http://me/"),
        peer("a", {0: 100}, url="http://a/"),
        peer("b", {0: 300}, url="http://b/"),
        peer("c", {0: 200}, url="http://c/"),
        peer("d", {0: 400}),  # no admin URL
        peer("e", {0: 900}, url="http://e/", state=LEAVING),
        peer("f", {0: 40}, url="http://f/"),  # behind the log's first entry
    ]
    names = [p.node_id for p in snapshot_sources(peers, 0, me="me", leader="a", first=51)]
    assert names == ["a", "b", "c"]
    names = [p.node_id for p in snapshot_sources(peers, 0, me="me", leader=None, first=None)]
    assert names == ["b", "c", "a", "f"]
    assert snapshot_sources(peers, 0, me="me", leader="a", first=1000) == []
    assert snapshot_url("http://h:1/", 3) == "http://h:1/api/cluster/snapshot/3"
    assert snapshot_url("http://h:1", 3) == "http://h:1/api/cluster/snapshot/3"


# -- copies of a store ------------------------------------------------------------------------


def msg(seq: int) -> Message:
    return Message(body=f"m{seq}".encode(), persistent=True, seq=seq, destination=Q)


async def test_a_backup_is_a_consistent_copy_while_writes_go_on(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "a.db", synchronous="NORMAL")
    await store.open()
    try:
        await store.apply_entry(1, [store.encode(SaveDestination(Q, {}, {}))])
        writing = [store.apply_entry(i, [store.encode(Append(Q, msg(i)))]) for i in range(2, 2000)]
        applied = await store.backup(tmp_path / "copy.db")
        await asyncio.gather(*writing)
    finally:
        await store.close()
    assert 1 <= applied <= 1999
    assert not (tmp_path / "copy.db-wal").exists()
    assert await asyncio.to_thread(check_snapshot, tmp_path / "copy.db") == applied
    conn = sqlite3.connect(tmp_path / "copy.db")
    try:
        seqs = [s for (s,) in conn.execute("SELECT seq FROM messages ORDER BY seq")]
    finally:
        conn.close()
    assert seqs == list(range(2, applied + 1))  # exactly the entries up to its applied


async def test_a_copy_goes_in_place_of_a_store_and_its_wal(tmp_path: Path) -> None:
    source = SqliteStore(tmp_path / "source.db")
    await source.open()
    await source.apply_entry(9, [source.encode(SaveValue("k", b"new"))])
    await source.backup(tmp_path / "copy.db")
    await source.close()

    db = tmp_path / "shard.db"
    old = SqliteStore(db)
    await old.open()
    await old.apply_entry(3, [old.encode(SaveValue("k", b"old")), old.encode(SaveValue("x", b""))])
    await old.close()
    (tmp_path / "shard.db-wal").write_bytes(b"junk a crash left")
    install_snapshot(tmp_path / "copy.db", db)
    assert not (tmp_path / "copy.db").exists() and not (tmp_path / "shard.db-wal").exists()

    store = old.reopened()
    await store.open()
    try:
        assert await store.applied() == 9
        assert await store.kv_get("k") == b"new" and await store.kv_get("x") is None
    finally:
        await store.close()


def test_what_is_not_an_intact_store_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(StoreError):
        check_snapshot(garbage)
    future = tmp_path / "future.db"
    conn = sqlite3.connect(future)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        check_snapshot(future)
    with pytest.raises(StoreError):
        check_snapshot(tmp_path / "missing.db")


# -- a ReplicatedStore whose next entry was purged -------------------------------------------


class PurgeableLog:
    """What ReplicatedStore uses of a ShardLog, in memory, with a purge: a tail from a
    purged entry ends as a ShardLog's does."""

    stream = "MEMORY_0"
    timeout = 1.0
    max_entry = 64 * 1024

    def __init__(self) -> None:
        self.entries: dict[int, bytes] = {}
        self.first = 1
        self.last = 0
        self._grew = asyncio.Event()

    async def info(self) -> tuple[str | None, int]:
        return "memory", self.last

    async def span(self) -> tuple[int, int]:
        return self.first, self.last

    async def append(self, payload: bytes, expected_last: int) -> int:
        await asyncio.sleep(0.001)
        if expected_last != self.last:
            raise Deposed(f"wrong last sequence: {self.last}", last=self.last)
        self.last += 1
        self.entries[self.last] = payload
        self._grew.set()
        self._grew = asyncio.Event()
        return self.last

    async def get(self, seq: int) -> bytes:
        await asyncio.sleep(0.001)
        if not self.first <= seq <= self.last:
            raise LogError(f"no entry {seq}: the log holds {self.first}..{self.last}")
        return self.entries[seq]

    async def purge_below(self, seq: int) -> None:
        for s in range(self.first, min(seq, self.last + 1)):
            del self.entries[s]
        self.first = max(self.first, seq)

    def tail(
        self, start: int, on_entry: Callable[[int, bytes], Awaitable[None]]
    ) -> asyncio.Task[None]:
        async def run() -> None:
            seq = start
            while True:
                if seq < self.first:
                    raise TailEnd(f"purged: {self.stream} starts at entry {self.first}")
                while seq <= self.last:
                    await on_entry(seq, self.entries[seq])
                    seq += 1
                await self._grew.wait()

        return asyncio.get_running_loop().create_task(run())


@contextlib.asynccontextmanager
async def replicated(
    path: Path, log: PurgeableLog, name: str, **kw: Any
) -> AsyncIterator[ReplicatedStore]:
    store = ReplicatedStore(
        SqliteStore(path, synchronous="NORMAL"),
        log,  # type: ignore[arg-type]
        name,
        **kw,
    )
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def settled(*futures: asyncio.Future[None]) -> None:
    await asyncio.wait_for(asyncio.gather(*futures), DEADLINE)


async def until(predicate: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def seqs(store: ReplicatedStore) -> list[int]:
    return [m.seq for m in await store.load_messages(Q)]


async def test_a_store_behind_a_purge_copies_the_shard_then_tails_on(tmp_path: Path) -> None:
    log = PurgeableLog()
    async with replicated(tmp_path / "a.db", log, "a") as a:
        await a.promote()
        for i in range(1, 21):
            await settled(a.write(Append(Q, msg(i))))
        await settled(a.write(Remove(Q, [1, 2, 3])), a.write(SaveValue("k", b"v")))
        last = await a.sync()
        await log.purge_below(last)  # keeps the last entry only

        fetched: list[int] = []

        async def fetch(target: Path) -> int:
            if not fetched:
                fetched.append(-1)
                raise OSError("the first try fails")  # it is tried again
            applied = await a.snapshot(target)
            fetched.append(applied)
            return applied

        commits: list[int] = []
        b_local = SqliteStore(tmp_path / "b.db", synchronous="NORMAL")
        b_local.on_commit = lambda _s, n: commits.append(n)
        b = ReplicatedStore(b_local, log, "b", fetch_snapshot=fetch)  # type: ignore[arg-type]
        await b.open()
        try:
            await until(lambda: b.applied == last)
            assert await seqs(b) == list(range(4, 21)) and await b.kv_get("k") == b"v"
            assert fetched[0] == -1 and fetched[1] == last and len(fetched) == 2
            assert not commits  # nothing replayed: the copy came whole
            assert not b.restoring and b.tail_error is None
            assert not (tmp_path / "b.db.snapshot").exists()

            await settled(a.write(Append(Q, msg(21))))  # and it tails on
            last = await a.sync()
            await until(lambda: b.applied == last)
            assert (await seqs(b))[-1] == 21 and sum(commits) == 1
        finally:
            await b.close()


async def test_promote_waits_until_the_copy_is_in_place(tmp_path: Path) -> None:
    log = PurgeableLog()
    async with replicated(tmp_path / "a.db", log, "a") as a:
        await a.promote()
        await settled(a.write(AppendMany(Q, [msg(1), msg(2)])), a.write(SaveValue("k", b"v")))
        await log.purge_below(log.last)
        a.demote()

        gate = asyncio.Event()

        async def fetch(target: Path) -> int:
            await gate.wait()
            return await a.snapshot(target)

        async with replicated(tmp_path / "b.db", log, "b", fetch_snapshot=fetch) as b:
            await until(lambda: b.restoring)
            with pytest.raises(StoreError, match="copying a snapshot"):
                await b.snapshot(tmp_path / "nope.db")  # not served while it copies
            promoting = asyncio.ensure_future(b.promote(timeout=DEADLINE))
            await asyncio.sleep(0.2)
            assert not promoting.done() and not b.is_leader
            gate.set()
            epoch = await asyncio.wait_for(promoting, DEADLINE)
            assert b.is_leader and epoch == log.last and not b.restoring
            assert await seqs(b) == [1, 2] and await b.kv_get("k") == b"v"
            await settled(b.write(Append(Q, msg(3))))
            assert await seqs(b) == [1, 2, 3]


async def test_a_promote_that_times_out_while_copying_says_so(tmp_path: Path) -> None:
    log = PurgeableLog()
    async with replicated(tmp_path / "a.db", log, "a") as a:
        await a.promote()
        await settled(a.write(SaveValue("k", b"v")), a.write(SaveValue("k2", b"v")))
        await log.purge_below(log.last)

        async def never(target: Path) -> int:
            await asyncio.Event().wait()
            raise AssertionError

        async with replicated(tmp_path / "b.db", log, "b", fetch_snapshot=never) as b:
            await until(lambda: b.restoring)
            with pytest.raises(LogError, match="copying a snapshot"):
                await b.promote(timeout=0.2)
        # closing while a copy is awaited ends it
        assert not b.restoring


async def test_a_copy_no_further_than_the_store_is_not_installed(tmp_path: Path) -> None:
    log = PurgeableLog()
    empty = SqliteStore(tmp_path / "empty.db")
    await empty.open()
    await empty.close()
    async with replicated(tmp_path / "a.db", log, "a") as a:
        await a.promote()
        await settled(a.write(SaveValue("k", b"1")))
        stale = tmp_path / "stale.db"
        stale_applied = await a.snapshot(stale)
        for i in range(2, 6):
            await settled(a.write(SaveValue("k", str(i).encode())))
        await log.purge_below(log.last)

        offered: list[str] = []

        async def fetch(target: Path) -> int:
            """An empty copy (not installed), an old one (installed, but the log was
            purged past it: copied again), then a good one."""
            if not offered:
                offered.append("empty")
                await asyncio.to_thread(shutil.copyfile, tmp_path / "empty.db", target)
                return 0
            if offered == ["empty"]:
                offered.append("stale")
                await asyncio.to_thread(shutil.copyfile, stale, target)
                return stale_applied
            offered.append("fresh")
            return await a.snapshot(target)

        async with replicated(tmp_path / "b.db", log, "b", fetch_snapshot=fetch) as b:
            last = await a.sync()
            await until(lambda: b.applied == last)
            assert offered == ["empty", "stale", "fresh"]
            assert await b.kv_get("k") == b"5"
