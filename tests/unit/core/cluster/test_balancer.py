"""The shards' balancer (``polymq_core.cluster.balancer``, a ShardLeadership's part) without
NATS: which shard a node that leads more than its share hands on, that a shard it has just
taken over stays put for a while (a failover followed at once by a balance move was seen to
send a consumer's unacknowledged deliveries twice), and to whom: a node caught up with the
shard's log, judged by its last announcement against what the leader had applied when it
came and by its replica as the stream's leader reports it (under load a node that kept up
looked thousands of entries behind, its announcement being up to 2 s old, and nothing
moved). With the same fakes: a stream growing back as nodes join (``replicas``), and the
heir a stopping node prefers (``ShardLeadership.step_down``)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from polymq_core.cluster import balancer
from polymq_core.cluster.endpoints import Member
from polymq_core.cluster.node import ClusterNode
from polymq_core.config import CoreSettings
from polymq_core.store.logentry import LogUnavailable

SHARDS = 4


@dataclass
class FakeShard:
    leading: bool = False

    async def promote(self) -> None:
        self.leading = True

    def flush_removes(self) -> None:
        pass

    def demote(self, reason: str, *, writes_go_on: bool = False) -> None:
        self.leading = False


@dataclass
class FakeLog:
    handed: list[str] = field(default_factory=list)
    peers: tuple[str, ...] = ()  # the stream's replicas (none known: any node may lead)
    configured: int = 3
    # as its leader reports them: per follower, (entries behind, seconds since heard); None:
    # the leader does not answer
    replicas: dict[str, tuple[int, float]] | None = field(
        default_factory=lambda: {"b": (0, 0.01), "c": (0, 0.01)}
    )
    asked: int = 0  # how many times the replicas' state was asked for
    elected: Callable[[str | None], None] = lambda leader: None  # who leads it after a step-down

    async def step_down(self, preferred: str | None = None) -> None:
        self.handed.append(str(preferred))
        self.elected(preferred)

    async def followers(self) -> dict[str, tuple[int, float]]:
        self.asked += 1
        if self.replicas is None:
            raise LogUnavailable("asking about the stream: timeout")
        return dict(self.replicas)


@dataclass
class FakeStore:
    applied: int = 0

    async def written(self) -> None:
        pass

    def demote(self) -> None:
        pass


@dataclass
class FakePeer:
    applied: dict[int, int]
    last_heard: float = field(default_factory=time.monotonic)
    gone: bool = False


class FakeMembership:
    period = 2.0  # seconds between announcements

    def __init__(self, peers: dict[str, FakePeer]) -> None:
        self._peers = peers

    def peers(self) -> dict[str, FakePeer]:
        return self._peers

    def state_of(self, node: str) -> str:
        quiet = time.monotonic() - self._peers[node].last_heard
        return "unreachable" if quiet > 3 * self.period else "ready"


def node_a(leads: list[int], applied: list[int]) -> tuple[ClusterNode, list[FakeLog]]:
    """Node a of a, b, c, where a leads ``leads`` and b the rest (c leads nothing, and is
    behind on every shard but shard 3: b is the one to hand to)."""
    settings = CoreSettings(
        node_id="a", peers="127.0.0.1:17422,127.0.0.1:27422", shards=SHARDS,
        cluster_secret="s" * 32,
    )  # fmt: skip
    node = ClusterNode(settings)
    logs = [FakeLog() for _ in range(SHARDS)]
    node.logs = logs  # type: ignore[assignment]
    node.stores = [FakeStore(n) for n in applied]  # type: ignore[misc]
    shards = [FakeShard(leading=i in leads) for i in range(SHARDS)]
    node.broker = type("Broker", (), {"shards": shards})()  # type: ignore[assignment]
    node.membership = FakeMembership(  # type: ignore[assignment]
        {
            "a": FakePeer(dict(enumerate(applied))),
            "b": FakePeer(dict(enumerate(applied))),
        }
    )
    node.leadership.leaders = {i: ("a" if i in leads else "b") for i in range(SHARDS)}
    for i, log in enumerate(logs):  # (JetStream elects the one preferred: _hand sees it at once)
        log.elected = functools.partial(node.leadership.leaders.__setitem__, i)
    node.leadership.balancer.heard("b")  # (its announcement: what it applied is what a had then)
    return node, logs


def announce(node: ClusterNode, peer: str, theirs: list[int], ago: float = 0.0) -> None:
    """``peer`` announces it applied ``theirs`` of each shard, ``ago`` seconds ago (the
    leadership notes what ``node`` had applied then: its stores' ``applied`` now)."""
    assert node.membership is not None
    node.membership.peers()[peer] = FakePeer(dict(enumerate(theirs)))
    node.leadership.balancer.heard(peer)
    if ago:
        heard = node.leadership.balancer._heard[peer]
        heard[-1] = dataclasses.replace(heard[-1], at=heard[-1].at - ago)


def apply(node: ClusterNode, applied: list[int]) -> None:
    """``node``'s stores have applied ``applied`` of each shard now."""
    for store, n in zip(node.stores, applied, strict=True):
        store.applied = n


def handed(logs: list[FakeLog]) -> dict[int, list[str]]:
    return {i: log.handed for i, log in enumerate(logs) if log.handed}


async def test_a_node_over_its_share_hands_the_quietest_shard_on() -> None:
    # entries since the balancer's last look: 50, 5 and 500
    node, logs = node_a(leads=[0, 1, 2], applied=[150, 105, 600, 100])
    node.leadership.balancer._applied_seen = dict.fromkeys(range(SHARDS), 100)
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {1: ["b"]}  # shard 1 had the fewest entries since


async def test_a_node_within_its_share_keeps_its_shards() -> None:
    node, logs = node_a(leads=[0, 1], applied=[0] * SHARDS)
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}


