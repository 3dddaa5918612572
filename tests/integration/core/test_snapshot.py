"""A bounded log and snapshots against a real three-node JetStream cluster (the nats-servers
and stores of tests/integration/core/test_replog.py) and the core's real admin HTTP on
127.0.0.1: the leader's purge keeps what a lagging node still needs and the last entries;
a node with a wiped data dir, whose next entry was purged, copies the shard from the
leader's admin port (cluster secret as a bearer token) and tails on; and nobody without
the secret gets a shard."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq_core.admin.app import admin_app
from polymq_core.broker import Broker
from polymq_core.cluster.membership import READY, UNREACHABLE, PeerInfo
from polymq_core.cluster.node import ClusterNode
from polymq_core.cluster.snapshot import APPLIED_HEADER, SnapshotError, download, snapshot_url
from polymq_core.config import CoreSettings
from polymq_core.metrics import Sensors
from polymq_core.replication.replicatedstore import ReplicatedStore
from polymq_core.store.filecopy import check_snapshot
from polymq_core.store.sqlite import SqliteStore
from polymq_core.store.writes import Append, Remove, SaveBindings, SaveDestination, SaveValue
from polymq_server.auth.provider import load_provider

from .helpers import eventually
from .test_replog import SETTLE, Node, Q, converged, message, settle, three_nodes

pytestmark = pytest.mark.timeout(90)

SECRET = "s" * 40


class Heard:
    """What ClusterNode uses of Membership: the nodes heard and their states."""

    def __init__(self, *peers: PeerInfo) -> None:
        self.known = {p.node_id: p for p in peers}
        self.states: dict[str, str] = {}

    def peers(self) -> dict[str, PeerInfo]:
        return dict(self.known)

    def state_of(self, node_id: str) -> str:
        return self.states.get(node_id, self.known[node_id].state)

    def announce(self, node: str, applied: int, url: str = "") -> None:
        self.known[node] = PeerInfo(node, admin_url=url, applied={0: applied}, state=READY)


def cluster_node(tmp_path: Path, node: Node, heard: Heard, **kw: float) -> ClusterNode:
    """A ClusterNode for shard 0 of ``node`` (not connected: its log and store are the
    test's), hearing ``heard``."""
    settings = CoreSettings(
        peers="127.0.0.1:1",
        node_id=node.name,
        cluster_secret=SECRET,
        data_dir=tmp_path / f"data-{node.name}",
        shards=1,
    )
    cluster = ClusterNode(settings, **kw)  # type: ignore[arg-type]
    cluster.logs = [node.log]
    cluster.stores = [node.store]
    cluster.membership = heard  # type: ignore[assignment]
    return cluster


@contextlib.asynccontextmanager
async def admin(tmp_path: Path, view: ClusterNode | None) -> AsyncIterator[str]:
    """The core's admin app for ``view`` on a free 127.0.0.1 port; its base URL."""
    settings = CoreSettings(data_dir=tmp_path / "broker", shards=1)
    broker = Broker(settings, Sensors(CollectorRegistry()), load_provider("anonymous"))
    runner = web.AppRunner(admin_app(broker, CollectorRegistry(), view), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


async def first_entry(node: Node) -> int:
    first, _ = await node.log.span()
    return first


# -- the bounded log -----------------------------------------------------------------------------


async def test_the_leader_purges_what_every_node_applied_and_keeps_the_last(
    tmp_path: Path,
) -> None:
    async with three_nodes(tmp_path) as nodes:
        a = nodes[0].store
        await a.promote()
        for i in range(1, 31):
            await settle(a.write(Append(Q, message(i))))
        await converged(nodes)
        _, last = await nodes[0].log.span()
        assert last == a.applied >= 31

        names = [n.name for n in nodes]
        heard = Heard(
            PeerInfo(names[0], applied={0: last}),
            PeerInfo(names[1], applied={0: last}),
            PeerInfo(names[2], applied={0: 10}),  # down since entry 10: still waited for
        )
        heard.states[names[2]] = UNREACHABLE
        leader = cluster_node(tmp_path, nodes[0], heard, keep_entries=5)
        assert await leader.retention.purge(0) == 11
        assert await first_entry(nodes[0]) == 11
        assert await leader.retention.purge(0) == 0  # nothing more to purge

        heard.announce(names[2], last)  # back, caught up: only the last 5 are kept
        assert await leader.retention.purge(0) == last - 4
        assert await first_entry(nodes[1]) == last - 4

        heard.known[names[1]] = replace(heard.known[names[1]], state="leaving")
        heard.announce(names[2], 0)  # wiped, copying a snapshot: nothing more goes
        await settle(a.write(Append(Q, message(31))))
        assert await leader.retention.purge(0) == 0
        # a node that left is not waited for
        heard.announce(names[2], last + 1)
        heard.known[names[1]] = replace(heard.known[names[1]], applied={0: 0})
        assert await leader.retention.purge(0) == last - 3

        # every node still tails: nothing they needed went
        await settle(a.write(Append(Q, message(32))))
        _, messages, _, _ = await converged(nodes)
        assert [m.seq for m in messages] == list(range(1, 33))


async def test_the_last_entries_kept_are_bounded_by_bytes_too(tmp_path: Path) -> None:
    """Entries larger than the bytes kept: fewer of them stay than ``keep_entries`` says
    (a publisher's window of 1 KB messages is one entry of megabytes)."""
    async with three_nodes(tmp_path) as nodes:
        a = nodes[0].store
        await a.promote()
        for i in range(1, 21):
            await settle(a.write(Append(Q, message(i, body=bytes(20_000)))))
        await converged(nodes)
        first, last, entries, nbytes = await nodes[0].log.extent()
        assert (first, entries) == (1, last) and nbytes > 20 * 20_000
        heard = Heard(*(PeerInfo(n.name, applied={0: last}) for n in nodes))
        # 100 entries kept, unless they hold more than ~5 entries' bytes
        leader = cluster_node(
            tmp_path, nodes[0], heard, keep_entries=100, keep_bytes=-(-5 * nbytes // entries)
        )
        point = await leader.retention.purge(0)
        assert point == last - 4  # the last 5 stay
        assert await first_entry(nodes[1]) == point
        _, messages, _, _ = await converged(nodes)
        assert [m.seq for m in messages] == list(range(1, 21))  # (the stores keep them)


async def test_the_purge_runs_by_itself_on_the_leader_only(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as nodes:
        a = nodes[0].store
        await a.promote()
        for i in range(1, 11):
            await settle(a.write(Append(Q, message(i))))
        await converged(nodes)
        heard = Heard(*(PeerInfo(n.name, applied={0: n.store.applied}) for n in nodes))
        # were the follower to purge, it would keep only 1
        follower = cluster_node(tmp_path, nodes[1], heard, purge_every=0.1, keep_entries=1)
        leader = cluster_node(tmp_path, nodes[0], heard, purge_every=0.1, keep_entries=2)
        loop = asyncio.get_running_loop()
        follower._purger = loop.create_task(follower.retention.purge_logs())
        leader._purger = loop.create_task(leader.retention.purge_logs())
        try:
            _, last = await nodes[0].log.span()

            async def purged() -> bool:
                return await first_entry(nodes[0]) == last - 1

            await eventually(purged, within=SETTLE)
            await asyncio.sleep(0.5)
            assert await first_entry(nodes[0]) == last - 1
        finally:
            for cluster in (follower, leader):
                assert cluster._purger is not None
                cluster._purger.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await cluster._purger


# -- snapshots -----------------------------------------------------------------------------------


async def test_a_wiped_node_copies_the_shard_from_the_leader_and_tails_on(
    tmp_path: Path,
) -> None:
    async with three_nodes(tmp_path) as nodes:
        node_a, _, node_c = nodes
        a = node_a.store
        await a.promote()
        await settle(
            a.write(SaveDestination(Q, {"durable": True}, {"owner": "x"})),
            a.write(SaveBindings(Q, ["orders.*"])),
            a.write(SaveValue("k", b"\x00v")),
        )
        for i in range(1, 41):
            await settle(a.write(Append(Q, message(i))))
        await settle(a.write(Remove(Q, list(range(1, 11)))))
        before = await converged(nodes)

        heard = Heard()
        leader = cluster_node(tmp_path, node_a, heard)
        async with admin(tmp_path, leader) as url:
            for n in nodes:
                heard.announce(n.name, n.store.applied, url if n is node_a else "")
            assert await leader.retention.purge(0) == 0  # the default keeps the last 10,000
            await node_a.log.purge_below(a.applied)  # as if far more had been written

            # node c's data dir is wiped: its next entry (1) is long gone
            await node_c.store.close()
            for path in node_c.db.parent.glob(node_c.db.name + "*"):
                path.unlink()
            joiner = cluster_node(tmp_path, node_c, heard)
            joiner.leadership.leaders[0] = node_a.name
            fetched: list[float] = []
            fetch = functools.partial(joiner.retention.fetch_snapshot, 0)

            async def counted(target: Path) -> int:
                fetched.append(time.monotonic())
                return await fetch(target)

            commits: list[int] = []
            local = SqliteStore(node_c.db, synchronous="NORMAL")
            local.on_commit = lambda _seconds, n: commits.append(n)
            node_c.store = ReplicatedStore(local, node_c.log, node_c.name, fetch_snapshot=counted)
            await node_c.store.open()
            store = node_c.store
            # (its file is closed for a moment while the copy goes in place: wait for that)
            await eventually(lambda: store.applied > 0 and not store.restoring, within=20)

            after = await converged(nodes)
            assert after == before
            assert len(fetched) == 1 and not commits  # one copy, no entry replayed
            assert node_c.store.applied == a.applied and node_c.store.tail_error is None
            leftovers = list((tmp_path / f"data-{node_a.name}" / "snapshots").glob("*"))
            assert leftovers == []
            assert not node_c.db.with_name(node_c.db.name + ".snapshot").exists()
            copied_at = node_c.store.applied

            # it tails on from the copy's entry
            await settle(a.write(Append(Q, message(41))), a.write(SaveValue("k", b"after")))
            _, messages, _, kv = await converged(nodes)
            assert [m.seq for m in messages] == list(range(11, 42)) and kv == {"k": b"after"}
            assert node_c.store.applied == a.applied
            assert sum(commits) == a.applied - copied_at  # each entry after the copy, once

            # and it can lead: the copy is the shard
            await node_c.store.promote(timeout=SETTLE)
            await settle(node_c.store.write(Append(Q, message(42))))
            _, messages, _, _ = await converged(nodes)
            assert messages[-1].seq == 42


# -- the admin route ------------------------------------------------------------------------------


@dataclass
class OneStore:
    """A shard's store as the snapshot route needs it: a SQLite file, no log."""

    local: SqliteStore

    async def snapshot(self, path: Path) -> int:
        return await self.local.backup(path)


async def test_the_snapshot_route_is_for_peers_only(tmp_path: Path) -> None:
    local = SqliteStore(tmp_path / "shard.db")
    await local.open()
    try:
        await local.apply_entry(7, [local.encode(SaveValue("k", b"v"))])
        settings = CoreSettings(
            peers="127.0.0.1:1", node_id="a", cluster_secret=SECRET, data_dir=tmp_path, shards=1
        )
        view = ClusterNode(settings)
        view.stores = [OneStore(local)]  # type: ignore[list-item]
        async with admin(tmp_path, view) as url, aiohttp.ClientSession() as http:
            route = snapshot_url(url, 0)
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": SECRET},
                {"Authorization": f"Basic {SECRET}"},
                {"Authorization": f"Bearer {SECRET}x"},
            ):
                async with http.get(route, headers=headers) as response:
                    assert response.status == 401, headers
                    assert response.headers["WWW-Authenticate"].startswith("Bearer")
                    assert APPLIED_HEADER not in response.headers
                    assert b"SQLite" not in await response.read()
            with pytest.raises(SnapshotError, match="401"):
                await download(route, "wrong", tmp_path / "stolen.db")

            peer = {"Authorization": f"Bearer {SECRET}"}
            async with http.get(snapshot_url(url, 1), headers=peer) as response:
                assert response.status == 404
            async with http.get(route, headers=peer) as response:
                assert response.status == 200
                assert response.headers[APPLIED_HEADER] == "7"
                assert (await response.read()).startswith(b"SQLite format 3\x00")
            assert await download(route, SECRET, tmp_path / "copy.db") == 7
            assert await asyncio.to_thread(check_snapshot, tmp_path / "copy.db") == 7
            assert list((tmp_path / "snapshots").glob("*")) == []  # served copies are removed

        async with admin(tmp_path, None) as url, aiohttp.ClientSession() as http:
            peer = {"Authorization": f"Bearer {SECRET}"}
            async with http.get(snapshot_url(url, 0), headers=peer) as response:
                assert response.status == 404  # a single node has no snapshots to give
    finally:
        await local.close()
