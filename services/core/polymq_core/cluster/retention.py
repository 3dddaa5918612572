"""Keeping each shard's log bounded, and a shard's copy for a node that fell behind it: the
part of :class:`~polymq_core.cluster.node.ClusterNode` that acts on them (docs/cluster.md,
"Writes"; where to purge and whom to copy from are :mod:`polymq_core.cluster.snapshot`'s pure
functions, the copy itself :mod:`polymq_core.store.filecopy`'s).

The leader of each shard purges its log every ``purge_every`` seconds, below what every node
announced it applied, keeping at least ``keep_entries`` entries (fewer if they hold more
than ``keep_bytes``) and at most ``max_entries``.
A node whose next entry was purged copies the shard from another node's admin HTTP
(:meth:`LogRetention.fetch_snapshot`, handed to its
:class:`~polymq_core.replication.replicatedstore.
ReplicatedStore`); :meth:`LogRetention.snapshot` makes the copy a node serves there.

It is a part the node owns and calls (nothing here runs per message): it holds its
settings and where snapshots are made; what it uses of the node (its id, the cluster secret
and TLS, its shards' logs and stores, the membership, who leads a shard) is a
:class:`RetentionHost`. The node runs :meth:`LogRetention.purge_logs` as its own task.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

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
    from ..replication.jetstream import ShardLog
    from ..replication.replicatedstore import ReplicatedStore
    from .membership import Membership, PeerInfo
    from .tls import ClusterTls

__all__ = ["LogRetention", "RetentionHost"]

log = logging.getLogger(__name__)


class RetentionHost(Protocol):
    """What purging and copying shards use of the node
    (:class:`~polymq_core.cluster.node.ClusterNode`)."""

    node_id: str
    secret: str  # the cluster secret: a snapshot's bearer token
    tls: ClusterTls | None
    peer_ssl: ssl.SSLContext | None  # cluster TLS: links to peers use it
    membership: Membership | None  # the other nodes (None until started)
    logs: list[ShardLog]  # per shard: its stream
    stores: list[ReplicatedStore]  # per shard: its store, applying the log

    def leader_of(self, shard: int) -> str | None: ...  # who leads the shard's stream


class LogRetention:
    """Purging the logs this node leads, and shard copies for nodes that fell behind (see
    the module's docstring). ``snapshot_dir``: the folder the copies this node serves are made
    in; the other settings as :class:`~polymq_core.cluster.node.ClusterNode` takes them."""

    def __init__(
        self,
        host: RetentionHost,
        snapshot_dir: Path,
        *,
        purge_every: float,
        keep_entries: int,
        keep_bytes: int,
        max_entries: int | None,
    ) -> None:
        if purge_every <= 0:
            raise ValueError("purge_every must be positive")
        purge_point(None, first=1, last=1, keep=keep_entries, most=max_entries)  # checks them
        self.host = host
        self.snapshot_dir = snapshot_dir
        self.purge_every = purge_every
        self.keep_entries = keep_entries
        self.keep_bytes = keep_bytes
        self.max_entries = max_entries

    async def purge_logs(self) -> None:
        """Every ``purge_every`` seconds, purge the logs of the shards this node leads."""
        while True:
            await asyncio.sleep(self.purge_every)
            for i, store in enumerate(self.host.stores):
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
        if self.host.membership is None:
            return 0
        shard_log = self.host.logs[index]
        lowest = lowest_applied(self.host.membership.peers().values(), index)
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

    async def snapshot(self, shard: int) -> tuple[Path, int]:
        """A consistent copy of shard ``shard``'s SQLite in a new file (the caller removes
        it) and the log sequence applied in it: what ``GET /api/cluster/snapshot/<shard>``
        serves. IndexError for no such shard, StoreError if it cannot be copied now."""
        if not 0 <= shard < len(self.host.stores):
            raise IndexError(f"no shard {shard}")
        path = self.snapshot_dir / f"shard-{shard:03d}-{uuid.uuid4().hex}.db"
        try:
            return path, await self.host.stores[shard].snapshot(path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    async def fetch_snapshot(self, index: int, target: Path) -> int:
        """Copy shard ``index`` from another node into ``target`` (its leader if it can,
        else a node that announced enough applied); the sequence applied in the copy."""
        membership = self.host.membership
        if membership is None:
            raise SnapshotError("no other node heard from yet")
        try:
            first: int | None = (await self.host.logs[index].span())[0]
        except LogError:
            first = None
        reachable = [
            peer
            for peer in membership.peers().values()
            if membership.state_of(peer.node_id) not in (LEAVING, UNREACHABLE)
        ]
        sources = snapshot_sources(
            reachable, index, me=self.host.node_id, leader=self.host.leader_of(index), first=first
        )
        if not sources:
            needed = f" applied up to entry {first - 1}" if first else ""
            raise SnapshotError(f"no reachable node has announced shard {index}{needed}")
        failures = []
        for peer in sources:
            try:
                url = snapshot_url(self._admin_url_of(peer), index)
                applied = await download(url, self.host.secret, target, ssl=self.host.peer_ssl)
            except SnapshotError as exc:
                failures.append(str(exc))
                continue
            log.info("shard %d: copied from node %s at entry %d", index, peer.node_id, applied)
            return applied
        raise SnapshotError("; ".join(failures))

    def _admin_url_of(self, peer: PeerInfo) -> str:
        """Where ``peer`` serves snapshots: its admin URL, or with cluster TLS its admin
        listener for peers (https, a certificate both ways)."""
        if self.host.tls is None:
            return peer.admin_url
        address = peer.addresses.get("peer_admin")
        if address is None:
            raise SnapshotError(
                f"node {peer.node_id} announced no TLS admin listener for peers: is cluster "
                "TLS on there?"
            )
        return f"https://{address}/"
