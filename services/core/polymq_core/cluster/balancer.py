"""Where the shards' leads should go, as one node of a cluster judges it (docs/cluster.md,
"Leaders"): the :class:`Balancer`, a part of
:class:`~polymq_core.cluster.leadership.ShardLeadership`.

- **balancing**: a node that leads more than its share hands one shard at a time to the
  ready, caught-up replica that leads the fewest (``_BALANCE_EVERY``; not a shard it took
  over less than ``_SETTLE`` seconds ago, and nothing while a node is unheard, nor for
  ``_SETTLE`` seconds after);
- **not ready**: a pod Kubernetes has called not ready (or that left the endpoints) for
  ``_UNREADY_GRACE`` hands its shards on (:meth:`Balancer.endpoints_changed`,
  :meth:`Balancer.guard_unready`), and is no candidate meanwhile;
- **caught up**: judged by the node's last announcement, against what this node had applied
  when it came (:meth:`Balancer.heard`), and by the stream's replicas as its leader reports
  them when a move is considered (``_caught_up``);
- **heirs**: the ready, caught-up replica that leads the fewest (:meth:`Balancer.heir`),
  what a stopping node prefers too (:meth:`ShardLeadership.step_down
  <polymq_core.cluster.leadership.ShardLeadership.step_down>`).

It decides; the leadership moves (:meth:`Leads.hand`: the shard let go and its stream
stepped down only once the shard's writes are in the log). It holds what the other nodes
last announced, the pods Kubernetes calls not ready, when a node was last impaired and
what each shard had applied at its last look; what it uses of the node (its id, its shards,
their logs and stores, the membership) is a :class:`BalancerHost`, and of the leadership
(who leads what, since when, handing a lead on) a :class:`Leads`. The node runs its loops
(:meth:`Balancer.balance`, :meth:`Balancer.guard_unready`) as its own tasks.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from polymq.tasks import check_cancelled

from ..store.logentry import LogError

if TYPE_CHECKING:
    from ..destinations.shard import Shard
    from ..replication.jetstream import ShardLog
    from ..replication.replicatedstore import ReplicatedStore
    from .endpoints import Member
    from .membership import Membership, PeerInfo

__all__ = ["Balancer", "BalancerHost", "Leads", "ShardHolder"]

log = logging.getLogger(__name__)

_BALANCE_EVERY = 10.0  # seconds between looks at how the shards' leaders are spread
_UNREADY_EVERY = 1.0  # seconds between looks at whether this node's pod is not ready
# seconds a stream's leader may take to answer a look at the stream (who leads, how its
# replicas are): a dead leader's stream does not answer (leadership.py waits as long)
ASK_WITHIN = 1.5
_CAUGHT_UP = 100  # entries a node may be behind and still be handed a shard's lead, and:
_BEHIND = 0.5  # seconds of a shard's writes it may be behind besides (see _caught_up)
_ACTIVE = 3.0  # seconds the stream's leader may not have heard from a replica that may lead
# seconds a node keeps a shard it has just taken over before the balancer may hand it on: a
# failover is not followed at once by a second move (each move sends a subscription's
# unacknowledged deliveries again and refuses the writes in flight)
_SETTLE = 20.0
_UNREADY_GRACE = 10.0  # seconds a pod Kubernetes calls not ready keeps its shards' leads
# announcement periods a node may go unheard before the balancer calls it impaired (it
# announces every period; unreachable after three): no lead moves while a node is impaired,
# nor for _SETTLE seconds after (a link that just came back may fail again)
_LATE = 1.5
# seconds unheard after which a node counts as down rather than impaired: the balancer
# spreads the leads over the others again (a node that crashed for good holds nothing up)
_DOWN = 60.0


class ShardHolder(Protocol):
    """What the shards' leadership uses of the broker: its shards."""

    shards: list[Shard]


class BalancerHost(Protocol):
    """What the balancer uses of its node (:class:`~polymq_core.cluster.node.ClusterNode`)."""

    node_id: str
    membership: Membership | None  # the other nodes (None until started)
    logs: list[ShardLog]  # per shard: its stream (its replicas, their state)
    stores: list[ReplicatedStore]  # per shard: what it applied

    @property
    def broker(self) -> ShardHolder | None: ...  # which shards this node leads (None: not yet)


