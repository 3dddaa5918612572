"""The rendered containers, run: each pod's command, args and environment start the real
service on this machine (pods.py says what is changed and why), every probe the chart declares
answers 200 on the port it names, the ports the chart declares are exactly the ones the process
binds, and every target Prometheus is told to scrape serves polymq metrics.

The helm test Pod's `polymq check` then runs against those processes (its Service addresses
pointed at them, its login from the Secret): one message through every frontend and back.
A replicated core is not run here (its nodes need each other): the single-node ci files are.

With logins and TLS (ci/full-tls-ingress-values.yaml) the frontends only become ready when the
login the chart wires from the Secret is accepted by the core, and the probes and /metrics of
every frontend whose web listener has TLS (http, longpoll, avro and STOMP's WebSocket one)
answer only over HTTPS, with the certificate mounted from its Secret: plain HTTP on that port
gets no answer."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from polymq import Client, Message
from polymq.types import Outcome
from polymq_server.auth.provider import hash_password

from .chart import (
    CHART,
    NAMESPACE,
    Rendered,
    ci_values,
    component_of,
    container,
    container_port,
    probes,
    render,
    scrape_targets,
    service_target,
    sidecars,
)
from .pods import LocalPod, Secrets

FRONTEND_PASSWORD = "frontend-secret"
PROBE_TIMEOUT = 20.0  # seconds a probe may take to pass (a frontend connects to the core)


def make_secrets(tmp: Path) -> Secrets:
    """Test data for every Secret a ci file names."""
    users = {
        "users": {
            "frontend": {
                "password_hash": hash_password(FRONTEND_PASSWORD),
                "grants": [{"pattern": "*", "permissions": ["read", "write", "configure"]}],
                "tags": ["administrator"],  # the core's system.* topics (reserved names)
            }
        }
    }
    secrets: Secrets = {
        "polymq-users": {"users.json": json.dumps(users)},
        "polymq-frontend-login": {"user": "frontend", "password": FRONTEND_PASSWORD},
    }
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    for name in ("polymq-tls", "polymq-stomp-tls", "polymq-amqp-tls"):
        secrets[name] = {"tls.crt": cert.read_text(), "tls.key": key.read_text()}
    return secrets


def run_helm_test(
    rendered: Rendered, resolve: Callable[[str, int], int], secrets: Secrets
) -> subprocess.CompletedProcess[str]:
    """The helm test Pod's command, each ``<service>.<namespace>.svc:<port>`` in its
    arguments pointed at the local process behind that Service port."""
    [pod] = rendered.of_kind("Pod")
    [c] = pod["spec"]["containers"]
    assert c["command"] == ["polymq"]
    address = re.compile(rf"(?:([a-z+]+)://)?([a-z0-9-]+)\.{NAMESPACE}\.svc:(\d+)(/?)")
    args = []
    for arg in c["args"]:
        found = address.fullmatch(arg)
        if found:
            scheme, service, port, slash = found.groups()
            local = f"127.0.0.1:{resolve(service, int(port))}"
            arg = f"{scheme}://{local}{slash}" if scheme else local
        args.append(arg)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYMQ_")}
    for var in c.get("env", []):
        ref = var["valueFrom"]["secretKeyRef"]
        env[var["name"]] = secrets[ref["name"]][ref["key"]]
    return subprocess.run(
        [sys.executable, "-m", "polymq_cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for the TLS secret")
@pytest.mark.parametrize(
    "ci_file",
    ["single-node-values.yaml", "full-tls-ingress-values.yaml", "http-stomp-only-values.yaml"],
)
def test_rendered_pods_start_and_answer_their_probes(ci_file: str, tmp_path: Path) -> None:
    rendered = render(ci_values(CHART / "ci" / ci_file))
    secrets = make_secrets(tmp_path)
    cert = str(tmp_path / "tls.crt")
    pods: dict[str, LocalPod] = {}
    tls_probed: set[str] = set()

    def resolve(service: str, port: int) -> int:
        workload, target = service_target(rendered, service, port)
        return pods[component_of(workload)].local(target)

    # the core first (frontends find it through its Service), then every frontend at once
    order = sorted(rendered.workloads(), key=lambda w: component_of(w) != "core")
    try:
        for workload in order:
            pod = LocalPod(rendered, workload, tmp_path / "pods", secrets, resolve)
            pods[component_of(workload)] = pod.start()
            if component_of(workload) == "core":
                pod.wait_bound()
        assert set(pods) == rendered.components()

        for name, pod in pods.items():
            bound = pod.wait_bound()
            declared = {p["containerPort"] for p in pod.container["ports"]}
            # the process bound exactly the listeners the chart set a port for, and those
            # ports are exactly the ones the container declares
            assert set(bound) == set(pod.listeners), (name, bound, pod.listeners)
            assert declared == set(pod.listeners.values()), (name, declared, pod.listeners)

        for name, pod in pods.items():
            c = pod.container
            seen = set()
            for kind, probe in probes(c):
                get = probe["httpGet"]
                port = container_port(c, get["port"])
                answer = pod.get(get["scheme"], port, get["path"], cert, PROBE_TIMEOUT)
                assert answer.status_code == 200, (name, kind, answer.text, pod.log())
                seen.add(kind)
                if get["scheme"] == "HTTPS":  # the TLS is real: no plain HTTP on that port
                    with pytest.raises(requests.ConnectionError):
                        requests.get(f"http://127.0.0.1:{pod.local(port)}{get['path']}", timeout=5)
                    tls_probed.add(name)
            assert {"livenessProbe", "readinessProbe"} <= seen, (name, seen)
        # with TLS on, every frontend but AMQP (its admin port stays plain) is probed over it
        wanted = {"http", "longpoll", "avro", "stomp"} if "full-tls" in ci_file else set()
        assert tls_probed == wanted & set(pods), tls_probed

        targets = scrape_targets(rendered)
        assert sorted(component_of(w) for w, *_ in targets) == sorted(pods), targets
        for workload, port, path, scheme in targets:
            pod = pods[component_of(workload)]
            answer = pod.get(scheme, port, path, cert, PROBE_TIMEOUT)
            assert answer.status_code == 200, (pod.name, answer.text)
            assert "# TYPE polymq_" in answer.text, (pod.name, answer.text[:500])

        # helm test: one message through every frontend's Service and back
        check = run_helm_test(rendered, resolve, secrets)
        assert check.returncode == 0, check.stdout + check.stderr
        lines = {line.split()[0]: line for line in check.stdout.splitlines() if line.strip()}
        assert set(lines) == set(pods) - {"core"}, check.stdout
        assert all(" ok (" in line for line in lines.values()), check.stdout
    finally:
        codes = {name: pod.stop() for name, pod in pods.items()}
    # SIGTERM, as the kubelet sends it, stops every service cleanly
    assert all(code == 0 for code in codes.values()), {
        n: (c, pods[n].log()[-2000:]) for n, c in codes.items() if c
    }


def test_the_core_keeps_its_store_on_the_mounted_volume(tmp_path: Path) -> None:
    """The data dir the chart passes is the PVC's mount: the store's files land there."""
    rendered = render({"core": {"replicaCount": 1}})
    core = rendered.workload("core")
    c = container(core)
    data_dir = c["args"][c["args"].index("--data-dir") + 1]
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == data_dir]
    assert mount["name"] in {t["metadata"]["name"] for t in core["spec"]["volumeClaimTemplates"]}

    pod = LocalPod(rendered, core, tmp_path, {}, lambda host, port: 0)
    try:
        pod.start().wait_bound()
        answer = pod.get("HTTP", container_port(c, "admin"), "/readyz", False, PROBE_TIMEOUT)
        assert answer.status_code == 200, pod.log()
    finally:
        assert pod.stop() == 0, pod.log()
    stored = list(pod.mounts[data_dir].iterdir())
    assert any(p.name.startswith("shard-") for p in stored), stored


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_listening(port: int, pod: LocalPod, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert pod.proc is not None and pod.proc.poll() is None, pod.log()
        assert time.monotonic() < deadline, f"{pod.name}: port {port} not up\n{pod.log()}"
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_the_three_core_pods_with_their_nats_sidecars_form_one_cluster(tmp_path: Path) -> None:
    """The chart's replicated core as rendered: each pod's NATS sidecar (`polymq nats`) and
    core, with the pod's volume, node name and the chart's generated cluster secret; only the
    pods' DNS names and ports are local ones (three pods share this machine) and there is no
    Kubernetes API to watch. The three form one cluster, and a persistent message published
    on pod 0 is consumed on pod 2."""
    rendered = render(
        {
            "core": {"replicaCount": 3},
            "auth": {"allowAnonymousCluster": True},
            **{f: {"enabled": False} for f in ("http", "longpoll", "stomp", "avro", "amqp")},
        }
    )
    sts = rendered.workload("core")
    [secret] = rendered.of_kind("Secret")
    secrets: Secrets = {
        secret["metadata"]["name"]: {
            k: base64.b64decode(v).decode() for k, v in secret["data"].items()
        }
    }
    c = container(sts)
    assert "--nats" in c["args"] and "nats" in sidecars(sts)
    cluster_ports, client_ports = _free_ports(3), _free_ports(3)
    peers = ",".join(f"127.0.0.1:{p}" for p in cluster_ports)
    pods: list[LocalPod] = []
    try:
        for i in range(3):
            fixed = {
                "--peers": peers,
                "--cluster-port": str(cluster_ports[i]),
                "--client-port": str(client_ports[i]),
                "--nats": f"nats://127.0.0.1:{client_ports[i]}",
            }
            for name in ("nats", None):  # the sidecar first, as the kubelet starts it
                pod = LocalPod(
                    rendered, sts, tmp_path, secrets, lambda h, p: 0,
                    ordinal=i, container_name=name, fixed=fixed,
                )  # fmt: skip
                # no Kubernetes API here (the EndpointSlice watch, the core's and the
                # sidecar's, is tested against kmock: tests/cluster/test_routes.py)
                assert pod.env.pop("POLYMQ_K8S_SERVICE", None) == sts["spec"]["serviceName"]
                pods.append(pod.start())
                if name == "nats":  # its startupProbe: the core starts once the port answers
                    _wait_listening(client_ports[i], pod)
        cores = [p for p in pods if p.container["name"] == "core"]
        for core in cores:
            core.wait_bound(120)  # a node listens once the cluster's JetStream answers
        admin = container_port(c, "admin")
        for core in cores:
            ready = core.get("HTTP", admin, "/readyz", False, 60)
            assert ready.status_code == 200, core.log()[-3000:]
        names = {f"{sts['metadata']['name']}-{i}" for i in range(3)}
        deadline = time.monotonic() + 30  # the nodes announce themselves on system.peers
        while True:
            info = cores[0].get("HTTP", admin, "/api/cluster", False, 10).json()
            listed = {n["id"] for n in info["nodes"]}
            if listed == names or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert listed == names, info
        assert info["replicas"] == 3
        wire = container_port(c, "wire")

        async def through() -> bytes:
            first = await Client.connect("127.0.0.1", cores[0].local(wire))
            last = await Client.connect("127.0.0.1", cores[2].local(wire))
            try:
                await first.publish("queue/chart-sidecar", Message(b"kept", persistent=True))
                [lease] = await last.pull("queue/chart-sidecar", 1, wait=10)
                await last.settle([lease.receipt], Outcome.ACK)
                return lease.message.body
            finally:
                await first.close()
                await last.close()

        assert asyncio.run(through()) == b"kept"
    finally:
        # the cores first, their sidecars after them, as the kubelet stops a pod
        codes = {f"{p.name}/{p.container['name']}": p.stop(60) for p in reversed(pods)}
    assert all(code == 0 for code in codes.values()), codes
