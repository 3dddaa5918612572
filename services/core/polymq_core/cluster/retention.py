"""Keeping each shard's log bounded, and a shard's copy for a node that fell behind it: the
part of :class:`~polymq_core.cluster.node.ClusterNode` that acts on them (docs/cluster.md,
"Writes"; where to purge and whom to copy from are :mod:`polymq_core.cluster.snapshot`'s pure
functions, the copy itself :mod:`polymq_core.store.filecopy`'s).

The leader of each shard purges its log every ``purge_every`` seconds, below what every node
announced it applied, keeping at least ``keep_entries`` entries (fewer if they hold more
than ``keep_bytes``) and at most ``max_entries``.
A node whose next entry was purged copies the shard from another node's admin HTTP
(:meth:`LogRetention._fetch_snapshot`, handed to its
:class:`~polymq_core.replication.replicatedstore.
ReplicatedStore`); :meth:`LogRetention.snapshot` makes the copy a node serves there.

It is a mixin: the node holds the state (its settings, shards' logs and stores, the
membership, the leaders it knows, the cluster secret and TLS), declared here.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ..store.logentry import LogError
from .membership import LEAVING, UNREACHABLE
from .snapshot import (
    SnapshotError,
    download,
    kept_entries,
    lowest_applied,
    purge_point,
    snapshot_sources,
    snapshot_url,
)

if TYPE_CHECKING:
    from ..config import CoreSettings
    from ..replication.jetstream import ShardLog
    from ..replication.replicatedstore import ReplicatedStore
    from .membership import Membership, PeerInfo
    from .tls import ClusterTls

__all__ = ["LogRetention"]

log = logging.getLogger(__name__)


class LogRetention:
    """Purging the logs this node leads, and shard copies for nodes that fell behind (see
    the module's docstring)."""

    # what the node holds (ClusterNode.__init__ makes it)
    settings: CoreSettings
    node_id: str
    secret: str  # the cluster secret: a snapshot's bearer token
    tls: ClusterTls | None
    peer_ssl: ssl.SSLContext | None  # cluster TLS: links to peers use it
    membership: Membership | None
    logs: list[ShardLog]
    stores: list[ReplicatedStore]
    leaders: dict[int, str | None]
    purge_every: float
    keep_entries: int
    keep_bytes: int
    max_entries: int | None

    async def _purge_logs(self) -> None:
        """Every ``purge_every`` seconds, purge the logs of the shards this node leads."""
        while True:
            await asyncio.sleep(self.purge_every)
            for i, store in enumerate(self.stores):
                if not store.is_leader:
                    continue
                try:
                    await self.purge(i)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("shard %d: purging its log failed: %s", i, exc)

    async def purge(self, index: int) -> int:
        """Purge shard ``index``'s log below what every node announced it applied (keeping
        at least ``keep_entries``, or ``keep_bytes`` worth: :func:`kept_entries`); the
        sequence purged below, 0 if nothing was."""
        if self.membership is None:
            return 0
        shard_log = self.logs[index]
        lowest = lowest_applied(self.membership.peers().values(), index)
        first, last, entries, nbytes = await shard_log.extent()
        keep = kept_entries(self.keep_entries, self.keep_bytes, entries=entries, nbytes=nbytes)
        point = purge_point(lowest, first=first, last=last, keep=keep, most=self.max_entries)
        if point:
            await shard_log.purge_below(point)
            log.info(
                "shard %d: purged its log below entry %d (every node applied %s; last %d)",
                index,
                point,
                lowest,
                last,
            )
        return point

    @property
    def _snapshots(self) -> Path:
        return self.settings.data_dir / "snapshots"

    async def snapshot(self, shard: int) -> tuple[Path, int]:
        """A consistent copy of shard ``shard``'s SQLite in a new file (the caller removes
        it) and the log sequence applied in it: what ``GET /api/cluster/snapshot/<shard>``
        serves. IndexError for no such shard, StoreError if it cannot be copied now."""
        if not 0 <= shard < len(self.stores):
            raise IndexError(f"no shard {shard}")
        path = self._snapshots / f"shard-{shard:03d}-{uuid.uuid4().hex}.db"
        try:
            return path, await self.stores[shard].snapshot(path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    async def _fetch_snapshot(self, index: int, target: Path) -> int:
        """Copy shard ``index`` from another node into ``target`` (its leader if it can,
        else a node that announced enough applied); the sequence applied in the copy."""
        membership = self.membership
        if membership is None:
            raise SnapshotError("no other node heard from yet")
        try:
            first: int | None = (await self.logs[index].span())[0]
        except LogError:
            first = None
        reachable = [
            peer
            for peer in membership.peers().values()
            if membership.state_of(peer.node_id) not in (LEAVING, UNREACHABLE)
        ]
        sources = snapshot_sources(
            reachable, index, me=self.node_id, leader=self.leaders.get(index), first=first
        )
        if not sources:
            needed = f" applied up to entry {first - 1}" if first else ""
            raise SnapshotError(f"no reachable node has announced shard {index}{needed}")
        failures = []
        for peer in sources:
            try:
                url = snapshot_url(self._admin_url_of(peer), index)
                applied = await download(url, self.secret, target, ssl=self.peer_ssl)
            except SnapshotError as exc:
                failures.append(str(exc))
                continue
            log.info("shard %d: copied from node %s at entry %d", index, peer.node_id, applied)
            return applied
        raise SnapshotError("; ".join(failures))

    def _admin_url_of(self, peer: PeerInfo) -> str:
        """Where ``peer`` serves snapshots: its admin URL, or with cluster TLS its admin
        listener for peers (https, a certificate both ways)."""
        if self.tls is None:
            return peer.admin_url
        address = peer.addresses.get("peer_admin")
        if address is None:
            raise SnapshotError(
                f"node {peer.node_id} announced no TLS admin listener for peers: is cluster "
                "TLS on there?"
            )
        return f"https://{address}/"
