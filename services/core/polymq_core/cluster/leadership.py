"""Who leads each shard, as seen from one node of a cluster (docs/cluster.md, "Leaders").

A shard's leader is its stream's JetStream Raft leader. :class:`ShardLeadership` is the part
of :class:`~polymq_core.cluster.node.ClusterNode` that follows them and moves them:

- **following**: every second (``_POLL``), and at once when JetStream announces an election,
  it asks who leads each stream; a shard whose stream this node leads is promoted (fenced
  takeover, then loaded), one led elsewhere is demoted, and one without a leader for
  ``_LEADERLESS`` seconds stops being served from memory;
- **moving a lead** (:meth:`ShardLeadership.hand`): the shard let go, and its stream stepped
  down only once the shard's writes are in the log. Which shard moves, to whom and when is
  its :class:`~polymq_core.cluster.balancer.Balancer`'s to judge (:attr:`balancer`: a node
  that leads more than its share, a pod Kubernetes has called not ready; a replica caught
  up);
- **replicas**: at a look that finds this node leading a stream, its
  :class:`~polymq_core.cluster.replicas.Replicas` (:attr:`replicas`) take the replicas of
  nodes gone for good out of it, and grow it back to three as nodes join;
- **handing on** when this node stops (:meth:`ShardLeadership.step_down`, :meth:`heirs`,
  :meth:`stream_leader`: what :mod:`polymq_core.forwarding.handover` uses, through the
  node; then :meth:`ShardLeadership.hand_on_led`: every other stream it leads stepped down
  at once, once the broker has answered its sessions), and :meth:`ready`: can this node
  serve every shard.

It is a part the node owns and calls (nothing here runs per message): it holds the leaders
it knows, the takeovers under way and its timers, and owns the balancer and the replicas;
what it uses of the node (its id and state, its shards' logs and stores, the broker's
shards, the membership, where a node listens) is a :class:`LeadershipHost`. The node runs
its loops (:meth:`follow`, the balancer's ``balance`` and ``guard_unready``) as its own
tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from polymq.tasks import check_cancelled

from ..store.logentry import LogError
from .balancer import ASK_WITHIN, Balancer, BalancerHost
from .replicas import Replicas

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from ..destinations.shard import Shard

__all__ = ["LeadershipHost", "ShardLeadership"]

log = logging.getLogger(__name__)

_POLL = 1.0  # seconds between looks at who leads each shard's stream
_HEIR_LOOK = 0.5  # seconds a stopping node waits for the replicas' state to pick an heir
# seconds a stopping node waits for a shard's last writes to be in the log, and for its
# stream's step-down to be answered
_WRITTEN_WITHIN = 2.0
# seconds a shard may go without a leader (reported, or no answer at all) before this node
# stops serving it from memory; its writes fail meanwhile anyway (no majority, no commit)
_LEADERLESS = 10.0


class LeadershipHost(BalancerHost, Protocol):
    """What the shards' leadership uses of its node
    (:class:`~polymq_core.cluster.node.ClusterNode`): what its balancer uses (a
    :class:`~polymq_core.cluster.balancer.BalancerHost`, which names what its replicas use
    too; the broker's shards are taken over and let go here), its state, and where a node
    listens."""

    state: str  # "joining" until ready() first holds (set here then), "ready", "leaving"

    def address_of(self, node: str) -> tuple[str, int] | None: ...  # where to forward to


class ShardLeadership:
    """Following and moving the shards' leaders: a :class:`~polymq_core.cluster.node.ClusterNode`'s
    part (see the module's docstring)."""

    def __init__(self, host: LeadershipHost, shards: int) -> None:
        self.host = host
        self.leaders: dict[int, str | None] = {}  # per shard: who leads its stream, as last seen
        self._wake = [asyncio.Event() for _ in range(shards)]  # per shard: look at its leader now
        self._leaderless_since: dict[int, float] = {}
        self._promoting: dict[int, asyncio.Task[None]] = {}
        self._handing: set[int] = set()  # shards being handed on (hand): no look takes them
        self.led_since: dict[int, float] = {}  # per shard this node took over: when
        # its parts: where the leads should go, and the streams' replicas
        self.balancer = Balancer(host, self)
        self.replicas = Replicas(host)

    async def step_down(self, shard: int) -> None:
        """Hand shard ``shard``'s stream on (this node stops): to the ready replica that
        leads the fewest and has caught up, if there is one, else where JetStream likes."""
        heir = None
        membership = self.host.membership
        if membership is not None:
            heir = await self.balancer.heir(shard, self.balancer.candidates(membership), _HEIR_LOOK)
        await self.host.logs[shard].step_down(preferred=heir)

    async def hand_on_led(self, shards: Sequence[Shard], handed: Mapping[int, str]) -> None:
        """Stopping, once the broker has answered its sessions (and the hand-over, which
        stepped ``handed`` down, is done: each shard with its next leader, now known here):
        step down at once, all together, every other stream whose shard this node still
        leads, each once its last writes are in the log, instead of after the shards are
        closed (:meth:`ClusterNode.close`: their stores' flush came first, and one stream
        after another). Other nodes' sessions hold their
        requests for a shard until its next leader took it over: the sooner, the shorter
        their stall (docs/cluster.md, "Stopping a node"). Left to ``close`` when no other
        node may take a shard (the whole cluster stops) or a step-down is not answered."""
        self.leaders.update(handed)
        if not self.heirs():
            return
        led = [s for s in shards if s.leading and s.index not in handed]
        await asyncio.gather(*(self._hand_on(shard) for shard in led))

    async def _hand_on(self, shard: Shard) -> None:
        """The shard's last writes (its last acks' removals among them) into the log, the
        shard let go, the append still in flight (if any) answered, then the step-down: a
        step-down drops what its Raft leader has not proposed yet, and an append whose
        answer never comes fails only after the log's timeout (seconds)."""
        i = shard.index
        shard.flush_removes()
        try:
            await asyncio.wait_for(self.host.stores[i].written(), _WRITTEN_WITHIN)
        except TimeoutError:
            log.warning("shard %d: its last writes did not reach the log in time", i)
        shard.demote("this node stops: the next leader takes the shard over")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.host.stores[i].written(), _WRITTEN_WITHIN)
        try:
            await asyncio.wait_for(self.step_down(i), _WRITTEN_WITHIN)
        except (LogError, TimeoutError) as exc:
            log.info("shard %d: stepping its stream down failed (%s); again at the end", i, exc)
            return
        self.leaders[i] = None  # (not ours: close() leaves it be)

    async def stream_leader(self, shard: int) -> str | None:
        """Who leads shard ``shard``'s stream now (None: nobody, or no answer in time)."""
        try:
            leader, _ = await asyncio.wait_for(self.host.logs[shard].info(), ASK_WITHIN)
        except (LogError, TimeoutError):
            return None
        return leader

    def heirs(self) -> set[str]:
        """The other nodes that may take a shard this node hands on now (ready: not
        stopping, not unreachable, not a pod Kubernetes calls not ready)."""
        if self.host.membership is None:
            return set()
        return set(self.balancer.candidates(self.host.membership))

    def leader_of(self, shard: int) -> str | None:
        return self.leaders.get(shard)

    async def follow(self, index: int) -> None:
        """Follow shard ``index``'s stream leader: every second, and at once when JetStream
        announces a new leader for it."""
        wake = self._wake[index]
        while True:
            try:
                await self._look(index)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following shard %d's leader failed; trying again", index)
            check_cancelled()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), _POLL)
            check_cancelled()
            wake.clear()

    async def elected(self, msg: Msg) -> None:
        """A JetStream advisory: a stream has a new leader. Act on the leader it names at
        once (a look in flight may be waiting for an answer the election never gave), and
        look again to be sure."""
        stream = msg.subject.rsplit(".", 1)[-1]
        try:
            leader = json.loads(msg.data).get("leader")
        except (ValueError, AttributeError):
            leader = None
        for i, shard_log in enumerate(self.host.logs):
            if shard_log.stream == stream:
                shard_log.nudge()
                if isinstance(leader, str) and leader and self.host.broker is not None:
                    self._saw(i, leader, time.monotonic())
                self._wake[i].set()

    async def _look(self, i: int) -> None:
        assert self.host.broker is not None
        now = time.monotonic()
        try:
            leader, _ = await asyncio.wait_for(self.host.logs[i].info(), ASK_WITHIN)
        except (LogError, TimeoutError):
            # No answer is not "no leader": under load a look can time out. Keep what we
            # knew for routing; only a long silence counts as leaderless (below).
            leader = None
        self._saw(i, leader, now)
        if leader == self.host.node_id:
            self.replicas.tend(i)

    def _saw(self, i: int, leader: str | None, now: float) -> None:
        """Shard ``i``'s stream is led by ``leader`` (None: no answer, and the known leader
        stays for routing): take the shard over, let it go, or, after _LEADERLESS seconds
        without a leader, stop serving it."""
        assert self.host.broker is not None
        shard = self.host.broker.shards[i]
        if leader is None:
            since = self._leaderless_since.setdefault(i, now)
            if shard.leading and now - since >= _LEADERLESS:
                shard.demote("its log has no leader (no majority?)")
        else:
            self.leaders[i] = leader
            self._leaderless_since.pop(i, None)
            if leader == self.host.node_id:
                if not shard.leading and i not in self._promoting and i not in self._handing:
                    self._promoting[i] = asyncio.get_running_loop().create_task(
                        self._promote(i), name=f"promote-{i}"
                    )
            elif shard.leading:
                shard.demote(f"node {leader} leads it now")
        if self.host.state == "joining" and self.ready():
            self.host.state = "ready"

    async def hand(self, i: int, target: str, why: str) -> None:
        """Hand shard ``i``'s lead to ``target`` (the balancer's moves, ``why`` says which)
        as a stopping node does (:meth:`_hand_on`):
        the shard let go (its requests are held from then on, and go to ``target`` once it
        leads) while the writes already made go on into the log, then, once they are there
        (none pending, no append in flight), a step-down with ``target`` preferred. A
        step-down with an append in flight left that append unanswered: its writes failed
        only after the log's timeout, 5 s, and the shard's requests waited as long (the
        rolling restart's 5.51 s, docs/cluster.md). No look takes the shard again
        meanwhile; one whose step-down fails is taken over again here (the next look sees
        this node still leads its stream)."""
        log.info("shard %d: handing its lead to node %s (%s)", i, target, why)
        store = self.host.stores[i]
        self._handing.add(i)
        try:
            if self.host.broker is not None:
                shard = self.host.broker.shards[i]
                shard.flush_removes()
                shard.demote(f"handing its lead to node {target}", writes_go_on=True)
            try:
                await asyncio.wait_for(store.written(), _WRITTEN_WITHIN)
            except TimeoutError:
                log.warning("shard %d: its last writes did not reach the log in time", i)
            store.demote()  # (what is not in the log by now fails: may not be committed)
            log.info("shard %d: its writes are in the log; stepping down for node %s", i, target)
            await asyncio.wait_for(self.host.logs[i].step_down(preferred=target), 5.0)
            self._wake[i].set()
            # (until this node sees another leader, a look answered before the step-down
            # must not take the shard again)
            until = time.monotonic() + _WRITTEN_WITHIN
            while self.leaders.get(i) == self.host.node_id:
                if time.monotonic() >= until:
                    break
                await asyncio.sleep(0.02)
        except BaseException:
            # (cancelled, or the step-down failed: what did not reach the log fails, and
            # the next look, at once, takes the shard over again if nobody else leads it)
            store.demote()
            self._wake[i].set()
            raise
        finally:
            self._handing.discard(i)

    async def _promote(self, index: int) -> None:
        assert self.host.broker is not None
        try:
            await self.host.broker.shards[index].promote()
            if self.host.broker.shards[index].leading:
                self.led_since[index] = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("shard %d: taking over failed (%s); trying again", index, exc)
        finally:
            self._promoting.pop(index, None)

    def deposed(self, index: int) -> None:
        """The shard's log refused our append: somebody else leads it now."""
        if self.host.broker is not None:
            self.host.broker.shards[index].demote("another node appended to its log (deposed)")

    def cancel_changes(self) -> None:
        """Stopping: cancel the takeovers and the replica changes under way (the loops that
        start them are the node's tasks, cancelled before)."""
        for task in list(self._promoting.values()):
            task.cancel()
        self.replicas.cancel()

    def ready(self) -> bool:
        """Can this node serve every shard: lead it, or forward to a leader it can reach?"""
        if self.host.broker is None or self.host.state == "leaving":
            return False
        for shard in self.host.broker.shards:
            leader = self.leaders.get(shard.index)
            if leader is None:
                return False
            if leader == self.host.node_id:
                if not shard.leading:
                    return False
            elif self.host.address_of(leader) is None:
                return False
        return True
