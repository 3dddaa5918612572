"""NATS run apart from the core, as the chart's sidecar runs it: each node's nats-server is a
``polymq nats`` process of its own (configured from the core's settings, logins derived from
the cluster secret) and each ``polymq run`` is given ``--nats``. The three form one cluster
and a persistent message published on one node is consumed on another. A sidecar whose
peers stop answering stops its nats-server until they answer again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .harness import (
    eventually,
    free_ports,
    http_ack,
    http_publish_ok,
    http_pull,
    running_cluster,
    unique,
)

pytestmark = pytest.mark.timeout(240)


def _nats_info(port: int) -> str:
    """The INFO line a NATS client port greets with."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        return s.recv(4096).decode(errors="replace")


def test_three_nodes_with_nats_run_apart_form_one_cluster(tmp_path: Path) -> None:
    with running_cluster(tmp_path, nats_apart=True) as cluster:
        first, _, last = cluster.nodes
        for node in cluster.nodes:
            assert node.nats_proc is not None and node.nats_proc.poll() is None, node.id
            # polymq started no nats-server of its own: its ports file names polymq alone
            assert node.proc is not None and len(node.proc.pids) == 1, node.proc.pids
            info = _nats_info(node.nats_port)
            assert info.startswith("INFO ") and '"auth_required":true' in info, info
            assert f'"server_name":"{node.id}"' in info, info
            assert "Authorization Violation" not in node.nats_log(), node.nats_log()
        queue = unique("apart")
        http_publish_ok(first, queue, "kept apart", persistent=True)
        [message] = http_pull(last, queue, 10, wait=5.0)
        assert message["body"] == "kept apart" and message["persistent"] is True
        assert http_ack(last, [message["receipt"]])["settled"] == 1


class _Peer:
    """A peer's admin port, on an address of its own (127.0.0.2, 127.0.0.3: loopback
    addresses all): nothing listens at first, so a connection is refused (the network
    works; the peer's core is down). :meth:`cut` makes it a port whose SYNs are dropped, as
    a peer's behind a cut link: a listener whose accept queue is full (the kernel drops new
    SYNs then), so a connection neither opens nor is refused; :meth:`heal` closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sockets: list[socket.socket] = []

    def cut(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(0)
        self.sockets = [listener]
        for _ in range(4):  # (more than the queue holds)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((self.host, self.port))
            self.sockets.append(s)

    def heal(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets = []


def _peers_on_one_port() -> tuple[_Peer, _Peer]:
    """Two peers at 127.0.0.2 and 127.0.0.3 whose admin ports are one number (as every pod's
    is), free on both addresses."""
    for _ in range(20):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.2", 0))
            port = int(a.getsockname()[1])
            try:
                b.bind(("127.0.0.3", port))
            except OSError:
                continue
        return _Peer("127.0.0.2", port), _Peer("127.0.0.3", port)
    raise AssertionError("no port free on both 127.0.0.2 and 127.0.0.3")


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_sidecar_cut_off_from_its_peers_stops_its_nats_server_until_they_answer(
    tmp_path: Path,
) -> None:
    """``polymq nats`` (the chart's sidecar) keeps its nats-server out of the elections while
    its node is cut off, as a core does with its own child (polymq_core.cluster.isolation),
    probing what a core probes: its peers' admin ports (``--admin-port`` at the hosts of
    ``--peers``). Peers dropping SYNs from the start stop nothing (it has never reached a
    majority: a cluster starting); once they have answered (refused: the network works), both
    dropping SYNs stop the server (its client port refuses); their answering again starts it
    on the same port; SIGTERM is a clean stop."""
    peers = _peers_on_one_port()
    cluster_port, client_port = free_ports(2)
    argv = [
        sys.executable, "-m", "polymq_cli", "nats", "--node-id", "n1",
        "--peers", ",".join(
            [f"127.0.0.1:{cluster_port}", *(f"{p.host}:{cluster_port + 1}" for p in peers)]
        ),
        "--cluster-port", str(cluster_port), "--client-port", str(client_port),
        "--admin-port", str(peers[0].port), "--data-dir", str(tmp_path),
    ]  # fmt: skip
    log_path = tmp_path / "nats.log"
    for p in peers:
        p.cut()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "POLYMQ_CLUSTER_SECRET": "s" * 40},
        )
    try:
        eventually(lambda: "ready at" in log_path.read_text(), 30, "nats-server up")
        probed = f"admin ports: 127.0.0.2:{peers[0].port}, 127.0.0.3:{peers[0].port}"
        eventually(lambda: probed in log_path.read_text(), 10, "the watch probing both peers")
        time.sleep(3.0)  # (a watch that had counted it cut off would have stopped it in 2 s)
        assert _answers(client_port), log_path.read_text()
        assert "cut off" not in log_path.read_text()
        for p in peers:
            p.heal()
        eventually(
            lambda: "2 of the 2 other nodes answer" in log_path.read_text(), 10, "a majority"
        )
        for p in peers:
            p.cut()
        eventually(
            lambda: "cut off" in log_path.read_text() and not _answers(client_port),
            30,
            "nats-server stopped, cut off",
        )
        assert proc.poll() is None, log_path.read_text()
        for p in peers:
            p.heal()
        eventually(lambda: _answers(client_port), 30, "nats-server back")
        assert _nats_info(client_port).startswith("INFO "), log_path.read_text()
        assert "a majority answers again" in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=40)
        except subprocess.TimeoutExpired:  # (once in CI, not since: its log says why)
            raise AssertionError(f"no exit 40 s after SIGTERM:\n{log_path.read_text()}") from None
        assert code == 0, log_path.read_text()
        assert not _answers(client_port)
    finally:
        for p in peers:
            p.heal()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
