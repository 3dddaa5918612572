"""Fixtures of the cluster tests: real three-node clusters (``harness.Cluster``) on
127.0.0.1. One cluster of the default settings serves every module that can give it back
whole (``shared_cluster``): modules that only read it, and modules that kill, stop or freeze
its nodes, which are restarted or thawed on their data before the next module has it. Modules
that need other settings (TLS, a page window, Kubernetes' endpoints, network namespaces) or
leave it costly to restore (nodes leaving for good; every node down at the end, which would
take a whole cluster's start again) start their own with :func:`harness.running_cluster`.

When a test fails, every live cluster's nodes are described (state, cluster view, /readyz,
the tail of each node's log) in the test's captured output."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Cluster, active_clusters, started_cluster


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def _describe_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for cluster in active_clusters():
            print(f"\n######## {cluster!r} after {request.node.name}\n{cluster.diagnose(60)}")


class SharedCluster:
    """The session's one cluster of the default settings, lent to module after module: each
    borrower gets it whole (:func:`restore`), or, when it cannot be made whole again, a fresh
    one in its place."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.cluster: Cluster | None = None

    def lend(self) -> Cluster:
        if self.cluster is not None:
            try:
                restore(self.cluster)
            except AssertionError as exc:
                print(f"the shared cluster could not be restored, starting another: {exc}")
                self.close()
        if self.cluster is None:
            self.cluster = started_cluster(Cluster(self.factory.mktemp("shared-cluster")))
        return self.cluster

    def close(self) -> None:
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            problems = cluster.stop_all()
            assert not problems, "stopping the shared cluster: " + "; ".join(problems)


def restore(cluster: Cluster) -> None:
    """Every node running again: a frozen one thawed, a killed or stopped one started on its
    own data, ports and id; then formed (every node ready, one agreed leader per shard). A
    node started again leads nothing at first: the leaders are as uneven as JetStream may
    place them in a new cluster, and the balancer evens them out as it does there."""
    for node in cluster.nodes:
        if node.state == "frozen":
            cluster.thaw(node)
    down = [node for node in cluster.nodes if node.state in ("killed", "stopped")]
    if down:
        cluster.start_nodes(down)
    cluster.wait_formed(timeout=60)


@pytest.fixture(scope="package")  # (stopped once the last cluster test is done)
def _shared_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedCluster]:
    shared = SharedCluster(tmp_path_factory)
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture(scope="module")
def shared_cluster(_shared_clusters: SharedCluster) -> Cluster:
    """A formed three-node cluster of the default settings, every node running, shared with
    other modules: tests use names of their own (``harness.unique``), and may kill, stop or
    freeze nodes (they are brought back before the next module)."""
    return _shared_clusters.lend()
