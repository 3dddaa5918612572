"""polymq_core.cluster.endpoints against kmock's Kubernetes emulator (a real HTTP server on
127.0.0.1), with the official ``kubernetes`` client on both sides: the test changes the
Service's EndpointSlices, the watcher follows; watch expiry (410 Gone) and API errors are
survived."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import pytest
import requests
from kubernetes import client

from polymq_core.cluster.endpoints import SERVICE_LABEL, EndpointWatcher, Member, scaled_below

from ...procs import PolymqProcess
from .test_natsd import free_port

NS, SERVICE = "polymq", "polymq-core"

pytestmark = pytest.mark.timeout(60)


def endpoint(pod: str, address: str, ready: bool | None = True) -> dict[str, Any]:
    conditions = {} if ready is None else {"ready": ready}
    return {
        "addresses": [address],
        "conditions": conditions,
        "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
    }


def endpoint_slice(name: str, *endpoints: dict[str, Any], service: str = SERVICE) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {SERVICE_LABEL: service}},
        "addressType": "IPv4",
        "endpoints": list(endpoints),
    }


class Seen:
    """What the watcher told, in order; waits for a state."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Member]] = []
        self._changed = asyncio.Event()

    def __call__(self, members: dict[str, Member]) -> None:
        self.calls.append(members)
        self._changed.set()

    @property
    def now(self) -> dict[str, tuple[str, bool]]:
        last = self.calls[-1] if self.calls else {}
        return {m.name: (m.address, m.ready) for m in last.values()}

    async def until(self, expected: dict[str, tuple[str, bool]], within: float = 15) -> None:
        deadline = time.monotonic() + within
        while self.now != expected:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"members {self.now}, expected {expected}"
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass


@pytest.fixture
async def api(kmock: kmock.KubernetesEmulator) -> AsyncIterator[client.DiscoveryV1Api]:
    config = client.Configuration()
    config.host = str(kmock.url).rstrip("/")
    api_client = client.ApiClient(config)
    yield client.DiscoveryV1Api(api_client)
    await asyncio.to_thread(api_client.close)


@pytest.fixture
async def watching(
    api: client.DiscoveryV1Api,
) -> AsyncIterator[Callable[[], tuple[EndpointWatcher, Seen]]]:
    started: list[EndpointWatcher] = []

    def start() -> tuple[EndpointWatcher, Seen]:
        seen = Seen()
        watcher = EndpointWatcher(
            NS,
            SERVICE,
            seen,
            api=api.api_client,
            loop=asyncio.get_running_loop(),
            watch_seconds=2,
            backoff=(0.05, 0.2),
        )
        watcher.start()
        started.append(watcher)
        return watcher, seen

    yield start
    for watcher in started:
        watcher.stop(timeout=0)


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """The client is synchronous and kmock serves on this loop: call it from a thread."""
    return await asyncio.to_thread(fn, *args)


async def test_members_appear_turn_ready_and_vanish(
    api: client.DiscoveryV1Api, watching: Callable[[], tuple[EndpointWatcher, Seen]]
) -> None:
    await call(
        api.create_namespaced_endpoint_slice,
        NS,
        endpoint_slice("a", endpoint("core-0", "10.0.0.10"), endpoint("core-1", "10.0.0.11")),
    )
    watcher, seen = watching()
    await seen.until({"core-0": ("10.0.0.10", True), "core-1": ("10.0.0.11", True)})
    # a third pod, not ready yet (and a slice of another Service, which is not ours)
    await call(
        api.create_namespaced_endpoint_slice,
        NS,
        endpoint_slice("other", endpoint("web-0", "10.0.9.9"), service="web"),
    )
    await call(
        api.create_namespaced_endpoint_slice,
        NS,
        endpoint_slice("b", endpoint("core-2", "10.0.0.12", ready=False)),
    )
    await seen.until(
        {
            "core-0": ("10.0.0.10", True),
            "core-1": ("10.0.0.11", True),
            "core-2": ("10.0.0.12", False),
        }
    )
    await call(
        api.patch_namespaced_endpoint_slice,
        "b",
        NS,
        endpoint_slice("b", endpoint("core-2", "10.0.0.12", ready=None)),  # unknown: ready
    )
    await seen.until(
        {
            "core-0": ("10.0.0.10", True),
            "core-1": ("10.0.0.11", True),
            "core-2": ("10.0.0.12", True),
        }
    )
    await call(api.delete_namespaced_endpoint_slice, "a", NS)
    await seen.until({"core-2": ("10.0.0.12", True)})
    assert all("web-0" not in c for c in seen.calls)
    assert watcher.last_error is None


