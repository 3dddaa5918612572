"""Restarts: the whole cluster killed (-9) at once comes back with every acknowledged message;
a node restarted alone catches up with what it missed; a node whose data dir was wiped
rejoins as an empty replica, is filled, and then serves what it holds, as leader too."""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Any

import pytest

from .harness import (
    Cluster,
    Node,
    drain,
    http_publish_ok,
    http_stats,
    stomp_conn,
)

pytestmark = pytest.mark.timeout(240)

PER_SHARD = 6


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


def publish_everywhere(cluster: Cluster, tag: str, nodes: list[Node]) -> dict[str, list[str]]:
    """``PER_SHARD`` persistent messages to one fresh queue per shard, through ``nodes`` in
    turn, alternately over HTTP and STOMP (receipted): the queues and what was acknowledged."""
    sent: dict[str, list[str]] = {}
    with contextlib.ExitStack() as stack:
        stomps = {n.id: stack.enter_context(stomp_conn(n)) for n in nodes}
        for shard in range(cluster.shards):
            q = cluster.queue_in_shard(shard, tag)
            sent[q] = []
            for i in range(PER_SHARD):
                node = nodes[i % len(nodes)]
                body = f"{tag}-{shard}-{i}"
                if i % 2:
                    stomps[node.id].send_ok(f"/queue/{q}", body, persistent="true")
                else:
                    http_publish_ok(node, q, body)
                sent[q].append(body)
    return sent


def assert_all_there(node: Node, sent: dict[str, list[str]]) -> None:
    """Everything ``sent`` is consumed through ``node``, each exactly once."""
    for q, bodies in sent.items():
        got = drain(node, q, expect=len(bodies), timeout=60)
        counts = collections.Counter(m["body"] for m in got)
        assert counts == collections.Counter(bodies), (
            f"{q} via {node.id}: missing {sorted(set(bodies) - set(counts))}, "
            f"extra {dict(counts - collections.Counter(bodies))}"
        )


def caught_up(node: Node, others: list[Node]) -> dict[int, tuple[int, int]] | None:
    """None once ``node`` has applied, for every shard, as much as any of ``others`` has;
    else the shards it lags in: (its applied, theirs)."""
    mine = node.applied()
    theirs = [o.applied() for o in others]
    if mine is None or any(t is None for t in theirs):
        return {-1: (0, 0)}
    lag = {}
    for shard, applied in mine.items():
        best = max(t[shard] for t in theirs if t is not None)
        if applied < best:
            lag[shard] = (applied, best)
    return lag or None


def wait_caught_up(node: Node, others: list[Node], timeout: float) -> float:
    started = time.monotonic()
    last: dict[int, tuple[int, int]] | None = {}
    deadline = started + timeout
    while (last := caught_up(node, others)) is not None:
        assert time.monotonic() < deadline, f"{node.id} still behind: {last}"
        time.sleep(0.25)
    return time.monotonic() - started


def test_all_killed_at_once_keep_every_acknowledged_message(cluster: Cluster) -> None:
    cluster.wait_formed(timeout=30)
    sent = publish_everywhere(cluster, "all", cluster.nodes)
    before = {n.id: n.applied() for n in cluster.nodes}
    cluster.kill_all()
    started = time.monotonic()
    cluster.start_nodes(cluster.nodes)
    leaders = cluster.wait_formed(timeout=90)
    print(
        f"\nkilled all three; formed again {time.monotonic() - started:.1f}s after the "
        f"restart; applied before: {before}; leaders {[n.id for n in leaders.values()]}"
    )
    for i, (q, bodies) in enumerate(sent.items()):
        assert_all_there(cluster.nodes[i % 3], {q: bodies})


def test_node_restarted_alone_catches_up(cluster: Cluster) -> None:
    cluster.wait_formed(timeout=60)
    lagging = cluster.nodes[2]
    rest = cluster.others(lagging)
    cluster.kill(lagging)
    cluster.wait_formed(timeout=60, nodes=rest)
    sent = publish_everywhere(cluster, "alone", rest)
    cluster.restart(lagging)
    cluster.wait_formed(timeout=60)
    took = wait_caught_up(lagging, rest, 60)
    print(
        f"\n{lagging.id} restarted alone: caught up {took:.1f}s after it formed again; "
        f"applied {lagging.applied()} vs {[o.applied() for o in rest]}"
    )
    assert_all_there(lagging, sent)


def test_wiped_node_rejoins_as_a_replica_and_is_filled(cluster: Cluster) -> None:
    leaders = cluster.wait_formed(timeout=60)
    wiped = cluster.nodes[0]
    rest = cluster.others(wiped)
    older = publish_everywhere(cluster, "old", cluster.nodes)
    cluster.kill(wiped)
    cluster.wait_formed(timeout=60, nodes=rest)
    newer = publish_everywhere(cluster, "gap", rest)
    cluster.restart(wiped, wipe=True)
    cluster.wait_formed(timeout=90)
    took = wait_caught_up(wiped, rest, 90)
    print(
        f"\n{wiped.id} wiped and restarted: caught up {took:.1f}s after it formed again; "
        f"applied {wiped.applied()} vs {[o.applied() for o in rest]}"
    )
    sent = {**older, **newer}

    # the same queue depths through the wiped node as through the others
    for q, bodies in sent.items():
        depths = {n.id: http_stats(n, q)["messages"] for n in cluster.nodes}
        assert set(depths.values()) == {len(bodies)}, (q, depths)

    # then the others' leadership goes: the wiped node is made to lead shards (graceful
    # restarts move leaders), and the node leading the most among the others is killed, so the
    # wiped node serves from its own (filled) replica what it leads, and forwards the rest
    leaders = cluster.spread_leaders(among=[wiped])
    print(f"{wiped.id} leads shards {sorted(s for s, n in leaders.items() if n is wiped)}")
    counts = collections.Counter(n.id for n in leaders.values() if n is not wiped)
    victim = cluster.node_by_id(counts.most_common(1)[0][0]) if counts else rest[0]
    cluster.kill(victim)
    remaining = cluster.others(victim)
    leaders = cluster.wait_formed(timeout=60, nodes=remaining)
    led = sorted(s for s, n in leaders.items() if n is wiped)
    print(f"killed {victim.id}; the wiped {wiped.id} now leads shards {led}")
    deadline = time.monotonic() + 30
    while wrong := depths_wrong(wiped, sent):
        assert time.monotonic() < deadline, (
            f"queue depths through {wiped.id} after {victim.id} died (depth, published): "
            f"{wrong}; the other survivor shows {depths_wrong(remaining[-1], sent, all=True)}"
        )
        time.sleep(0.5)
    assert_all_there(wiped, sent)


def depths_wrong(
    node: Node, sent: dict[str, list[str]], all: bool = False
) -> dict[str, tuple[Any, int]]:
    """The queues whose depth through ``node`` is not what was published (``all``: every
    queue): (stats' messages, or the error, and the number published)."""
    out: dict[str, tuple[Any, int]] = {}
    for q, bodies in sent.items():
        try:
            depth: Any = http_stats(node, q)["messages"]
        except AssertionError as exc:
            depth = str(exc)[:200]
        if all or depth != len(bodies):
            out[q] = (depth, len(bodies))
    return out