async def test_a_shard_just_taken_over_is_not_the_one_handed_on() -> None:
    node, logs = node_a(leads=[0, 1], applied=[0] * SHARDS)
    assert node.broker is not None
    await node.leadership._promote(2)  # a failover: shard 2 comes to a, which now leads 3 of 4
    node.leadership.leaders[2] = "a"
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {0: ["b"]}  # 0 and 1 have been led for long; 2 is new


async def test_shards_just_taken_over_stay_until_they_have_settled() -> None:
    node, logs = node_a(leads=[], applied=[0] * SHARDS)
    for i in (0, 1, 2):  # b's node died a moment ago, say, and a took these over
        await node.leadership._promote(i)
        node.leadership.leaders[i] = "a"
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}, "a shard taken over just now was handed on"
    node.leadership.led_since[1] -= balancer._SETTLE
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {1: ["b"]}


async def test_nothing_is_handed_to_a_pod_kubernetes_says_is_not_ready() -> None:
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    node._k8s_changed({"a": Member("a", "10.0.0.1", True), "b": Member("b", "10.0.0.2", False)})
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}
    node._k8s_changed({"a": Member("a", "10.0.0.1", True), "b": Member("b", "10.0.0.2", True)})
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {0: ["b"]}


async def test_a_pod_not_ready_for_a_while_hands_on_what_it_leads() -> None:
    node, logs = node_a(leads=[2], applied=[0] * SHARDS)  # within its share
    node._k8s_changed({"a": Member("a", "10.0.0.1", False), "b": Member("b", "10.0.0.2", True)})
    await node.leadership.balancer._balance_once()
    await node.leadership.balancer._guard_unready_once()
    assert handed(logs) == {}, "handed on at the first sign (a blip is no failover)"
    node.leadership.balancer._unready_since["a"] -= balancer._UNREADY_GRACE
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}, "the balancer moves nothing from a node that is not ready"
    await node.leadership.balancer._guard_unready_once()
    assert handed(logs) == {2: ["b"]}


async def test_a_pod_gone_from_the_endpoints_for_a_while_hands_on_what_it_leads() -> None:
    node, logs = node_a(leads=[2], applied=[0] * SHARDS)
    node._k8s_changed({"a": Member("a", "10.0.0.1", True), "b": Member("b", "10.0.0.2", True)})
    node._k8s_changed({"b": Member("b", "10.0.0.2", True)})  # a left the endpoints
    await node.leadership.balancer._guard_unready_once()
    assert handed(logs) == {}, "handed on at once (a blip is no failover)"
    node.leadership.balancer._unready_since["a"] -= balancer._UNREADY_GRACE
    await node.leadership.balancer._guard_unready_once()
    assert handed(logs) == {2: ["b"]}


async def test_a_node_the_endpoints_never_named_is_not_judged_by_them() -> None:
    # (its id is not its pod's name: the endpoints say nothing about it)
    node, _ = node_a(leads=[2], applied=[0] * SHARDS)
    node._k8s_changed({"pod-0": Member("pod-0", "10.0.0.1", True)})
    assert "a" not in node.leadership.balancer._unready_since
    node._k8s_changed({"b": Member("b", "10.0.0.2", False)})
    unready = node.leadership.balancer._unready_since
    assert set(unready) == {"pod-0", "b"}  # pod-0 left; b is not ready


async def test_a_shard_is_handed_only_to_a_replica_of_its_stream() -> None:
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    for log in logs:
        log.peers = ("a", "c")  # b holds no replica (it joined after the streams were made)
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}, "a shard was handed to a node that cannot lead it"
    logs[1].peers = ("a", "b", "c")
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {1: ["b"]}


async def test_nothing_moves_while_a_node_is_unheard_nor_for_a_while_after() -> None:
    # (a partition: b cut off, or its links failing; then back)
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    assert node.membership is not None
    b = node.membership.peers()["b"]
    b.last_heard -= 2 * node.membership.period  # two announcements missed
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}, "a lead was moved while a node is unheard"
    b.last_heard = time.monotonic()  # heard again
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}, "a lead was moved at once after a node came back"
    node.leadership.balancer._impaired_at -= balancer._SETTLE
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {0: ["b"]}


