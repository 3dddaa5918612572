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
  nats.conf and nats-server reloads it (its log: ``Reloaded: cluster routes``). The
  sidecars' partition watch probes the other nodes' cores at the endpoints' ``admin``
  ports, four times a second each, and no node's log (its core's, its nats-server's)
  says a word about those connections."""

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
        _probes_leave_no_trace(cluster)
        queue = cluster.queue_in_shard(0, "miss")
        http_publish_ok(n3, queue, "across a route --peers did not name")
        got = drain(n2, queue, expect=1, timeout=30)
        assert [m["body"] for m in got] == ["across a route --peers did not name"]
    print(f"\ntest took {time.monotonic() - started:.1f}s")


_PROBE_WINDOW = 3.0  # seconds: 24 probes into each node (two peers, four a second each)


def _probes_leave_no_trace(cluster: Cluster) -> None:
    """Each sidecar's watch, armed, probes the two other nodes' admin ports from the
    endpoints; while they do, no node's log grows with a line about a connection (a probe
    of a NATS route port adds two at the default level: ``Route connection created``,
    ``Router connection closed``), and no sidecar counts itself cut off (an armed watch
    whose probes went unanswered would within 1.5 s: so they are answered)."""
    logs = [n.workdir / name for n in cluster.nodes for name in ("nats.log", "run.log")]
    armed = "other nodes answer: this node's nats-server is stopped from now on"
    for node in cluster.nodes:
        sidecar = node.workdir / "nats.log"
        probed = ", ".join(f"127.0.0.1:{n.ports['admin']}" for n in cluster.others(node))
        for said in (f"probing the other nodes' admin ports: {probed}", armed):
            eventually(
                lambda: said in sidecar.read_text(errors="replace"),  # noqa: B023
                30,
                f"{node.id}'s sidecar: {said!r}",
            )
    sizes = [path.stat().st_size for path in logs]
    time.sleep(_PROBE_WINDOW)
    for path, size in zip(logs, sizes, strict=True):
        with open(path, "rb") as f:
            f.seek(size)
            grown = f.read().decode(errors="replace")
        print(f"{path.parent.name}/{path.name}: {len(grown.splitlines())} lines while probed")
        said = [line for line in grown.splitlines() if "connection" in line.lower()]
        assert not said, f"{path}: {said}"
        assert "cut off" not in grown, grown
