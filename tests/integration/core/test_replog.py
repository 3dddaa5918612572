"""polymq_core.replication.replicatedstore against a real three-node JetStream cluster (nats-servers
on free
127.0.0.1 ports, started with polymq_core.cluster.natsd): one shard's log and three
ReplicatedStores, one per node, each with its own SQLite snapshot.

What a shard would observe: the leader's writes resolve and reach every follower's SQLite;
a second leader's takeover fences the first (its next write fails, it is told); a follower
restarted on its file applies only the tail; with two of three servers frozen a write
fails within the log's timeout and is never confirmed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from polymq.types import Message
from polymq_core.cluster.natsd import NatsConfig, NatsServer
from polymq_core.replication.jetstream import ShardLog
from polymq_core.replication.replicatedstore import ReplicatedStore
from polymq_core.store.contract import StoreError
from polymq_core.store.logentry import Deposed, LogUnavailable, encode_entry
from polymq_core.store.sqlite import SqliteStore
from polymq_core.store.writes import (
    Append,
    AppendMany,
    DeleteValue,
    Remove,
    SaveBindings,
    SaveDestination,
    SaveValue,
)

from ...procs import freeze, threads_stopped
from .helpers import eventually

pytestmark = pytest.mark.timeout(60)

Q = "queue/orders"
TIMEOUT = 2.0  # the logs' timeout: how long an append may wait for a majority
SETTLE = 10.0  # seconds a write that should succeed may take (elections included)
CORE_TIMEOUT = 5.0  # the log's timeout in the core (ShardLog's default)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def message(seq: int, body: bytes | None = None) -> Message:
    return Message(
        body=body if body is not None else f"m{seq}".encode(),
        headers={"n": str(seq)},
        persistent=True,
        seq=seq,
        destination=Q,
    )


@contextlib.asynccontextmanager
async def nats_cluster(base: Path, n: int = 3) -> AsyncIterator[list[NatsServer]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"n{i}-{tag}" for i in range(n)]
    ports = [free_port() for _ in names]
    servers = [
        NatsServer(
            NatsConfig(
                server_name=name,
                store_dir=base / name / "js",
                cluster_port=port,
                routes=tuple(("127.0.0.1", p) for p in ports if p != port),
                cluster_name=f"c-{tag}",
            ),
            work_dir=base / name,
        )
        for name, port in zip(names, ports, strict=True)
    ]
    try:
        await asyncio.gather(*(s.start() for s in servers))
        yield servers
    except BaseException:
        # what the servers said: a failure here is read off their Raft groups' lines
        for s in servers:
            print(f"==== nats-server {s.config.server_name} (pid {s.pid}) ====\n{s.log_tail()}")
        raise
    finally:
        for s in servers:  # a frozen server cannot act on SIGTERM
            if s.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.pid, signal.SIGCONT)
        await asyncio.gather(*(s.stop(timeout=5.0) for s in servers), return_exceptions=True)


@dataclass
class Node:
    """One node's view of shard 0: its NATS connection, the shard's log and store."""

    name: str
    server: NatsServer
    nc: NatsClient
    log: ShardLog
    db: Path
    store: ReplicatedStore
    deposed: list[float] = field(default_factory=list)

    def new_store(self) -> ReplicatedStore:
        local = SqliteStore(self.db, synchronous="NORMAL")
        self.store = ReplicatedStore(
            local, self.log, self.name, on_deposed=lambda: self.deposed.append(time.monotonic())
        )
        return self.store


@contextlib.asynccontextmanager
async def three_nodes(tmp_path: Path, timeout: float = TIMEOUT) -> AsyncIterator[list[Node]]:
    """Three nodes on a fresh cluster, their stores open and tailing shard 0's log (the
    logs' ``timeout``: how long an append may wait for a majority)."""
    async with nats_cluster(tmp_path / "nats") as servers:
        nodes: list[Node] = []
        try:
            for server in servers:
                name = server.config.server_name
                # its own server first, then the others: the servers advertise no client
                # URLs (``no_advertise``, docs/cluster.md "Partitions"), so a client that is to
                # reconnect elsewhere is told where
                others = [s.client_url for s in servers if s is not server]
                nc = await nats.connect(
                    servers=[server.client_url, *others],
                    dont_randomize=True,
                    name=name,
                    no_echo=True,
                    connect_timeout=2,
                    reconnect_time_wait=0.2,
                    max_reconnect_attempts=-1,
                )
                log = ShardLog(nc.jetstream(timeout=timeout), 0, name, replicas=3, timeout=timeout)
                db = tmp_path / name / "shard-000.db"
                node = Node(name, server, nc, log, db, _unopened(db, log, name))
                nodes.append(node)
            deadline = time.monotonic() + 30
            while True:  # the meta leader is elected and every peer known: up to a few s
                try:
                    await nodes[0].log.ensure()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
            for node in nodes:
                await node.log.ensure()  # idempotent on every node
                await node.new_store().open()
            yield nodes
        finally:
            for node in nodes:
                with contextlib.suppress(Exception):
                    await node.store.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(node.nc.close(), 3)


