"""Cluster TLS (docs/cluster.md, "Security"): three nodes with certificates of one CA form a
cluster whose NATS routes are TLS, forward a publish to the shard's leader over the TLS wire
listener for peers, and refuse a node whose certificate another CA signed: its routes, the
peers' wire listener and their admin listener all turn it away (their logs say why). The
plain admin port serves no snapshot then, even to the cluster secret."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from polymq_core.cluster.natsd import TLS_REFUSED

from ..pki import HAVE_OPENSSL, Authority
from .harness import (
    Cluster,
    Node,
    assert_nobody_lists,
    drain,
    eventually,
    http_publish_ok,
    outsider,
    running_cluster,
)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not HAVE_OPENSSL, reason="needs openssl to make certificates"),
]


def tls_env(cert: Path, key: Path, ca: Path) -> dict[str, str]:
    return {
        "POLYMQ_CLUSTER_TLS_CERT": str(cert),
        "POLYMQ_CLUSTER_TLS_KEY": str(key),
        "POLYMQ_CLUSTER_TLS_CA": str(ca),
        "POLYMQ_PEER_WIRE_PORT": "0",  # announced on system.peers
        "POLYMQ_PEER_ADMIN_PORT": "0",
    }


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, ca: Authority) -> Iterator[Cluster]:
    cert, key = ca.issue("node")  # one certificate for 127.0.0.1 serves the three nodes
    env = tls_env(cert, key, ca.cert)
    with running_cluster(tmp_path_factory.mktemp("tls-cluster"), env=env) as cluster:
        yield cluster


def told_ports(node: Node) -> dict[str, int]:
    ports: dict[str, int] = json.loads((node.workdir / "run-ports.json").read_text())
    return ports


def route_info(port: int, tls: ssl.SSLContext) -> dict[str, object]:
    """What a NATS route listener says to a new connection: nothing in the clear, then (it
    expects the TLS handshake first) its INFO over TLS."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.settimeout(1.0)
        with pytest.raises(TimeoutError):
            raw.recv(1)  # no INFO in the clear
        raw.settimeout(5)
        with tls.wrap_socket(raw) as sock:
            line = sock.makefile("rb").readline()
    assert line.startswith(b"INFO "), line
    info: dict[str, object] = json.loads(line[5:])
    return info


def cluster_client(ca: Authority, cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS client presenting ``cert`` that trusts ``ca``'s certificates (any host)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(ca.cert)
    ctx.load_cert_chain(cert, key)
    return ctx


def answer(port: int, tls: ssl.SSLContext) -> bytes:
    """What a wire listener says over ``tls`` to a client that sends a frame's length: a
    refused certificate ends the connection (an alert, or nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with tls.wrap_socket(raw) as sock:
                sock.sendall(b"\0\0\0\x10")
                return sock.recv(1)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            return b""


def test_routes_are_tls_and_a_publish_is_forwarded_to_the_leader_over_tls(
    cluster: Cluster, ca: Authority
) -> None:
    leaders = cluster.wait_formed(timeout=60)
    tls = cluster_client(ca, *ca.issue("probe"))
    for node in cluster.nodes:
        info = route_info(node.cluster_port, tls)
        assert info["tls_required"] is True and info["tls_verify"] is True, info
    leader = leaders[0]
    via, consumer = cluster.others(leader)
    queue = cluster.queue_in_shard(0, "tls")
    http_publish_ok(via, queue, "over tls")
    got = drain(consumer, queue, expect=1, timeout=30)
    assert [m["body"] for m in got] == ["over tls"]
    # both went through the leader's wire listener for peers (TLS), not its plain one
    peer_wire = told_ports(leader)["peer_wire"]
    polymq = psutil.Process(leader.pids[0])
    linked = [
        c
        for c in polymq.net_connections("tcp")
        if c.laddr.port == peer_wire and c.status == psutil.CONN_ESTABLISHED
    ]
    assert len(linked) >= 2, polymq.net_connections("tcp")


def test_a_node_with_a_certificate_of_another_ca_is_refused(
    cluster: Cluster, ca: Authority, tmp_path: Path
) -> None:
    cluster.wait_formed(timeout=60)
    rogue_cert, rogue_key = Authority.make(tmp_path / "rogue", "rogue").issue("node")
    # the peers' wire and admin listeners turn its certificate away
    client = cluster_client(ca, rogue_cert, rogue_key)
    ports = told_ports(cluster.nodes[0])
    assert answer(ports["peer_wire"], client) == b"", "the wire for peers answered a stranger"
    url = f"https://127.0.0.1:{ports['peer_admin']}/api/cluster/snapshot/0"
    secret = {"Authorization": f"Bearer {cluster.secret}"}
    node_cert = tuple(str(p) for p in ca.issue("probe"))
    r = requests.get(url, cert=node_cert, verify=str(ca.cert), headers=secret, timeout=10)
    assert r.status_code == 200 and r.headers["X-Polymq-Applied"].isdigit(), r.text
    plain = f"{cluster.nodes[0].admin}/api/cluster/snapshot/0"  # even with the secret
    assert requests.get(plain, headers=secret, timeout=10).status_code == 403
    with pytest.raises(requests.exceptions.ConnectionError):  # its TLS handshake fails
        requests.get(url, cert=(str(rogue_cert), str(rogue_key)), verify=str(ca.cert),
                     headers=secret, timeout=10)  # fmt: skip

    # its NATS routes are refused: every node's nats-server says why, and no node lists it
    def refusals(node: Node) -> int:  # the rogue (a Go client) offers no certificate at all
        text = (node.data_dir / "nats-server.log").read_text(errors="replace")
        return text.count(f"{TLS_REFUSED}: tls: client didn't provide a certificate")

    before = {node.id: refusals(node) for node in cluster.nodes}
    env = {**cluster.env, **tls_env(rogue_cert, rogue_key, ca.cert)}
    with outsider(cluster, tmp_path, env, node_id="rogue") as log_path:
        eventually(
            lambda: all(refusals(node) > before[node.id] for node in cluster.nodes),
            30,
            "every node's NATS refusing the rogue's certificate",
        )
        eventually(
            lambda: "waiting for the cluster's JetStream" in log_path.read_text(),
            30,
            "the rogue waiting for a JetStream it cannot join",
        )
        assert_nobody_lists(cluster, "rogue")