async def test_an_expired_watch_lists_again_and_api_errors_are_survived(
    kmock: kmock.KubernetesEmulator,
    api: client.DiscoveryV1Api,
    watching: Callable[[], tuple[EndpointWatcher, Seen]],
) -> None:
    await call(
        api.create_namespaced_endpoint_slice,
        NS,
        endpoint_slice("a", endpoint("core-0", "10.0.0.10")),
    )
    failures = {"watch": 1, "list": 0}

    def first_watch(request: Any) -> bool:
        if request.params.get("watch") in ("true", "1") and failures["watch"]:
            failures["watch"] -= 1
            return True
        return False

    def failing_list(request: Any) -> bool:
        if request.params.get("watch") not in ("true", "1") and failures["list"]:
            failures["list"] -= 1
            return True
        return False

    kmock[first_watch] << 410
    kmock[failing_list] << 503
    watcher, seen = watching()
    await seen.until({"core-0": ("10.0.0.10", True)})
    deadline = time.monotonic() + 15
    while watcher.lists < 2:  # the watch said 410 Gone: listed again
        assert time.monotonic() < deadline, watcher.lists
        await asyncio.sleep(0.05)
    # the API server fails the next two listings; the watcher retries and goes on
    failures["list"] = 2
    failures["watch"] = 1  # ... after ending the current watch with a 410 again
    await call(
        api.create_namespaced_endpoint_slice,
        NS,
        endpoint_slice("b", endpoint("core-1", "10.0.0.11")),
    )
    await seen.until({"core-0": ("10.0.0.10", True), "core-1": ("10.0.0.11", True)})
    deadline = time.monotonic() + 15
    while failures["list"] or watcher.last_error is not None:
        assert time.monotonic() < deadline, (failures, watcher.last_error)
        await asyncio.sleep(0.05)
    await call(api.delete_namespaced_endpoint_slice, "b", NS)
    await seen.until({"core-0": ("10.0.0.10", True)})


