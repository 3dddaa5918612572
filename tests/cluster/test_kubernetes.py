"""Leadership moved by Kubernetes: a real three-node cluster whose nodes watch the core
Service's EndpointSlices (POLYMQ_K8S_SERVICE, a kubeconfig naming kmock's emulator of the
API server, which this test runs and changes). Each node's id is its pod's name, as in the
StatefulSet (``targetRef.name`` of its endpoint). A pod marked not ready for longer than
the grace period (10 s) hands its shards' leads to ready nodes, and a blip shorter than
that moves nothing; marked ready again it is a candidate again (it is handed shards); a
pod that leaves the endpoints hands on its leads after the grace period too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .harness import Cluster, Node, eventually, running_cluster
from .kube import Emulator

pytestmark = pytest.mark.timeout(420)

GRACE = 10.0  # polymq_core.cluster.balancer._UNREADY_GRACE


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with Emulator() as emu:
        yield emu


@pytest.fixture(scope="module")
def cluster(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kubernetes")
    with running_cluster(root, env=emulator.env(root)) as c:
        yield c


def seen_pods(node: Node) -> dict[str, bool] | None:
    info = node.cluster_info()
    if info is None or info.get("kubernetes") is None:
        return None
    return {m["name"]: m["ready"] for m in info["kubernetes"]["members"]}


def all_see(cluster: Cluster, pods: dict[str, bool]) -> None:
    eventually(
        lambda: all(seen_pods(n) == pods for n in cluster.running()),
        15,
        f"every node sees the endpoints {pods}",
    )


def led_by(cluster: Cluster) -> dict[str, set[int]]:
    """Which shards each node leads, once the three agree."""
    leaders = cluster.leaders(timeout=30)
    out: dict[str, set[int]] = {n.id: set() for n in cluster.nodes}
    for shard, node in leaders.items():
        out[node.id].add(shard)
    return out


def wait_leads_none(cluster: Cluster, node: Node, within: float) -> tuple[float, dict[str, Any]]:
    """Seconds until ``node`` leads no shard and the others agree who does."""
    start = time.monotonic()

    def check() -> dict[str, set[int]] | None:
        led = led_by(cluster)
        return led if not led[node.id] else None

    led = eventually(check, within, f"{node.id} leads nothing", interval=0.5)
    return time.monotonic() - start, led


def test_endpoints_move_leadership(cluster: Cluster, emulator: Emulator) -> None:
    cluster.wait_formed(timeout=60)
    pods = {n.id: True for n in cluster.nodes}
    emulator.set_pods(pods, create=True)
    all_see(cluster, pods)
    # a leader whose shards the balancer does not take (it leads no more than its share);
    # a new cluster's elections may have put every lead on one node: the balancer spreads them
    share = -(-cluster.shards // 3)

    def leader_within_its_share() -> tuple[dict[str, set[int]], Node] | None:
        led = led_by(cluster)
        return next(((led, n) for n in cluster.nodes if 0 < len(led[n.id]) <= share), None)

    led, a = eventually(leader_within_its_share, 90, "a node leading no more than its share")
    b, c = cluster.others(a)
    print(f"\nleaders: {led}; {a.id} goes first")

    # a blip shorter than the grace: nothing moves
    emulator.set_pods({**pods, a.id: False})
    all_see(cluster, {**pods, a.id: False})
    time.sleep(GRACE / 2)
    emulator.set_pods(pods)
    all_see(cluster, pods)
    time.sleep(GRACE)
    assert led_by(cluster)[a.id] >= led[a.id], "a blip moved leadership"

    # not ready past the grace: its leads go to the ready nodes, not before the grace
    emulator.set_pods({**pods, a.id: False})
    all_see(cluster, {**pods, a.id: False})
    marked = time.monotonic()
    took, after = wait_leads_none(cluster, a, GRACE + 30)
    waited = time.monotonic() - marked
    print(f"not ready: {a.id} led nothing {waited:.1f}s after it was marked; leaders {after}")
    assert waited >= GRACE - 1, f"{a.id}'s leads moved after {waited:.1f}s, before the grace"
    assert after[b.id] | after[c.id] == set(range(cluster.shards))

    # ready again, and another one not ready: a is a candidate again and is handed shards
    b, c = sorted((b, c), key=lambda n: -len(after[n.id]))  # b: the one leading more
    emulator.set_pods({**pods, b.id: False})
    all_see(cluster, {**pods, b.id: False})
    took, after = wait_leads_none(cluster, b, GRACE + 30)
    print(f"{a.id} ready, {b.id} not: {b.id} led nothing after {took:.1f}s; leaders {after}")
    assert after[a.id], f"{a.id} (ready again) was handed none of {b.id}'s shards: {after}"

    # gone from the endpoints: its leads move after the grace too
    assert after[c.id], f"{c.id} leads nothing to move: {after}"
    emulator.set_pods({a.id: True, b.id: True})
    all_see(cluster, {a.id: True, b.id: True})
    took, after = wait_leads_none(cluster, c, GRACE + 30)
    print(f"{c.id} gone from the endpoints: it led nothing after {took:.1f}s; leaders {after}")
    assert after[a.id] | after[b.id] == set(range(cluster.shards))
