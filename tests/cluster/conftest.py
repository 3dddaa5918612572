"""Fixtures of the cluster tests: real three-node clusters (``harness.Cluster``) on
127.0.0.1. Modules that leave the cluster as they found it share one (``shared_cluster``);
those that kill or freeze nodes start their own with :func:`harness.running_cluster`.

When a test fails, every live cluster's nodes are described (state, cluster view, /readyz,
the tail of each node's log) in the test's captured output."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Cluster, active_clusters, running_cluster


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


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One formed three-node cluster for the tests that leave it whole."""
    with running_cluster(tmp_path_factory.mktemp("shared-cluster")) as cluster:
        yield cluster
