"""Tests of ``polymq_core.replication.replicatedstore`` without NATS: ReplicatedStore's leader and
follower logic
over an in-memory log that fences appends as JetStream does (the real stream is in
tests/integration/core/test_replog.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from polymq.types import Message
from polymq_core.replication.replicatedstore import ReplicatedStore
from polymq_core.store.contract import StoreError
from polymq_core.store.logentry import (
    Deposed,
    LogError,
    LogUnavailable,
    NoLeader,
    NotAppended,
    decode_entry,
    encode_entry,
)
from polymq_core.store.sqlite import SqliteStore
from polymq_core.store.writes import Append, AppendMany, Remove, SaveValue

Q = "queue/q"
DEADLINE = 5.0

# -- ReplicatedStore over an in-memory log -----------------------------------------------------


class MemoryLog:
    """What ReplicatedStore uses of a ShardLog, in memory: appends fenced on the expected
    last sequence, a tail per reader. ``down`` makes appends fail unavailable;
    ``lose_answers`` appends them but answers unavailable (a timeout after the fact);
    ``unanswered`` takes the next appends, one per item, without ever answering them (a
    stream leader stepping down or dying with the proposal in flight): True appends the
    entry (a new leader committed it), False drops it."""

    stream = "MEMORY_0"
    timeout = 1.0
    max_entry = 64 * 1024

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.down = False
        self.leaderless = 0  # appends answered "no responders" (an election) before one is taken
        self.lose_answers = False
        self.unanswered: list[bool] = []
        self.on_new_leader: Callable[[], None] | None = None  # set by the store
        self.tails_flow = asyncio.Event()  # cleared: tails deliver nothing (their consumer
        self.tails_flow.set()  # died with a server, say)
        self.got: list[int] = []  # entries read one by one
        self._grew = asyncio.Event()

    async def info(self) -> tuple[str | None, int]:
        if self.down:
            raise LogUnavailable("down")
        return "memory", len(self.entries)

    async def append(self, payload: bytes, expected_last: int) -> int:
        await asyncio.sleep(0.001)
        if self.down:
            raise LogUnavailable("down")
        if self.leaderless:
            self.leaderless -= 1
            raise NoLeader("no response from stream")
        if len(payload) > self.max_entry:
            raise LogError("too big")
        if expected_last != len(self.entries):
            raise Deposed(f"wrong last sequence: {len(self.entries)}", last=len(self.entries))
        if self.unanswered:
            if self.unanswered.pop(0):
                self.add(payload)
            await asyncio.Event().wait()  # never answered
        self.add(payload)
        if self.lose_answers:
            raise LogUnavailable("timeout")
        return len(self.entries)

    def add(self, payload: bytes) -> None:
        self.entries.append(payload)
        self._grew.set()
        self._grew = asyncio.Event()

    def new_leader(self) -> None:
        """JetStream's advisory: the stream has a new leader."""
        assert self.on_new_leader is not None
        self.on_new_leader()

    async def get(self, seq: int) -> bytes:
        await asyncio.sleep(0.001)
        if self.down:
            raise LogUnavailable("down")
        self.got.append(seq)
        return self.entries[seq - 1]

    def tail(
        self, start: int, on_entry: Callable[[int, bytes], Awaitable[None]]
    ) -> asyncio.Task[None]:
        async def run() -> None:
            seq = start
            await self.tails_flow.wait()
            while True:
                while seq <= len(self.entries):
                    await on_entry(seq, self.entries[seq - 1])
                    seq += 1
                await self._grew.wait()

        return asyncio.get_running_loop().create_task(run())

    def writers(self) -> list[tuple[str, bool, int]]:
        """(node, takeover, number of writes) of every entry."""
        return [(e.node_id, e.takeover, len(e.writes)) for e in map(decode_entry, self.entries)]


@contextlib.asynccontextmanager
async def replicated(
    tmp_path: Path, log: MemoryLog, name: str, **kw: Any
) -> AsyncIterator[tuple[ReplicatedStore, list[str]]]:
    deposed: list[str] = []
    store = ReplicatedStore(
        SqliteStore(tmp_path / f"{name}.db", synchronous="NORMAL"),
        log,  # type: ignore[arg-type]
        name,
        on_deposed=lambda: deposed.append(name),
        **kw,
    )
    await store.open()
    try:
        yield store, deposed
    finally:
        await store.close()


def msg(seq: int) -> Message:
    return Message(body=f"m{seq}".encode(), persistent=True, seq=seq, destination=Q)


