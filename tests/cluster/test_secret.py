"""The cluster secret is required: a replicated core (``--peers``) without
``POLYMQ_CLUSTER_SECRET`` refuses to start (exit 2, before it runs a nats-server or binds a
port) with a message naming the variable and the development switch; with
``--insecure-dev-secret`` it starts, and its log says what the public secret lets anyone
do. One node whose ``--peers`` names only itself is cluster enough to be refused; started,
it waits for a second node (a JetStream cluster needs two servers)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from polymq_core.config import DEV_SECRET

from ..procs import PolymqProcess
from .harness import eventually, free_ports

pytestmark = pytest.mark.timeout(120)

# the ports of every listener of `polymq run`, each left to the system
_RUN_PORTS = ("core", "admin", "http", "stomp", "stomp-ws", "longpoll", "avro", "amqp",
              "amqp-admin", "amqp-tls")  # fmt: skip


def _cluster_args() -> list[str]:
    """One node, named by its own --peers."""
    [cluster_port] = free_ports(1)
    return [
        "--node-id", "solo", "--peers", f"127.0.0.1:{cluster_port}",
        "--cluster-port", str(cluster_port),
    ]  # fmt: skip


@pytest.mark.parametrize("command", ["core", "run"])
def test_a_replicated_core_without_the_cluster_secret_refuses_to_start(
    command: str, tmp_path: Path
) -> None:
    ports_file, data = tmp_path / "ports.json", tmp_path / "data"
    args = [command, *_cluster_args(), "--data-dir", str(data)]
    args += ["--ports-file", str(ports_file)]
    for name in _RUN_PORTS if command == "run" else ("core", "admin"):
        args += [f"--{name}-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYMQ_")}
    done = subprocess.run(
        [sys.executable, "-m", "polymq_cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "needs a cluster secret" in done.stderr, done.stderr
    assert "POLYMQ_CLUSTER_SECRET" in done.stderr, done.stderr
    assert "--insecure-dev-secret" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not ports_file.exists()  # no listener was bound
    assert not (data / "nats").exists()  # no nats-server was started


def test_the_development_switch_starts_it_on_the_public_secret_saying_so(tmp_path: Path) -> None:
    # two nodes (a JetStream cluster answers once two servers are in it), the second given
    # the first as its seed
    args = [*_cluster_args(), "--insecure-dev-secret"]
    [second_port] = free_ports(1)
    second_args = [
        "--node-id", "second", "--peers", args[3], "--cluster-port", str(second_port),
        "--insecure-dev-secret",
    ]  # fmt: skip
    env = {"POLYMQ_CLUSTER_SECRET": ""}
    node = PolymqProcess("core", tmp_path / "solo", *args, env=env)
    second = PolymqProcess("core", tmp_path / "second", *second_args, env=env)
    try:
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(p.start, 60) for p in (node, second)]:
                started.result()
        admin = node.url("admin")
        eventually(
            lambda: requests.get(f"{admin}/readyz", timeout=5).status_code == 200,
            60,
            "the node is ready",
        )
        log = node.log()
        assert "INSECURE" in log and "public development secret" in log, log
        assert "administrator" in log and "/api/cluster/snapshot" in log, log
        # what the log warns of: the public secret is the cluster's, on its admin API
        snapshot = requests.get(
            f"{admin}/api/cluster/snapshot/0",
            headers={"Authorization": f"Bearer {DEV_SECRET}"},
            timeout=30,
        )
        assert snapshot.status_code == 200, snapshot.text
        assert node.stop() == 0, node.log()
    finally:
        node.kill()
        second.kill()
