"""Who leads each shard, as seen from one node of a cluster (docs/cluster.md, "Leaders").

A shard's leader is its stream's JetStream Raft leader. :class:`ShardLeadership` is the part
of :class:`~polymq_core.cluster.node.ClusterNode` that follows them and moves them:

- **following**: every second (``_POLL``), and at once when JetStream announces an election,
  it asks who leads each stream; a shard whose stream this node leads is promoted (fenced
  takeover, then loaded), one led elsewhere is demoted, and one without a leader for
  ``_LEADERLESS`` seconds stops being served from memory;
- **balancing**: a node that leads more than its share hands one shard at a time to the
  ready, caught-up replica that leads the fewest (``_BALANCE_EVERY``; not a shard it took
  over less than ``_SETTLE`` seconds ago), and a pod Kubernetes has called not ready for
  ``_UNREADY_GRACE`` hands its shards on; either lets the shard go and steps its stream
  down only once the shard's writes are in the log (``_hand``); caught up is judged by the
  node's last announcement, against what this node had applied when it came (:meth:`heard`),
  and by the stream's replicas as its leader reports them when a move is considered
  (``_caught_up``);
- **replicas**: the leader of a stream takes the replicas of nodes gone for good out of it,
  and grows it back to three as nodes join;
- **handing on** when this node stops (:meth:`ShardLeadership.step_down`, :meth:`heirs`,
  :meth:`stream_leader`: what :mod:`polymq_core.forwarding.handover` uses, through the
  node; then :meth:`ShardLeadership.hand_on_led`: every other stream it leads stepped down
  at once, once the broker has answered its sessions), and :meth:`ready`: can this node
  serve every shard.

It is a part the node owns and calls (nothing here runs per message): it holds the leaders
it knows, the pods Kubernetes calls not ready and its timers; what it uses of the node (its
id and state, its shards' logs and stores, the broker, the membership, where a node
listens) is a :class:`LeadershipHost`. The node runs its loops (:meth:`follow`,
:meth:`balance`, :meth:`guard_unready`) as its own tasks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..replication.jetstream import check_cancelled
from ..store.logentry import LogError

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from ..broker import Broker
    from ..destinations.shard import Shard
    from ..replication.jetstream import ShardLog
    from ..replication.replicatedstore import ReplicatedStore
    from .endpoints import Member
    from .membership import Membership, PeerInfo

__all__ = ["LeadershipHost", "ShardLeadership"]

log = logging.getLogger(__name__)

_POLL = 1.0  # seconds between looks at who leads each shard's stream
_INFO_TIMEOUT = 1.5  # seconds a look may take (a dead leader's stream does not answer)
_BALANCE_EVERY = 10.0  # seconds between looks at how the shards' leaders are spread
_CAUGHT_UP = 100  # entries a node may be behind and still be handed a shard's lead, and:
_BEHIND = 0.5  # seconds of a shard's writes it may be behind besides (see _caught_up)
_ACTIVE = 3.0  # seconds the stream's leader may not have heard from a replica that may lead
_HEIR_LOOK = 0.5  # seconds a stopping node waits for the replicas' state to pick an heir
# seconds a node keeps a shard it has just taken over before the balancer may hand it on: a
# failover is not followed at once by a second move (each move sends a subscription's
# unacknowledged deliveries again and refuses the writes in flight)
_SETTLE = 20.0
# seconds a stopping node waits for a shard's last writes to be in the log, and for its
# stream's step-down to be answered
_WRITTEN_WITHIN = 2.0
# seconds a shard may go without a leader (reported, or no answer at all) before this node
# stops serving it from memory; its writes fail meanwhile anyway (no majority, no commit)
_LEADERLESS = 10.0
_UNREADY_GRACE = 10.0  # seconds a pod Kubernetes calls not ready keeps its shards' leads
# announcement periods a node may go unheard before the balancer calls it impaired (it
# announces every period; unreachable after three): no lead moves while a node is impaired,
# nor for _SETTLE seconds after (a link that just came back may fail again)
_LATE = 1.5
# seconds unheard after which a node counts as down rather than impaired: the balancer
# spreads the leads over the others again (a node that crashed for good holds nothing up)
_DOWN = 60.0


class LeadershipHost(Protocol):
    """What the shards' leadership uses of its node
    (:class:`~polymq_core.cluster.node.ClusterNode`)."""

    node_id: str
    state: str  # "joining" until ready() first holds (set here then), "ready", "leaving"
    broker: Broker | None  # its shards: taken over and let go here (None until started)
    membership: Membership | None  # the other nodes (None until started)
    logs: list[ShardLog]  # per shard: its stream
    stores: list[ReplicatedStore]  # per shard: what it applied, its writes in the log

    def address_of(self, node: str) -> tuple[str, int] | None: ...  # where to forward to


@dataclass(frozen=True)
class _Heard:
    """Another node's announcement as this node heard it: when (``time.monotonic()``), the
    entries of each shard it said it had applied, and those this node had applied then."""

    at: float
    theirs: Mapping[int, int]
    ours: tuple[int, ...]


class ShardLeadership:
    """Following and moving the shards' leaders: a :class:`~polymq_core.cluster.node.ClusterNode`'s
    part (see the module's docstring)."""

    def __init__(self, host: LeadershipHost, shards: int) -> None:
        self.host = host
        self.leaders: dict[int, str | None] = {}  # per shard: who leads its stream, as last seen
        self._wake = [asyncio.Event() for _ in range(shards)]  # per shard: look at its leader now
        self._leaderless_since: dict[int, float] = {}
        self._promoting: dict[int, asyncio.Task[None]] = {}
        self._handing: set[int] = set()  # shards being handed on by _hand: no look takes them
        self._resizing: dict[int, asyncio.Task[None]] = {}  # per shard: its replicas changing
        self._applied_seen: dict[int, int] = {}  # per shard, at the balancer's last look
        # per other node, its last two announcements (see _caught_up)
        self._heard: dict[str, collections.deque[_Heard]] = {}
        self._led_since: dict[int, float] = {}  # per shard this node took over: when
        # pods Kubernetes says are not ready, or that left the endpoints, and since when
        self._unready_since: dict[str, float] = {}
        self._k8s_known: set[str] = set()  # every pod the endpoints have named
        # when the balancer last saw a node unheard or unreachable (none yet)
        self._impaired_at = float("-inf")

    async def step_down(self, shard: int) -> None:
        """Hand shard ``shard``'s stream on (this node stops): to the ready replica that
        leads the fewest and has caught up, if there is one, else where JetStream likes."""
        heir = None
        if self.host.membership is not None:
            heir = await self._heir(shard, self._candidates(self.host.membership), _HEIR_LOOK)
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
            leader, _ = await asyncio.wait_for(self.host.logs[shard].info(), _INFO_TIMEOUT)
        except (LogError, TimeoutError):
            return None
        return leader

    def heirs(self) -> set[str]:
        """The other nodes that may take a shard this node hands on now (ready: not
        stopping, not unreachable, not a pod Kubernetes calls not ready)."""
        if self.host.membership is None:
            return set()
        return set(self._candidates(self.host.membership))

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
            leader, _ = await asyncio.wait_for(self.host.logs[i].info(), _INFO_TIMEOUT)
        except (LogError, TimeoutError):
            # No answer is not "no leader": under load a look can time out. Keep what we
            # knew for routing; only a long silence counts as leaderless (below).
            leader = None
        self._saw(i, leader, now)
        if leader == self.host.node_id and i not in self._resizing:
            gone, more = self._gone_replicas(i), self._more_replicas(i)
            step = self._drop_gone if gone else self._grow if more else None
            if step is not None:
                self._resizing[i] = asyncio.get_running_loop().create_task(
                    self._resize(i, step), name=f"resize-{i}"
                )

    async def _resize(self, i: int, step: Callable[[int], Awaitable[None]]) -> None:
        """``step(i)``: change shard ``i``'s stream's replicas; one that fails is logged
        and tried again at a look after _BALANCE_EVERY."""
        try:
            await step(i)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: changing its replicas failed (%s)", self.host.logs[i].stream, exc)
            await asyncio.sleep(_BALANCE_EVERY)
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
            leader = self.leaders.get(i)
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
        mine = [i for i in mine if now - self._led_since.get(i, -_SETTLE) >= _SETTLE]
        for i in mine:
            targets = [n for n in ready if n != self.host.node_id and self._replica_of(i, n)]
            if not targets:
                continue
            target = min(targets, key=lambda n: (len(led[n]), n))
            if len(led[target]) + 1 <= share and await self._caught_up(i, [target], _INFO_TIMEOUT):
                await self._hand(i, target, "balance")
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

    async def _hand(self, i: int, target: str, why: str) -> None:
        """Hand shard ``i``'s lead to ``target`` as a stopping node does (:meth:`_hand_on`):
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
        await _every(_POLL, self._guard_unready_once, "handing on a shard (not ready here)")

    async def _guard_unready_once(self) -> None:
        membership = self.host.membership
        since = self._unready_since.get(self.host.node_id)
        if membership is None or since is None or time.monotonic() - since < _UNREADY_GRACE:
            return
        others = self._candidates(membership)
        if others:
            await self._hand_off(others)

    def _candidates(self, membership: Membership) -> dict[str, PeerInfo]:
        """The other nodes that may lead a shard this node hands on: ready, and not a pod
        Kubernetes calls not ready."""
        return {
            node: peer
            for node, peer in membership.peers().items()
            if node != self.host.node_id
            and membership.state_of(node) == "ready"
            and node not in self._unready_since
        }

    async def _heir(self, i: int, others: dict[str, PeerInfo], within: float) -> str | None:
        """Of ``others``, the one to hand shard ``i`` to: a replica of its stream that has
        caught up with this node, leading the fewest shards; None if none may (or the
        stream's leader did not say within ``within`` seconds)."""
        led = collections.Counter(self.leaders.values())
        replicas = [n for n in others if self._replica_of(i, n)]
        able = await self._caught_up(i, replicas, within) if replicas else []
        return min(able, key=lambda n: (led[n], n), default=None)

    async def _hand_off(self, others: dict[str, PeerInfo]) -> None:
        """Hand one shard this node leads to the candidate leading the fewest that has
        caught up with it (one a round, as the balancer moves them)."""
        assert self.host.broker is not None
        for i, shard in enumerate(self.host.broker.shards):
            if self.leaders.get(i) != self.host.node_id or not shard.leading:
                continue
            target = await self._heir(i, others, _INFO_TIMEOUT)
            if target is not None:
                await self._hand(i, target, "not ready here")
                return

    async def _promote(self, index: int) -> None:
        assert self.host.broker is not None
        try:
            await self.host.broker.shards[index].promote()
            if self.host.broker.shards[index].leading:
                self._led_since[index] = time.monotonic()
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
        for task in list(self._resizing.values()):
            task.cancel()

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
