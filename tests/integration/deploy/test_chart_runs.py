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

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from polymq.auth import hash_password

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