async def settled(*futures: asyncio.Future[None]) -> None:
    await asyncio.wait_for(asyncio.gather(*futures), DEADLINE)


async def until(predicate: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while True:
        if predicate():
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def seqs(store: ReplicatedStore) -> list[int]:
    return [m.seq for m in await store.load_messages(Q)]


async def test_a_follower_refuses_writes_and_applies_the_leaders(tmp_path: Path) -> None:
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, _), replicated(tmp_path, log, "b") as (b, _):
        with pytest.raises(StoreError, match="not the leader"):
            a.write(Append(Q, msg(1)))
        assert await a.promote() == 1 == a.epoch
        commits: list[int] = []
        a.on_commit = lambda seconds, n: commits.append(n)
        await settled(
            a.write(AppendMany(Q, [msg(1), msg(2)])),
            a.write(SaveValue("k", b"v")),
            a.write(Append(Q, msg(3))),
        )
        await settled(a.write(Remove(Q, [1])))
        assert await seqs(a) == [2, 3]  # the leader reads its writes once they resolve
        await until(lambda: b.applied == len(log.entries))  # held a moment, then applied
        assert await seqs(b) == [2, 3] and await b.kv_get("k") == b"v"
        assert await b.local.applied() == await a.sync() == len(log.entries)
        assert log.writers()[0] == ("a", True, 0)
        assert sum(commits) == 4 and len(commits) == len(log.entries) - 1
        assert all(node == "a" for node, _, _ in log.writers())


async def test_writes_issued_together_share_one_entry(tmp_path: Path) -> None:
    log = MemoryLog()
    async with replicated(tmp_path, log, "a", max_entry_writes=50) as (a, _):
        await a.promote()
        await settled(*(a.write(Append(Q, msg(i))) for i in range(1, 201)))
        sizes = [n for _, takeover, n in log.writers() if not takeover]
        assert sum(sizes) == 200 and len(sizes) <= 6 and max(sizes) <= 50
        assert await seqs(a) == list(range(1, 201))