async def test_a_node_unheard_for_long_is_down_and_holds_nothing_up() -> None:
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    assert node.membership is not None
    node.membership.peers()["c"] = FakePeer({}, last_heard=time.monotonic() - balancer._DOWN)
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {0: ["b"]}


def test_a_stream_grows_back_when_nodes_join() -> None:
    node, logs = node_a(leads=[0], applied=[0] * SHARDS)
    logs[0].peers, logs[0].configured = ("a", "b"), 2  # scaled down to two
    replicas = node.leadership.replicas
    assert replicas._more_replicas(0) == 0  # a and b: as many as there are nodes
    assert node.membership is not None
    node.membership.peers()["c"] = FakePeer({})
    assert replicas._more_replicas(0) == 3
    logs[0].configured = 3
    assert replicas._more_replicas(0) == 0  # asked for already (JetStream is placing it)


async def test_a_node_that_keeps_up_under_load_is_handed_a_shard() -> None:
    # under load: b's announcements said what a had applied when each came, and a has
    # applied thousands of entries since the last (up to 2 s ago): b is caught up
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    apply(node, [3000] * SHARDS)
    announce(node, "b", [2990] * SHARDS, ago=0.0)  # (2 s after the one node_a made)
    heard = node.leadership.balancer._heard["b"]
    heard[0] = dataclasses.replace(heard[0], at=heard[-1].at - 2.0)
    apply(node, [9000] * SHARDS)  # 2 s later, b's announcement not yet come again
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {0: ["b"]}
    assert balancer._CAUGHT_UP < 9000 - 2990, "(b looked behind, compared now)"


async def test_a_node_behind_when_it_announced_is_not_handed_a_shard() -> None:
    # b has just restarted, say, and is applying the log from far behind
    node, logs = node_a(leads=[0, 1, 2], applied=[5000] * SHARDS)
    announce(node, "b", [5000 - balancer._CAUGHT_UP - 1] * SHARDS, ago=2.0)
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}, "a shard was handed to a node behind (a quiet shard: 101 entries)"
    assert sum(log.asked for log in logs) == 0  # (JetStream not asked: no move considered)
    announce(node, "b", [5000 - balancer._CAUGHT_UP] * SHARDS)
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {0: ["b"]}


@pytest.mark.parametrize(
    ("pace", "behind", "caught_up"),
    [
        (0, 150, False),  # a quiet shard: 100 entries at most
        (2000, 150, True),  # 2000 entries a second: 100 + 0.5 s of them, 1100
        (2000, 1050, True),
        (2000, 1150, False),  # more than half a second of the writes behind
        (20000, 9000, True),
    ],
)
async def test_how_far_behind_a_node_may_be_grows_with_the_load(
    pace: int, behind: int, caught_up: bool
) -> None:
    # a applied ``pace`` entries a second between b's last two announcements (2 s apart)
    node, logs = node_a(leads=[0, 1, 2], applied=[100_000] * SHARDS)
    heard = node.leadership.balancer._heard["b"]
    heard[0] = dataclasses.replace(heard[0], at=time.monotonic() - 2.0)
    apply(node, [100_000 + 2 * pace] * SHARDS)
    announce(node, "b", [100_000 + 2 * pace - behind] * SHARDS)
    await node.leadership.balancer._balance_once()
    assert handed(logs) == ({0: ["b"]} if caught_up else {})


async def test_a_node_never_heard_from_is_not_handed_a_shard() -> None:
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    node.leadership.balancer._heard.clear()
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}


@pytest.mark.parametrize(
    ("replica", "why"),
    [
        ((balancer._CAUGHT_UP + 1, 0.01), "its replica is behind"),
        ((0, balancer._ACTIVE + 1), "the stream's leader has not heard from it for long"),
        (None, "its replica is offline, or it holds none"),
    ],
)
async def test_a_node_is_handed_a_shard_only_if_its_replica_has_caught_up_now(
    replica: tuple[int, float] | None, why: str
) -> None:
    # (b announced it had applied what a had: since, it froze, or its link failed)
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    for log in logs:
        assert log.replicas is not None
        log.replicas.pop("b")
        if replica is not None:
            log.replicas["b"] = replica
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}, f"a shard was handed to b: {why}"
    assert logs[0].asked == 1  # (JetStream asked once, for the shard a move was considered for)


async def test_nothing_is_handed_while_the_streams_leader_does_not_say() -> None:
    node, logs = node_a(leads=[0, 1, 2], applied=[0] * SHARDS)
    for log in logs:
        log.replicas = None
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {}
    logs[0].replicas = {"b": (0, 0.01)}
    await node.leadership.balancer._balance_once()
    assert handed(logs) == {0: ["b"]}


async def test_a_stopping_node_prefers_a_caught_up_heir_else_lets_jetstream_choose() -> None:
    node, logs = node_a(leads=[0, 1], applied=[0] * SHARDS)
    await node.leadership.step_down(0)
    assert handed(logs) == {0: ["b"]}
    announce(node, "b", [-1000] * SHARDS)  # far behind
    await node.leadership.step_down(1)
    assert handed(logs) == {0: ["b"], 1: ["None"]}  # (no preferred heir: JetStream picks)