async def test_a_cluster_node_shows_its_services_endpoints(
    kmock: kmock.KubernetesEmulator, api: client.DiscoveryV1Api, tmp_path: Path
) -> None:
    """``polymq run`` in cluster mode with POLYMQ_K8S_SERVICE (and a kubeconfig naming the
    emulator): its cluster view lists the Service's pods as the endpoints say. (It starts
    as the Service's one pod, with a node outside the Service given it as a seed: a second
    pod named at start would count as a replica, and JetStream would wait for it; one named
    later is a route and a member, not a replica of streams made already.)"""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: emu, cluster: {{server: '{str(kmock.url).rstrip('/')}'}}}}]\n"
        "users: [{name: me, user: {}}]\n"
        "contexts: [{name: here, context: {cluster: emu, user: me}}]\n"
        "current-context: here\n"
    )
    await call(
        api.create_namespaced_endpoint_slice, NS, endpoint_slice("a", endpoint("k1", "10.0.0.1"))
    )
    port = free_port()
    node = PolymqProcess(
        "run", tmp_path, "--node-id", "k1", "--peers", f"127.0.0.1:{port}",
        "--cluster-port", str(port),
        env={
            **os.environ,
            "POLYMQ_K8S_SERVICE": SERVICE,
            "POLYMQ_K8S_NAMESPACE": NS,
            "POLYMQ_KUBECONFIG": str(kubeconfig),
            "POLYMQ_CLUSTER_SECRET": "k" * 32,
        },
    )  # fmt: skip
    # a second node, outside Kubernetes, given k1 as its seed: a JetStream cluster answers
    # once two servers are in it
    second_port = free_port()
    second = PolymqProcess(
        "core", tmp_path / "k0", "--node-id", "k0", "--peers", f"127.0.0.1:{port}",
        "--cluster-port", str(second_port),
        env={**os.environ, "POLYMQ_CLUSTER_SECRET": "k" * 32},
    )  # fmt: skip
    # (kmock answers on this loop meanwhile)
    await asyncio.gather(asyncio.to_thread(node.start, 60), asyncio.to_thread(second.start, 60))
    try:
        await call(
            api.patch_namespaced_endpoint_slice,
            "a",
            NS,
            endpoint_slice(
                "a", endpoint("k1", "10.0.0.1"), endpoint("k2", "10.0.0.2", ready=False)
            ),
        )

        def view() -> Any:
            r = requests.get(f"http://127.0.0.1:{node.ports['admin']}/api/cluster", timeout=5)
            return r.json()["kubernetes"]

        async def until(members: list[dict[str, Any]]) -> None:
            deadline = time.monotonic() + 30
            while (seen := await asyncio.to_thread(view))["members"] != members:
                assert time.monotonic() < deadline, (seen, node.log()[-2000:])
                await asyncio.sleep(0.2)

        await until(
            [
                {"name": "k1", "address": "10.0.0.1", "ready": True},
                {"name": "k2", "address": "10.0.0.2", "ready": False},
            ]
        )
        assert (await asyncio.to_thread(view))["service"] == f"{NS}/{SERVICE}"
        await call(
            api.patch_namespaced_endpoint_slice,
            "a",
            NS,
            endpoint_slice("a", endpoint("k1", "10.0.0.1")),
        )
        await until([{"name": "k1", "address": "10.0.0.1", "ready": True}])
    finally:
        await asyncio.to_thread(node.kill)
        await asyncio.to_thread(second.kill)


async def test_a_pod_knows_when_its_statefulset_was_scaled_below_it(
    kmock: kmock.KubernetesEmulator, api: client.DiscoveryV1Api
) -> None:
    """``kubectl scale --replicas=2`` stops pod 2 for good (it leaves the streams); a
    restart, a rolling update, scaling to nothing or an uninstall does not."""
    apps = client.AppsV1Api(api.api_client)

    def statefulset(replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "polymq-core", "namespace": NS},
            "spec": {
                "replicas": replicas,
                "serviceName": SERVICE,
                "selector": {"matchLabels": {"app": "core"}},
                "template": {
                    "metadata": {"labels": {"app": "core"}},
                    "spec": {"containers": [{"name": "core", "image": "polymq"}]},
                },
            },
        }

    def below(pod: str) -> bool | None:
        return scaled_below(api.api_client, NS, pod)

    assert await call(below, "polymq-core-2") is None  # no StatefulSet (uninstalled)
    await call(apps.create_namespaced_stateful_set, NS, statefulset(3))
    assert await call(below, "polymq-core-2") is False  # three: pod 2 stays
    await call(apps.patch_namespaced_stateful_set, "polymq-core", NS, statefulset(2))
    assert await call(below, "polymq-core-2") is True  # scaled to two: pod 2 goes
    assert await call(below, "polymq-core-1") is False
    await call(apps.patch_namespaced_stateful_set, "polymq-core", NS, statefulset(0))
    assert await call(below, "polymq-core-0") is False  # all of them: a stop, not a scale
    assert await call(below, "core") is None  # not a StatefulSet's pod name