async def test_an_entry_too_large_is_split_and_a_write_too_large_fails_alone(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    log.max_entry = 4096
    async with replicated(tmp_path, log, "a") as (a, _):
        await a.promote()
        big = [a.write(SaveValue(f"k{i}", b"x" * 1000)) for i in range(10)]
        huge = a.write(SaveValue("huge", b"x" * 5000))
        after = a.write(SaveValue("after", b"y"))
        await settled(*big, after)
        with pytest.raises(StoreError, match="more than the log takes"):
            await huge
        assert len(await a.kv_keys("k", 100)) == 10 and await a.kv_get("huge") is None
        assert all(len(entry) <= 4096 for entry in log.entries)


async def test_a_takeover_deposes_the_old_leader_through_its_tail(tmp_path: Path) -> None:
    log = MemoryLog()
    async with (
        replicated(tmp_path, log, "a") as (a, a_deposed),
        replicated(tmp_path, log, "b") as (b, b_deposed),
    ):
        await a.promote()
        await settled(a.write(Append(Q, msg(1))))
        epoch = await b.promote()
        assert epoch == len(log.entries) and b.is_leader
        await until(lambda: not a.is_leader)
        assert a_deposed == ["a"] and b_deposed == []
        with pytest.raises(StoreError, match="not the leader"):
            a.write(Append(Q, msg(2)))
        await settled(b.write(Append(Q, msg(3))))
        await until(lambda: a.applied == len(log.entries))
        assert await seqs(a) == await seqs(b) == [1, 3]


async def test_an_old_leader_that_missed_the_takeover_is_fenced(tmp_path: Path) -> None:
    log = MemoryLog()
    async with (
        replicated(tmp_path, log, "a") as (a, a_deposed),
        replicated(tmp_path, log, "b") as (b, _),
    ):
        await a.promote()
        await settled(a.write(Append(Q, msg(1))))
        # another node's takeover that a's tail has not delivered yet
        log.entries.append(encode_entry("b", len(log.entries) + 1, [], takeover=True))
        pending = a.write(Append(Q, msg(2)))
        with pytest.raises(StoreError, match="deposed"):
            await asyncio.wait_for(pending, DEADLINE)
        assert not a.is_leader and a_deposed == ["a"]
        assert b.applied <= len(log.entries)
        assert all(decode_entry(e).node_id == "a" or decode_entry(e).takeover for e in log.entries)
        assert await seqs(a) == [1]


async def test_a_lost_answer_is_caught_up_on_not_taken_for_a_rival(tmp_path: Path) -> None:
    """An append that landed although its answer was lost fails its writes (their outcome
    is unknown), is applied from the tail, and the leader goes on without being deposed."""
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        log.lose_answers = True
        with pytest.raises(StoreError, match="unavailable"):
            await asyncio.wait_for(a.write(Append(Q, msg(1))), DEADLINE)
        log.lose_answers = False
        await settled(a.write(Append(Q, msg(2))))
        assert a.is_leader and deposed == []
        assert await seqs(a) == [1, 2]  # it was in the log, so it is here too
        assert await a.sync() == len(log.entries) == await a.local.applied()


async def test_an_unavailable_log_fails_writes_and_promote_gives_up(tmp_path: Path) -> None:
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        log.down = True
        with pytest.raises(StoreError, match="unavailable"):
            await asyncio.wait_for(a.write(Append(Q, msg(1))), DEADLINE)
        assert a.is_leader and deposed == []
        log.down = False
        await settled(a.write(Append(Q, msg(2))))
        assert await seqs(a) == [2]
    async with replicated(tmp_path, log, "b") as (b, _):
        log.down = True
        with pytest.raises(LogUnavailable):
            await b.promote(timeout=0.3)
        assert not b.is_leader


async def test_an_append_nobody_took_is_tried_again_within_the_logs_timeout(
    tmp_path: Path,
) -> None:
    """No responders (the stream electing) says the entry is not in the log: the store tries
    again while it leads, for the log's timeout, and then fails the write as not taken."""
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        log.leaderless = 4
        await settled(a.write(Append(Q, msg(1))))
        assert log.leaderless == 0 and await seqs(a) == [1]
        assert len(log.writers()) == 2  # the takeover, then the write once
        log.leaderless = 10**6
        started = asyncio.get_running_loop().time()
        with pytest.raises(StoreError, match="no leader") as failed:
            await asyncio.wait_for(a.write(Append(Q, msg(2))), DEADLINE)
        assert isinstance(failed.value.__cause__, NoLeader)
        assert asyncio.get_running_loop().time() - started >= log.timeout
        log.leaderless = 0
        assert a.is_leader and deposed == []
        await settled(a.write(Append(Q, msg(3))))  # (not "uncertain": no catch-up needed)
        assert await seqs(a) == [1, 3]


@pytest.mark.parametrize("landed", [True, False])
async def test_an_append_the_old_leader_never_answered_is_settled_by_the_new_one(
    tmp_path: Path, landed: bool
) -> None:
    """A stream leader that steps down or dies never answers its proposals in flight, and
    the new one may have committed them (``landed``) or not. Told of the new leader, the
    store sends the entry again on the same fence: it is confirmed at once, in the log
    once, never left to the log's timeout."""
    log = MemoryLog()
    log.timeout = 30.0  # (far past the test's own deadline)
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        log.unanswered = [landed]
        write = a.write(Append(Q, msg(1)))
        await until(lambda: not log.unanswered)  # taken, never to be answered
        log.new_leader()
        await settled(write)
        assert len(log.writers()) == 2  # the takeover, then the write once
        assert a.is_leader and deposed == []
        await settled(a.write(Append(Q, msg(2))))
        assert await seqs(a) == [1, 2] and len(log.writers()) == 3


async def test_an_unanswered_append_whose_place_another_took_fails_as_not_committed(
    tmp_path: Path,
) -> None:
    """The entry after an unanswered append's fence is another node's (the new leader
    took over): the append certainly did not land, and its write fails at once as not
    committed (Deposed), not after the log's timeout as maybe committed."""
    log = MemoryLog()
    log.timeout = 30.0
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        log.unanswered = [False]
        write = a.write(Append(Q, msg(1)))
        await until(lambda: not log.unanswered)
        log.add(encode_entry("b", len(log.entries) + 1, [], takeover=True))
        with pytest.raises(StoreError, match="deposed") as failed:
            await asyncio.wait_for(write, DEADLINE)
        assert isinstance(failed.value.__cause__, Deposed)
        assert not a.is_leader and deposed == ["a"]
        assert [w[0] for w in log.writers()] == ["a", "b"]


async def test_an_unanswered_append_whose_resend_was_refused_stays_unknown(
    tmp_path: Path,
) -> None:
    """The resend is refused (the place is taken) but the tail, stuck, does not say by
    what before the log's timeout: the outcome is unknown ("may not have been committed"),
    and the writes are not appended again once the tail moves (the first try is there)."""
    log = MemoryLog()
    log.timeout = 0.3
    log.tails_flow.clear()
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        log.unanswered = [True]
        write = a.write(Append(Q, msg(1)))
        await until(lambda: not log.unanswered)
        log.new_leader()
        with pytest.raises(StoreError, match="unavailable") as failed:
            await asyncio.wait_for(write, DEADLINE)
        assert isinstance(failed.value.__cause__, LogUnavailable)
        log.tails_flow.set()
        await settled(a.write(Append(Q, msg(2))))
        assert await seqs(a) == [1, 2]
        assert len(log.writers()) == 3  # the takeover, the first write once, the second
        assert a.is_leader and deposed == []


async def test_an_unanswered_append_the_tail_brought_is_confirmed_at_the_timeout(
    tmp_path: Path,
) -> None:
    """No word of a new leader (its advisory lost), but the tail brought the entry: the
    write is confirmed when the log's timeout ends, not failed as maybe committed."""
    log = MemoryLog()
    log.timeout = 0.3
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        log.unanswered = [True]
        await settled(a.write(Append(Q, msg(1))))
        assert await seqs(a) == [1] and len(log.writers()) == 2 and deposed == []


async def test_demote_and_close_fail_pending_writes(tmp_path: Path) -> None:
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, deposed):
        await a.promote()
        first = a.write(Append(Q, msg(1)))
        for _ in range(3):
            await asyncio.sleep(0)  # the flusher takes it and appends it
        queued = a.write(Append(Q, msg(2)))  # waits for the next entry
        a.demote()
        with pytest.raises(StoreError, match="no longer leads") as failed:
            await queued
        assert isinstance(failed.value.__cause__, NotAppended)  # for sure not in the log
        await settled(first)
        assert deposed == [] and not a.is_leader
        await a.promote()
        stuck = a.write(Append(Q, msg(3)))
    with pytest.raises(StoreError):
        await stuck
    with pytest.raises(StoreError):
        a.write(Append(Q, msg(4)))