def _unopened(db: Path, log: ShardLog, name: str) -> ReplicatedStore:
    return ReplicatedStore(SqliteStore(db), log, name)


async def state(store: ReplicatedStore) -> tuple[Any, ...]:
    """Everything a shard would load from the store (each read waits until the entries the
    node holds are applied)."""
    return (
        await store.load_destinations(),
        await store.load_messages(Q),
        await store.load_bindings(),
        {k: await store.kv_get(k) for k in await store.kv_keys("", 1000)},
    )


async def converged(nodes: list[Node], within: float = SETTLE) -> tuple[Any, ...]:
    """Wait until every node's SQLite holds what the others hold; that state."""
    last: list[tuple[Any, ...]] = []

    async def same() -> bool:
        last[:] = [await state(n.store) for n in nodes]
        return all(s == last[0] for s in last)

    try:
        await eventually(same, within=within, interval=0.05)
    except AssertionError:
        raise AssertionError(f"the nodes did not converge: {last}") from None
    return last[0]


async def settle(*futures: asyncio.Future[None]) -> None:
    await asyncio.wait_for(asyncio.gather(*futures), SETTLE)


# -- replication ----------------------------------------------------------------------------------


async def test_the_leaders_writes_reach_every_follower(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as nodes:
        a, b, c = (n.store for n in nodes)
        epoch = await a.promote()
        assert a.is_leader and not b.is_leader and not c.is_leader
        assert epoch == a.applied == a.last

        await settle(
            a.write(SaveDestination(Q, {"durable": True}, {"owner": "x"})),
            a.write(AppendMany(Q, [message(i) for i in range(1, 6)])),
            a.write(SaveBindings(Q, ["orders.*"])),
            a.write(SaveValue("k1", b"\x00v1")),
            a.write(SaveValue("k2", b"v2")),
        )
        await settle(a.write(Remove(Q, [2, 4])), a.write(DeleteValue("k2")))
        # the leader reads its own writes as soon as they resolve
        assert [m.seq for m in await a.load_messages(Q)] == [1, 3, 5]
        assert await a.kv_get("k1") == b"\x00v1" and await a.kv_get("k2") is None

        loaded = await converged(nodes)
        destinations, messages, bindings, kv = loaded
        assert [(d.destination, d.options, d.metadata, d.last_seq) for d in destinations] == [
            (Q, {"durable": True}, {"owner": "x"}, 5)
        ]
        assert messages == [message(1), message(3), message(5)]
        assert bindings == [(Q, "orders.*")]
        assert kv == {"k1": b"\x00v1"}
        await eventually(lambda: b.applied == c.applied == a.applied, within=SETTLE)
        for node in nodes:
            assert await node.store.local.applied() == a.applied

        # only the leader takes writes
        with pytest.raises(StoreError, match="not the leader"):
            b.write(SaveValue("k3", b"no"))

        # latency: one write at a time; throughput: many at once (group commit into entries)
        started = time.perf_counter()
        for i in range(100):
            await settle(a.write(SaveValue(f"lat{i}", b"x")))
        one = (time.perf_counter() - started) / 100
        started = time.perf_counter()
        await settle(*(a.write(Append(Q, message(i))) for i in range(100, 3100)))
        many = time.perf_counter() - started
        entries_before = a.applied
        print(
            f"\nreplog: one write at a time {one * 1000:.2f} ms each;"
            f" 3000 concurrent appends in {many * 1000:.0f} ms"
            f" ({3000 / many:.0f}/s, log now at entry {entries_before})"
        )
        assert len((await converged(nodes))[1]) == 3 + 3000


# -- fencing --------------------------------------------------------------------------------------


async def test_a_new_leaders_takeover_fences_the_old_one(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as nodes:
        node_a, node_b, _ = nodes
        a, b = node_a.store, node_b.store
        await a.promote()
        await settle(
            a.write(AppendMany(Q, [message(1), message(2)])), a.write(SaveValue("who", b"a"))
        )
        await converged(nodes)

        # B takes over while A still believes it leads; A keeps writing all along
        taken: list[int] = []
        a_results: list[tuple[int, str]] = []  # (seq, "ok" | "failed")

        async def a_keeps_writing() -> None:
            """Until a write fails: refused at once (A's tail saw B's takeover first), or
            failed by the fence (A's append expected an older last entry)."""
            for i in range(3, 5000):
                try:
                    await asyncio.wait_for(a.write(Append(Q, message(i))), SETTLE)
                    a_results.append((i, "ok"))
                except StoreError:
                    a_results.append((i, "failed"))
                    return

        async def b_takes_over() -> None:
            await asyncio.sleep(0.05)
            taken.append(await b.promote())

        await asyncio.wait_for(asyncio.gather(a_keeps_writing(), b_takes_over()), 30)
        assert b.is_leader and not a.is_leader
        assert len(node_a.deposed) == 1 and not node_b.deposed
        assert a_results[-1][1] == "failed"
        assert all(r == "ok" for _, r in a_results[:-1])

        # A's next write fails too (it knows it does not lead now); B's succeed
        with pytest.raises(StoreError):
            await asyncio.wait_for(a.write(SaveValue("who", b"a again")), SETTLE)
        await settle(b.write(SaveValue("who", b"b")), b.write(Remove(Q, [1])))

        _, messages, _, kv = await converged(nodes)
        confirmed = [seq for seq, r in a_results if r == "ok"]
        assert [m.seq for m in messages] == [2, *confirmed]  # nothing A was told failed
        assert kv == {"who": b"b"}
        assert a.applied == b.applied


class GatedLog(ShardLog):
    """A ShardLog whose tail stops delivering while ``gate`` is clear: a node that has
    not seen the newest entries yet (a slow or partitioned tail)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate = asyncio.Event()
        self.gate.set()

    def tail(
        self, start: int, on_entry: Callable[[int, bytes], Awaitable[None]]
    ) -> asyncio.Task[None]:
        async def gated(seq: int, data: bytes) -> None:
            await self.gate.wait()
            await on_entry(seq, data)

        return super().tail(start, gated)


async def test_an_old_leader_that_missed_the_takeover_is_fenced_by_the_log(
    tmp_path: Path,
) -> None:
    async with three_nodes(tmp_path) as nodes:
        node_a, node_b, _ = nodes
        await node_a.store.close()
        old = node_a.log
        node_a.log = GatedLog(old.js, 0, node_a.name, replicas=3, timeout=TIMEOUT)
        a = node_a.new_store()
        await a.open()
        b = node_b.store
        await a.promote()
        await settle(a.write(Append(Q, message(1))))
        await converged(nodes)

        node_a.log.gate.clear()  # A sees nothing from now on
        await b.promote()
        assert a.is_leader  # A has not heard
        started = time.monotonic()
        future = a.write(Append(Q, message(2)))  # taken: A believes it leads
        with pytest.raises(StoreError, match="deposed"):
            await asyncio.wait_for(future, SETTLE)
        assert time.monotonic() - started < TIMEOUT + 1.5
        assert not a.is_leader and len(node_a.deposed) == 1

        await settle(b.write(Append(Q, message(3))))
        node_a.log.gate.set()
        _, messages, _, _ = await converged(nodes)
        assert [m.seq for m in messages] == [1, 3]


async def test_an_append_on_a_stale_sequence_is_deposed(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as nodes:
        shard_log = nodes[0].log
        _, last = await shard_log.info()
        seq = await shard_log.append(encode_entry("x", 1, [], takeover=True), expected_last=last)
        assert seq == last + 1
        with pytest.raises(Deposed, match="wrong last sequence"):
            await shard_log.append(encode_entry("y", 1, [], takeover=True), expected_last=last)
        leader, now = await nodes[1].log.info()
        assert now == seq and leader in {n.name for n in nodes}


async def test_writes_in_flight_when_jetstream_moves_the_leader_are_settled_at_once(
    tmp_path: Path,
) -> None:
    """JetStream moves the stream's leader again and again (nats-server's own step-downs,
    as a thawed node's election does) under four writers. A leader that steps down never
    answers some of the appends in flight; told of the new leader (its advisory, as
    polymq_core.cluster.leadership tells every node's log), the store sends such an entry
    again on the same fence and is answered once the new leader is. Every write is
    confirmed, none waits out the log's timeout (the core's default here: a step-down's
    election may take a second or more on a loaded machine), and every confirmed write is
    on every node, once."""
    async with three_nodes(tmp_path, timeout=CORE_TIMEOUT) as nodes:
        a = nodes[0].store
        await a.promote()
        for node in nodes:

            async def elected(msg: Any, log: ShardLog = node.log) -> None:
                log.nudge()

            await node.nc.subscribe(
                f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{node.log.stream}", cb=elected
            )
        took: list[float] = []
        failed: list[str] = []
        confirmed: list[int] = []
        moves: list[bool] = []
        done = asyncio.Event()

        async def writer(first: int) -> None:
            seq = first
            while not done.is_set():
                seq += 4
                started = time.monotonic()
                try:
                    await asyncio.wait_for(a.write(Append(Q, message(seq))), SETTLE)
                    confirmed.append(seq)
                except StoreError as exc:
                    failed.append(str(exc))
                took.append(time.monotonic() - started)
                await asyncio.sleep(0.002)

        async def jetstream_moves_the_leader() -> None:
            for _ in range(8):
                await asyncio.sleep(1.0)
                answer = await nodes[1].nc.request(
                    f"$JS.API.STREAM.LEADER.STEPDOWN.{nodes[1].log.stream}", b"", timeout=TIMEOUT
                )
                moves.append(bool(json.loads(answer.data).get("success")))
            await asyncio.sleep(1.0)
            done.set()

        await asyncio.gather(jetstream_moves_the_leader(), *(writer(k) for k in range(4)))
        assert moves == [True] * 8
        assert failed == []
        assert max(took) < CORE_TIMEOUT, sorted(took)[-5:]
        _, messages, _, _ = await converged(nodes, within=20)
        assert sorted(m.seq for m in messages) == sorted(confirmed)
        assert len(confirmed) > 1000


# -- restart --------------------------------------------------------------------------------------


async def test_a_restarted_follower_applies_only_the_tail(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as nodes:
        a = nodes[0].store
        await a.promote()
        await settle(
            a.write(AppendMany(Q, [message(i) for i in range(1, 11)])),
            a.write(SaveValue("k", b"1")),
        )
        await converged(nodes)
        follower = nodes[2]
        await follower.store.close()
        closed_at = await _applied_in_file(follower.db)
        assert closed_at == await a.sync()

        for i in range(11, 31):
            await settle(a.write(Append(Q, message(i))), a.write(Remove(Q, [i - 10])))
        await settle(a.write(SaveValue("k", b"2")))
        expected_entries = await a.sync() - closed_at
        assert expected_entries >= 21

        store = follower.new_store()
        entries: list[int] = []
        store.local.on_commit = lambda _seconds, n: entries.append(n)
        await store.open()
        assert store.applied == closed_at  # continuity: it starts where its file stopped
        _, messages, _, kv = await converged(nodes)
        assert [m.seq for m in messages] == list(range(21, 31))
        assert kv == {"k": b"2"}
        assert await store.local.applied() == await a.sync()
        assert sum(entries) == expected_entries  # the tail, every entry once, nothing more


async def _applied_in_file(db: Path) -> int:
    local = SqliteStore(db)
    await local.open()
    try:
        return await local.applied()
    finally:
        await local.close()


# -- the stream's own failures -------------------------------------------------------------------


async def write_until_done(store: ReplicatedStore, seq: int) -> None:
    """Append ``message(seq)``, again if the log was unavailable meanwhile."""

    async def attempt() -> bool:
        try:
            await asyncio.wait_for(store.write(Append(Q, message(seq))), SETTLE)
            return True
        except StoreError:
            return False

    await eventually(attempt, within=30, interval=0.1)


async def test_tails_survive_a_new_stream_leader_and_a_restarted_server(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as nodes:
        a = nodes[0].store
        await a.promote()
        for i in range(1, 11):
            await write_until_done(a, i)
        await converged(nodes)

        before, _ = await nodes[0].log.info()
        await nodes[0].log.step_down()

        async def new_leader() -> bool:
            with contextlib.suppress(Exception):
                leader, _ = await nodes[0].log.info()
                return leader is not None and leader != before
            return False

        await eventually(new_leader, within=SETTLE, interval=0.1)
        for i in range(11, 21):
            await write_until_done(a, i)

        # a follower's own server goes away and comes back: its client reconnects elsewhere
        follower = nodes[2]
        await follower.server.stop()
        for i in range(21, 31):
            await write_until_done(a, i)
        await follower.server.start()
        for i in range(31, 41):
            await write_until_done(a, i)

        _, messages, _, _ = await converged(nodes, within=20)
        assert [m.seq for m in messages] == list(range(1, 41))
        assert a.is_leader and not any(n.deposed for n in nodes)
        await eventually(lambda: len({n.store.applied for n in nodes}) == 1, within=SETTLE)


async def test_a_node_whose_next_entry_was_purged_stops_tailing_and_says_so(
    tmp_path: Path,
) -> None:
    async with three_nodes(tmp_path) as nodes:
        a = nodes[0].store
        await a.promote()
        for i in range(1, 6):
            await write_until_done(a, i)
        await converged(nodes)
        await nodes[0].log.purge_below(a.applied)  # keeps the last entry only
        _, last = await nodes[0].log.info()
        assert last == a.applied

        wiped = nodes[2]
        await wiped.store.close()
        for path in wiped.db.parent.glob(wiped.db.name + "*"):
            path.unlink()
        store = wiped.new_store()
        await store.open()
        await eventually(lambda: store.tail_error is not None, within=SETTLE)
        assert "purged" in str(store.tail_error)
        assert store.applied == 0
        with pytest.raises(LogUnavailable, match="purged"):
            await store.promote(timeout=0.5)
        # the others go on
        await settle(a.write(Append(Q, message(6))))
        await eventually(lambda: nodes[1].store.applied == a.applied, within=SETTLE)


# -- no majority ----------------------------------------------------------------------------------


async def test_without_a_majority_a_write_fails_and_is_never_confirmed(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as nodes:
        a = nodes[0].store
        await a.promote()
        await settle(a.write(SaveValue("k", b"before")))
        await converged(nodes)

        frozen = []
        pids = [n.server.pid for n in nodes]
        try:
            for pid in pids[1:]:
                assert pid is not None
                frozen.append(pid)
            freeze(*frozen)  # (every thread: a SIGSTOP is not done when kill returns)
            started = time.monotonic()
            last = a.last
            future = a.write(SaveValue("k", b"during"))
            with pytest.raises(StoreError, match="unavailable"):
                await asyncio.wait_for(future, 3 * TIMEOUT)
                print(  # (reached only if it was confirmed: say what, before the test fails)
                    f"confirmed without a majority: entry {a.last} (the last was {last})"
                    f" after {time.monotonic() - started:.3f} s; stopped {frozen}"
                    f" of {pids}; every thread stopped: {[threads_stopped(p) for p in frozen]}"
                )
            took = time.monotonic() - started
            assert took < TIMEOUT + 1.5, took
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)

        # the cluster recovers; A never confirmed "during", and writes again (taking over
        # anew if it was deposed on the way)
        assert isinstance(future.exception(), StoreError)

        async def writes_again() -> bool:
            try:
                if not a.is_leader:
                    await a.promote(timeout=2 * TIMEOUT)
                await asyncio.wait_for(a.write(SaveValue("k", b"after")), SETTLE)
                return True
            except Exception:
                return False

        await eventually(writes_again, within=30, interval=0.2)
        _, _, _, kv = await converged(nodes, within=20)
        assert kv == {"k": b"after"}
        assert not any(n.deposed for n in nodes[1:])