class Leads(Protocol):
    """What the balancer uses of the shards' leadership
    (:class:`~polymq_core.cluster.leadership.ShardLeadership`)."""

    @property
    def leaders(self) -> Mapping[int, str | None]: ...  # per shard: who leads its stream

    @property
    def led_since(self) -> Mapping[int, float]: ...  # per shard this node took over: when

    async def hand(self, i: int, target: str, why: str) -> None: ...  # shard i's lead on


@dataclass(frozen=True)
class _Heard:
    """Another node's announcement as this node heard it: when (``time.monotonic()``), the
    entries of each shard it said it had applied, and those this node had applied then."""

    at: float
    theirs: Mapping[int, int]
    ours: tuple[int, ...]


class Balancer:
    """Spreading the shards' leads, and handing them on from a pod that is not ready: a
    :class:`~polymq_core.cluster.leadership.ShardLeadership`'s part (see the module's
    docstring)."""

    def __init__(self, host: BalancerHost, leads: Leads) -> None:
        self.host = host
        self.leads = leads
        self._applied_seen: dict[int, int] = {}  # per shard, at the balancer's last look
        # per other node, its last two announcements (see _caught_up)
        self._heard: dict[str, collections.deque[_Heard]] = {}
        # pods Kubernetes says are not ready, or that left the endpoints, and since when
        self._unready_since: dict[str, float] = {}
        self._k8s_known: set[str] = set()  # every pod the endpoints have named
        # when the balancer last saw a node unheard or unreachable (none yet)
        self._impaired_at = float("-inf")

    async def balance(self) -> None:
        """Spread the shards' leaders over the live nodes: a node that leads more than its
        share hands one shard at a time to the ready, caught-up node that leads the fewest
        (a JetStream leader step-down with that node preferred), the quietest shard
        first. JetStream places leaders where its elections fall; after a restart one node
        may lead everything."""
        await _every(_BALANCE_EVERY, self._balance_once, "balancing the shards' leaders")

    async def _balance_once(self) -> None:
        broker, membership = self.host.broker, self.host.membership
        if broker is None or membership is None:
            return
        if self._impaired(membership) is not None:
            return  # a move now would land on a node that may be cut off, or depose again
        ready = {
            node: peer
            for node, peer in membership.peers().items()
            if membership.state_of(node) == "ready"
        }
        # a pod Kubernetes says is not ready is no leader candidate: nothing is handed to
        # it, and once it has been so for a while it hands on what it leads
        unready = self._unready_since
        if self.host.node_id in unready:
            return  # (guard_unready hands on what it leads)
        ready = {n: p for n, p in ready.items() if n not in unready}
        if self.host.node_id not in ready or len(ready) < 2:
            return
        led: dict[str, list[int]] = {node: [] for node in ready}
        for i in range(len(self.host.logs)):
            leader = self.leads.leaders.get(i)
            if leader in led:
                led[leader].append(i)
        # The quietest shards first (entries since the last look): moving a leader fails
        # the writes it had not appended yet, so a busy shard moves last.
        applied = {i: store.applied for i, store in enumerate(self.host.stores)}
        busy = {i: n - self._applied_seen.get(i, n) for i, n in applied.items()}
        self._applied_seen = applied
        mine = sorted(
            (i for i in led[self.host.node_id] if broker.shards[i].leading),
            key=lambda i: (busy.get(i, 0), i),
        )
        # only a replica of a shard's stream can lead it (a fourth node, or one that came
        # back after it was taken out, has none until a stream grows onto it)
        shards = range(len(self.host.logs))
        able = [n for n in ready if any(self._replica_of(i, n) for i in shards)]
        share = -(-len(self.host.logs) // max(len(able), 1))  # the most any node should lead
        if len(mine) <= share:
            return
        now = time.monotonic()
        led_since = self.leads.led_since
        mine = [i for i in mine if now - led_since.get(i, -_SETTLE) >= _SETTLE]
        for i in mine:
            targets = [n for n in ready if n != self.host.node_id and self._replica_of(i, n)]
            if not targets:
                continue
            target = min(targets, key=lambda n: (len(led[n]), n))
            if len(led[target]) + 1 <= share and await self._caught_up(i, [target], ASK_WITHIN):
                await self.leads.hand(i, target, "balance")
                return

    def _impaired(self, membership: Membership) -> str | None:
        """Another node that has been unheard for more than _LATE announcement periods (and
        less than _DOWN seconds), or was so less than _SETTLE seconds ago: a partition, or
        links failing (on a node cut off, every other one). While there is one, the balancer
        moves nothing. None when all are well."""
        now = time.monotonic()
        late = _LATE * membership.period
        for node, peer in membership.peers().items():
            if node == self.host.node_id or peer.gone or membership.state_of(node) == "leaving":
                continue
            if late < now - peer.last_heard < _DOWN:
                self._impaired_at = now
                return node
        return "a node lately" if now - self._impaired_at < _SETTLE else None

    def _replica_of(self, i: int, node: str) -> bool:
        """Is ``node`` a replica of shard ``i``'s stream (yes while none is known)?"""
        peers = getattr(self.host.logs[i], "peers", ())
        return not peers or node in peers

    def heard(self, node: str) -> None:
        """``node`` announced itself (membership has just recorded it): note what it said it
        applied of each shard, beside what this node has applied of each now."""
        membership = self.host.membership
        peer = membership.peers().get(node) if membership is not None else None
        if peer is None or node == self.host.node_id:
            return
        ours = tuple(store.applied for store in self.host.stores)
        heard = self._heard.setdefault(node, collections.deque(maxlen=2))
        heard.append(_Heard(time.monotonic(), dict(peer.applied), ours))

    async def _caught_up(self, i: int, nodes: Iterable[str], within: float) -> list[str]:
        """Those of ``nodes`` that have caught up with shard ``i``'s log: handed its lead,
        one takes the shard over once it has applied the whole log, the shard's writes held
        until then, so a node far behind would stall them. Caught up on two counts:

        - its store: when it last announced, it had applied the log to within the allowance
          (:meth:`_allowance`) of what this node had applied at that moment. Compared at
          that moment, not now: the announcement is up to a period old (2 s), and under
          load this node has applied thousands of entries since (compared now, a node that
          kept up looked behind, and the balancer moved nothing while writes went on);
        - its replica of the stream, as the stream's Raft leader reports it now (asked
          here, once a move is considered: a look of the balancer's, a stop's step-down;
          no answer within ``within`` seconds, none is): not offline, heard from within
          _ACTIVE seconds, its copy within the allowance of the leader's. So a node that
          froze or was cut off since its announcement is not handed the lead, and JetStream
          elects the one preferred (a replica behind is not)."""
        nodes = list(nodes)
        behind = {n: self._applied_behind(i, n) for n in nodes}
        near = [n for n in nodes if behind[n] <= self._allowance(i, n)]
        for node in sorted(set(nodes) - set(near)):  # (one never heard from: inf behind)
            log.info(
                "shard %d: node %s is not caught up (%s entries behind)", i, node, behind[node]
            )
        if not near:
            return []
        try:
            followers = await asyncio.wait_for(self.host.logs[i].followers(), within)
        except (LogError, TimeoutError) as exc:
            log.info("shard %d: its replicas' state is unknown (%s): handed to none", i, exc)
            return []
        able = []
        for node in near:
            lag, quiet = followers.get(node, (None, 0.0))
            if lag is None:
                log.info("shard %d: node %s is not among its stream's followers", i, node)
            elif lag > self._allowance(i, node) or quiet > _ACTIVE:
                log.info(
                    "shard %d: node %s is not caught up (its replica %d entries behind, "
                    "heard %.1f s ago)",
                    i,
                    node,
                    lag,
                    quiet,
                )
            else:
                able.append(node)
        return able

    def _applied_behind(self, i: int, node: str) -> float:
        """The entries of shard ``i`` ``node`` had applied fewer than this node when it last
        announced (infinite if it never did)."""
        heard = self._heard.get(node)
        if not heard:
            return float("inf")
        last = heard[-1]
        ours = last.ours[i] if i < len(last.ours) else 0
        return ours - last.theirs.get(i, 0)

    def _allowance(self, i: int, node: str) -> float:
        """The entries of shard ``i`` a node may be behind and still take its lead:
        _CAUGHT_UP, and _BEHIND seconds of the shard's writes at the pace this node
        applied them between ``node``'s last two announcements. It grows with the load, as
        does the distance of a node that keeps up (entries in flight, applied a moment
        later); what a node that keeps up is behind, it applies in about as long once the
        writes are held for the hand-over: the shard stalls for _BEHIND seconds or so."""
        heard = self._heard.get(node)
        if heard is None or len(heard) < 2:
            return _CAUGHT_UP
        first, last = heard[0], heard[-1]
        span = last.at - first.at
        if span <= 0 or i >= min(len(first.ours), len(last.ours)):
            return _CAUGHT_UP
        pace = max(0, last.ours[i] - first.ours[i]) / span
        return _CAUGHT_UP + pace * _BEHIND

    def endpoints_changed(self, members: Mapping[str, Member]) -> None:
        """The Service's endpoints changed: note which pods are not ready, or have left
        the endpoints after being in them, and since when (such a pod is no leader
        candidate, and once so for _UNREADY_GRACE it hands its shards' leads to ready
        ones). A node never named by the endpoints (its id is not its pod's name) is
        judged by its NATS peers alone."""
        now = time.monotonic()
        self._k8s_known.update(members)
        for name in self._k8s_known:
            member = members.get(name)
            if member is not None and member.ready:
                self._unready_since.pop(name, None)
            else:
                self._unready_since.setdefault(name, now)

    async def guard_unready(self) -> None:
        """Every second: once this node's pod has been not ready (or gone from the
        endpoints) for _UNREADY_GRACE, hand a shard it leads to a ready node (one a look;
        a blip shorter than the grace moves nothing)."""
        await _every(
            _UNREADY_EVERY, self._guard_unready_once, "handing on a shard (not ready here)"
        )

    async def _guard_unready_once(self) -> None:
        membership = self.host.membership
        since = self._unready_since.get(self.host.node_id)
        if membership is None or since is None or time.monotonic() - since < _UNREADY_GRACE:
            return
        others = self.candidates(membership)
        if others:
            await self._hand_off(others)

    def candidates(self, membership: Membership) -> dict[str, PeerInfo]:
        """The other nodes that may lead a shard this node hands on: ready, and not a pod
        Kubernetes calls not ready."""
        return {
            node: peer
            for node, peer in membership.peers().items()
            if node != self.host.node_id
            and membership.state_of(node) == "ready"
            and node not in self._unready_since
        }

    async def heir(self, i: int, others: dict[str, PeerInfo], within: float) -> str | None:
        """Of ``others``, the one to hand shard ``i`` to: a replica of its stream that has
        caught up with this node, leading the fewest shards; None if none may (or the
        stream's leader did not say within ``within`` seconds)."""
        led = collections.Counter(self.leads.leaders.values())
        replicas = [n for n in others if self._replica_of(i, n)]
        able = await self._caught_up(i, replicas, within) if replicas else []
        return min(able, key=lambda n: (led[n], n), default=None)

    async def _hand_off(self, others: dict[str, PeerInfo]) -> None:
        """Hand one shard this node leads to the candidate leading the fewest that has
        caught up with it (one a round, as the balancer moves them)."""
        assert self.host.broker is not None
        for i, shard in enumerate(self.host.broker.shards):
            if self.leads.leaders.get(i) != self.host.node_id or not shard.leading:
                continue
            target = await self.heir(i, others, ASK_WITHIN)
            if target is not None:
                await self.leads.hand(i, target, "not ready here")
                return


async def _every(seconds: float, step: Callable[[], Awaitable[None]], what: str) -> None:
    """``step()`` every ``seconds``, for ever; a step that fails is logged and tried again."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("%s failed (%s); trying again", what, exc)
        check_cancelled()
