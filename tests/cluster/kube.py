"""kmock's emulator of the Kubernetes API server for the cluster tests: the core's headless
Service's EndpointSlices, which the nodes list and watch through a kubeconfig naming it
(the one part of a deployment that cannot run here)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import kmock
from kubernetes import client

from .harness import Node

NS, SERVICE = "polymq", "polymq-core"
SLICE = "polymq-core-abcde"
LABEL = "kubernetes.io/service-name"


class Emulator:
    """kmock's KubernetesEmulator serving on a loop of its own (the cluster's harness is
    synchronous), and the official client's DiscoveryV1Api talking to it."""

    def __init__(self) -> None:
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self.api: client.DiscoveryV1Api | None = None
        self._made: set[str] = set()  # the slices put_node_slices made

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = self._loop.create_future()
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
            self.url = str(emulator.url).rstrip("/")
            self._started.set()
            await self._stop

    def __enter__(self) -> Emulator:
        self._thread.start()
        assert self._started.wait(20), "kmock did not start"
        config = client.Configuration()
        config.host = self.url
        self.api = client.DiscoveryV1Api(client.ApiClient(config))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.api is not None:
            self.api.api_client.close()
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(10)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: emu, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: me, user: {}}]\n"
            "contexts: [{name: here, context: {cluster: emu, user: me}}]\n"
            "current-context: here\n"
        )
        return path

    def env(self, root: Path) -> dict[str, str]:
        """A node's environment to watch the Service here (its kubeconfig under ``root``)."""
        return {
            "POLYMQ_K8S_SERVICE": SERVICE,
            "POLYMQ_K8S_NAMESPACE": NS,
            "POLYMQ_KUBECONFIG": str(self.kubeconfig(root / "kubeconfig")),
        }

    def put_node_slices(self, nodes: Sequence[Node], *, ready: bool) -> None:
        """One EndpointSlice per node, naming its pod (the node id) at 127.0.0.1 and its
        cluster and admin ports as the slice's ports ``cluster`` and ``admin`` (the chart's
        headless Service's names): nodes on one machine differ by port,
        and a slice's ports are those of all its endpoints (the EndpointSlice controller
        makes one slice per port set). Created, or replaced when they exist; the slices of
        nodes not among ``nodes`` are deleted (a cluster that started over on fresh ports
        and node ids must not be routed to the ones it gave up)."""
        assert self.api is not None
        names = {f"{SERVICE}-{node.id}" for node in nodes}
        for gone in sorted(self._made - names):
            self.api.delete_namespaced_endpoint_slice(gone, NS, _request_timeout=10)
            self._made.discard(gone)
        for node in nodes:
            name = f"{SERVICE}-{node.id}"
            body = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": NS, "labels": {LABEL: SERVICE}},
                "addressType": "IPv4",
                "ports": [
                    {"name": "cluster", "port": node.cluster_port, "protocol": "TCP"},
                    {"name": "admin", "port": node.ports["admin"], "protocol": "TCP"},
                ],
                "endpoints": [
                    {
                        "addresses": ["127.0.0.1"],
                        "conditions": {"ready": ready},
                        "targetRef": {"kind": "Pod", "name": node.id, "namespace": NS},
                    }
                ],
            }
            if name in self._made:
                self.api.patch_namespaced_endpoint_slice(name, NS, body, _request_timeout=10)
            else:
                self.api.create_namespaced_endpoint_slice(NS, body, _request_timeout=10)
                self._made.add(name)

    def set_pods(self, pods: dict[str, bool], *, create: bool = False) -> None:
        """The Service's one EndpointSlice names ``pods`` (name: ready), no other."""
        endpoints = [
            {
                "addresses": [f"10.0.0.{i + 10}"],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": name, "namespace": NS},
            }
            for i, (name, ready) in enumerate(sorted(pods.items()))
        ]
        body = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": SLICE, "namespace": NS, "labels": {LABEL: SERVICE}},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }
        assert self.api is not None
        if create:
            self.api.create_namespaced_endpoint_slice(NS, body, _request_timeout=10)
        else:
            self.api.patch_namespaced_endpoint_slice(SLICE, NS, body, _request_timeout=10)
