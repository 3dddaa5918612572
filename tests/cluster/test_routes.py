"""NATS routes from Kubernetes: the nodes watch the core Service's EndpointSlices (kmock's
emulator of the API server, through a kubeconfig) and route to every pod they name, ready
or not, besides (or without) ``--peers``. On one machine the nodes differ by cluster port,
so each pod has a slice of its own whose port ``cluster`` is that node's (a slice's ports
are all its endpoints'): what the EndpointSlice controller makes for pods whose named
target port resolves to different numbers.

- Three nodes given no ``--peers`` at all form one cluster: each waits for the endpoints to
  name another pod, starts its nats-server with those routes, and the streams get three
  replicas; a persistent message published through one node is consumed through another.
- Nodes whose ``--peers`` miss a node, with their NATS run apart (``polymq nats``, the
  chart's sidecar), learn it from the endpoints: the sidecar writes the route into its
  nats.conf and nats-server reloads it (its log: ``Reloaded: cluster routes``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import (
    Cluster,
    Node,
    drain,
    eventually,
    http_publish_ok,
    running_cluster,
)
from .kube import Emulator

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator() as emu:
        yield emu


def routes_of(node: Node) -> set[str]:
    info = node.cluster_info()
    return set(info["routes"]) if info is not None else set()


def others_routes(cluster: Cluster, node: Node) -> set[str]:
    return {f"127.0.0.1:{n.cluster_port}" for n in cluster.others(node)}


def test_nodes_without_peers_form_one_cluster_from_the_endpoints(
    emulator: Emulator, tmp_path: Path
) -> None:
    started = time.monotonic()
    nodes: dict[int, list[int]] = {1: [], 2: [], 3: []}  # no --peers for any node
    # not ready yet, as pods that have not started: routes all the same
    prepare = lambda cluster: emulator.put_node_slices(cluster.nodes, ready=False)  # noqa: E731
    env = emulator.env(tmp_path)
    with running_cluster(tmp_path, env=env, seeds=nodes, before_start=prepare) as cluster:
        emulator.put_node_slices(cluster.nodes, ready=True)
        leaders = cluster.wait_formed(timeout=60)
        print(f"\nformed {cluster.formed_after:.1f}s after the nodes were started")
        for node in cluster.nodes:
            assert "--peers" not in node.args()
            info = node.cluster_info()
            assert info is not None
            assert {m["id"] for m in info["nodes"]} == {n.id for n in cluster.nodes}, info
            assert info["replicas"] == 3, info  # counted from the endpoints
            assert set(info["routes"]) == others_routes(cluster, node), info["routes"]
            assert "NATS routes: 127.0.0.1:" in node.log()  # (from none: it waited for them)
        n1, n2, _ = cluster.nodes
        shard = next((s for s, n in leaders.items() if n is not n1), 0)
        queue = cluster.queue_in_shard(shard, "k8s")
        http_publish_ok(n1, queue, "routed by the endpoints")
        got = drain(n2, queue, expect=1, timeout=30)
        assert [m["body"] for m in got] == ["routed by the endpoints"]
    print(f"test took {time.monotonic() - started:.1f}s")


def test_nodes_whose_peers_miss_one_learn_it_from_the_endpoints(
    emulator: Emulator, tmp_path: Path
) -> None:
    """Nodes 1 and 2 name each other only; node 3 names node 1. Their NATS runs apart
    (``polymq nats``, as the chart's sidecar, with the core's environment)."""
    started = time.monotonic()
    seeds = {1: [2], 2: [1], 3: [1]}
    prepare = lambda cluster: emulator.put_node_slices(cluster.nodes, ready=True)  # noqa: E731
    env = emulator.env(tmp_path)
    with running_cluster(
        tmp_path, env=env, seeds=seeds, nats_apart=True, before_start=prepare
    ) as cluster:
        n1, n2, n3 = cluster.nodes
        for node in (n1, n2):
            assert str(n3.cluster_port) not in " ".join(node.args())
            conf = node.data_dir / "nats-run" / "nats.conf"
            eventually(
                lambda conf=conf: f"127.0.0.1:{n3.cluster_port}" in conf.read_text(),  # type: ignore[misc]
                30,
                f"{node.id}'s nats.conf routing to {n3.id}",
            )
            eventually(
                lambda node=node: "Reloaded: cluster routes" in node.nats_log(),  # type: ignore[misc]
                30,
                f"{node.id}'s nats-server reloading its routes",
            )
        for node in cluster.nodes:
            assert routes_of(node) == others_routes(cluster, node), node.cluster_info()
        cluster.wait_formed(timeout=60)
        queue = cluster.queue_in_shard(0, "miss")
        http_publish_ok(n3, queue, "across a route --peers did not name")
        got = drain(n2, queue, expect=1, timeout=30)
        assert [m["body"] for m in got] == ["across a route --peers did not name"]
    print(f"\ntest took {time.monotonic() - started:.1f}s")
