"""How many replicas each shard's stream has, kept by its leader (docs/cluster.md,
"Stopping a node": leaving for good): the :class:`Replicas`, a part of
:class:`~polymq_core.cluster.leadership.ShardLeadership`.

The leader of a stream takes the replicas of nodes gone for good out of it, and grows it
back to three as nodes join; the leadership asks at each look that finds this node leading
a stream (:meth:`Replicas.tend`). It holds the changes under way, one per shard at most;
what it uses of the node (the membership, the shards' logs) is a :class:`ReplicasHost`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from ..store.logentry import LogError

if TYPE_CHECKING:
    from ..replication.jetstream import ShardLog
    from .membership import Membership

__all__ = ["Replicas", "ReplicasHost"]

log = logging.getLogger(__name__)

# seconds a shard whose replicas failed to change waits before a look may try again (as
# long as the balancer waits between its looks)
_AGAIN_AFTER = 10.0


class ReplicasHost(Protocol):
    """What the replicas' keeping uses of its node
    (:class:`~polymq_core.cluster.node.ClusterNode`)."""

    membership: Membership | None  # the other nodes, gone for good or ready (None until started)
    logs: list[ShardLog]  # per shard: its stream, its replicas changed here


class Replicas:
    """Shrinking and growing the shards' streams this node leads: a
    :class:`~polymq_core.cluster.leadership.ShardLeadership`'s part (see the module's
    docstring)."""

    def __init__(self, host: ReplicasHost) -> None:
        self.host = host
        self._resizing: dict[int, asyncio.Task[None]] = {}  # per shard: its replicas changing

    def tend(self, i: int) -> None:
        """This node leads shard ``i``'s stream: start changing its replicas if some are
        gone for good or it should have more (unless a change is under way)."""
        if i in self._resizing:
            return
        gone, more = self._gone_replicas(i), self._more_replicas(i)
        step = self._drop_gone if gone else self._grow if more else None
        if step is not None:
            self._resizing[i] = asyncio.get_running_loop().create_task(
                self._resize(i, step), name=f"resize-{i}"
            )

    def cancel(self) -> None:
        """Stopping: cancel the replica changes under way."""
        for task in list(self._resizing.values()):
            task.cancel()

    async def _resize(self, i: int, step: Callable[[int], Awaitable[None]]) -> None:
        """``step(i)``: change shard ``i``'s stream's replicas; one that fails is logged
        and tried again at a look after _AGAIN_AFTER."""
        try:
            await step(i)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: changing its replicas failed (%s)", self.host.logs[i].stream, exc)
            await asyncio.sleep(_AGAIN_AFTER)
        finally:
            self._resizing.pop(i, None)

    def _more_replicas(self, i: int) -> int:
        """How many replicas shard ``i``'s stream should have, if more than it has: one
        per ready node, at most three (a stream scaled down grows back when nodes join;
        one is never shrunk here)."""
        membership = self.host.membership
        if membership is None or not self.host.logs[i].peers:
            return 0
        ready = [n for n in membership.peers() if membership.state_of(n) == "ready"]
        wanted = min(3, len(ready))
        has = max(self.host.logs[i].configured, len(self.host.logs[i].peers))
        return wanted if wanted > has else 0

    async def _grow(self, i: int) -> None:
        """Give shard ``i``'s stream a replica on each node that joined, up to three
        (JetStream places them; a new replica catches up from the leader)."""
        shard_log = self.host.logs[i]
        wanted = self._more_replicas(i)
        if wanted:
            await asyncio.wait_for(shard_log.resize(wanted), 5.0)
            log.info("%s: %d replicas (nodes joined)", shard_log.stream, wanted)

    def _gone_replicas(self, i: int) -> list[str]:
        """The replicas of shard ``i``'s stream that JetStream calls offline and whose node
        said it left for good."""
        if self.host.membership is None:
            return []
        peers = self.host.membership.peers()
        return [n for n in self.host.logs[i].offline if (p := peers.get(n)) is not None and p.gone]

    async def _drop_gone(self, i: int) -> None:
        """Take the replicas of nodes gone for good out of shard ``i``'s stream (its leader
        does, once JetStream calls them offline): a peer removal, which JetStream answers
        by placing a new replica on a node that has none; with no such node (three scaled
        down to two), one replica fewer, JetStream dropping the offline one."""
        shard_log = self.host.logs[i]
        gone = self._gone_replicas(i)
        for node in gone:
            try:
                await asyncio.wait_for(shard_log.remove_peer(node), 5.0)
                log.info("%s: took node %s (gone) out of its replicas", shard_log.stream, node)
            except LogError as exc:
                if "remap" not in str(exc):
                    raise
                keep = sum(1 for p in shard_log.peers if p not in gone)
                if 1 <= keep < shard_log.configured:
                    await asyncio.wait_for(shard_log.resize(keep), 5.0)
                    log.info(
                        "%s: %d replicas, without %s (gone; no node to replace it)",
                        shard_log.stream,
                        keep,
                        ", ".join(gone),
                    )
                return