async def test_a_reopened_store_tails_from_what_it_applied(tmp_path: Path) -> None:
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, _):
        await a.promote()
        await settled(a.write(AppendMany(Q, [msg(1), msg(2)])))
        async with replicated(tmp_path, log, "b") as (b, _):
            await until(lambda: b.applied == len(log.entries))
            stopped = b.applied
        await settled(a.write(Remove(Q, [1])), a.write(Append(Q, msg(3))))
        entries: list[int] = []
        async with replicated(tmp_path, log, "b") as (b, _):
            assert b.applied == stopped
            b.local.on_commit = lambda seconds, n: entries.append(n)
            await until(lambda: b.applied == len(log.entries))
            assert await seqs(b) == [2, 3]
            await settled(
                b.local.write(SaveValue("barrier", b""))
            )  # every apply before it is counted
        assert sum(entries) - 1 == len(log.entries) - stopped


async def test_promote_waits_until_the_log_is_applied(tmp_path: Path) -> None:
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, _):
        await a.promote()
        await settled(*(a.write(Append(Q, msg(i))) for i in range(1, 50)))
        async with replicated(tmp_path, log, "b") as (b, _):
            await b.promote()
            assert b.applied == len(log.entries)
            assert await seqs(b) == list(range(1, 50))  # loaded after promote: complete


async def test_a_takeover_reads_what_a_stuck_tail_has_not_brought(tmp_path: Path) -> None:
    """A tail whose consumer died with a server waits seconds for a new one; the node that
    takes over reads the entries it lacks (and its own takeover entry) from the log."""
    log = MemoryLog()
    async with replicated(tmp_path, log, "a") as (a, _):
        await a.promote()
        await settled(a.write(AppendMany(Q, [msg(1), msg(2)])), a.write(Append(Q, msg(3))))
        await settled(a.write(Remove(Q, [1])))
    last = len(log.entries)
    log.tails_flow.clear()
    log.got.clear()
    async with replicated(tmp_path, log, "b") as (b, _):  # its tail brings nothing
        epoch = await asyncio.wait_for(b.promote(timeout=2.0), DEADLINE)
        assert epoch == last + 1 == b.applied  # everything, its takeover entry too
        assert log.got == list(range(1, last + 1))  # (its own takeover entry it knows)
        assert await seqs(b) == [2, 3]
        log.tails_flow.set()  # the tail comes back: what it brings is not applied twice
        await settled(b.write(Append(Q, msg(4))))
        await until(lambda: b.applied == len(log.entries))
        assert await seqs(b) == [2, 3, 4]
