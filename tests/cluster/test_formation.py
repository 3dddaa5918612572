"""Forming a cluster: three nodes started at the same moment agree on one cluster, every node
shows all three, ``polymq cluster list`` lists them, and a malformed ``--peers`` is refused
before anything starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from .harness import (
    Cluster,
    Node,
    assert_nobody_lists,
    drain,
    eventually,
    free_ports,
    http_publish_ok,
    outsider,
    run_cli,
    running_cluster,
)

pytestmark = pytest.mark.timeout(180)


def test_three_nodes_started_together_form_one_cluster(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    print(f"\nformed {cluster.formed_after:.1f}s after the three nodes were spawned")
    assert cluster.formed_after is not None and cluster.formed_after <= 30.0
    leaders = cluster.wait_formed(timeout=30)
    ids = {n.id for n in cluster.nodes}
    for node in cluster.nodes:
        info = node.cluster_info()
        assert info is not None, node.id
        assert info["node_id"] == node.id and info["ready"] is True, info
        assert info["state"] == "ready" and info["replicas"] == 3, info
        listed = {m["id"]: m for m in info["nodes"]}
        assert set(listed) == ids, info
        assert all(m["state"] == "ready" for m in listed.values()), info
        assert [m["id"] for m in info["nodes"] if m.get("self")] == [node.id], info
        for other in cluster.nodes:  # every node knows where to find the others' admin API
            assert str(other.ports["admin"]) in listed[other.id]["admin_url"], listed[other.id]
        assert {s["shard"]: s["leader"] for s in info["shards"]} == {
            s: n.id for s, n in leaders.items()
        }
        assert node.readyz() == 200

    def announced_leads_match() -> bool:
        now = cluster.leaders()  # (the leaders may be rebalanced meanwhile)
        for node in cluster.nodes:
            info = node.cluster_info()
            if info is None:
                return False
            for member in info["nodes"]:
                led = {s for s, n in now.items() if n.id == member["id"]}
                if set(member["shards_led"]) != led:
                    return False
        return True

    eventually(announced_leads_match, 10, "every node's shards_led as announced to all")
    print("leaders:", {s: n.id for s, n in leaders.items()})


def test_cluster_list_shows_three_ready_nodes(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    cluster.wait_formed(timeout=30)
    node = cluster.nodes[1]
    done = run_cli("cluster", "list", "--admin", node.admin, "--timeout", "10")
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    lines = done.stdout.splitlines()
    for member in cluster.nodes:
        mine = [line for line in lines if member.id in line]
        assert len(mine) == 1 and "ready" in mine[0], (member.id, done.stdout)

    done = run_cli("cluster", "list", "--admin", node.admin, "--timeout", "10", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    nodes = data["nodes"] if isinstance(data, dict) else data
    assert {m["id"]: m["state"] for m in nodes} == {m.id: "ready" for m in cluster.nodes}


def test_unparsable_peers_exits_2_with_a_message(tmp_path: Path) -> None:
    [cluster_port] = free_ports(1)
    ports_file = tmp_path / "ports.json"
    args = ["run", "--node-id", "bad", "--peers", "a:b,:7", "--cluster-port", str(cluster_port)]
    args += ["--data-dir", str(tmp_path / "data"), "--ports-file", str(ports_file)]
    for flag in ("core", "admin", "http", "stomp", "stomp-ws", "longpoll", "avro", "amqp",
                 "amqp-admin", "amqp-tls"):  # fmt: skip
        args += [f"--{flag}-port", "0"]
    done = run_cli(*args, timeout=30)
    print(done.stderr)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "--peers" in done.stderr or "POLYMQ_PEERS" in done.stderr, done.stderr
    assert "a:b" in done.stderr or ":7" in done.stderr, done.stderr  # names the bad item
    assert "Traceback" not in done.stderr, done.stderr
    assert not ports_file.exists()


def test_metrics_show_each_shard_led_once(shared_cluster: Cluster) -> None:
    """Every node's /metrics: the shards it leads add up to all four, each node sees three
    ready nodes, and the forwarding counter moves when a request crosses nodes."""
    cluster = shared_cluster
    cluster.wait_formed(timeout=30)

    def scrape(node: Node, name: str) -> float:
        text = requests.get(f"{node.admin}/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def led_once() -> bool:
        return sum(scrape(n, "polymq_cluster_shards_led ") for n in cluster.nodes) == 4

    eventually(led_once, 15, "the shards led, summed over the nodes' /metrics, are 4")
    for node in cluster.nodes:
        assert scrape(node, 'polymq_cluster_nodes{state="ready"}') == 3
    leaders = cluster.leaders()
    shard, leader = next(iter(leaders.items()))
    other = next(n for n in cluster.nodes if n is not leader)
    before = scrape(other, "polymq_cluster_forwarded_requests_total")
    q = cluster.queue_in_shard(shard, "metrics")
    r = requests.get(f"http://127.0.0.1:{other.ports['http']}/v1/queue/{q}", timeout=10)
    assert r.status_code in (200, 404), r.text  # served by the leader, through `other`
    assert scrape(other, "polymq_cluster_forwarded_requests_total") > before


def test_a_node_with_another_secret_is_refused_and_says_why(
    shared_cluster: Cluster, tmp_path: Path
) -> None:
    """A fourth node that names the cluster's nodes as its peers but has another cluster
    secret: their NATS routes refuse it, it says why in its log, and no node lists it."""
    cluster = shared_cluster
    cluster.wait_formed(timeout=60)
    env = {"POLYMQ_CLUSTER_SECRET": "not-the-cluster-secret-" + "x" * 20}
    with outsider(cluster, tmp_path, env) as log_path:
        eventually(
            lambda: "is POLYMQ_CLUSTER_SECRET the same on every node?" in log_path.read_text(),
            60,
            "the refused node saying why",
        )
        assert_nobody_lists(cluster, "intruder")
    print(next(line for line in log_path.read_text().splitlines() if "SECRET" in line))


def test_a_node_given_one_seed_learns_the_whole_cluster(tmp_path: Path) -> None:
    """Nodes 1 and 2 list each other; node 3 lists only node 1 (and itself). NATS passes the
    routes on and `system.peers` the nodes: every node lists all three, and node 3 serves a
    shard led by node 2 (a stream that node 3 made with the two replicas it counted grows to
    three)."""
    with running_cluster(tmp_path, seeds={3: [1]}) as cluster:
        n1, _, n3 = cluster.nodes
        leaders = cluster.wait_formed(timeout=60)
        for node in cluster.nodes:
            info = node.cluster_info()
            assert info is not None
            assert {m["id"] for m in info["nodes"]} == {n.id for n in cluster.nodes}, info

        def three(node: Node) -> bool:
            info = node.cluster_info()
            return info is not None and info["replicas"] == 3  # the streams' count

        for node in cluster.nodes:  # (grown to three by their leaders if node 3 made them)
            eventually(lambda node=node: three(node), 30, f"{node.id} counts three replicas")
        done = run_cli("cluster", "list", "--admin", n3.admin, "--timeout", "10")
        assert done.returncode == 0, done.stderr
        assert all(n.id in done.stdout for n in cluster.nodes), done.stdout
        shard = next((s for s, n in leaders.items() if n is not n3), 0)
        queue = cluster.queue_in_shard(shard, "seed")
        http_publish_ok(n3, queue, "through a seeded node")
        got = drain(n1, queue, expect=1, timeout=30)
        assert [m["body"] for m in got] == ["through a seeded node"]


def test_a_reload_through_one_node_reaches_every_node_within_5_s(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    cluster.wait_formed(timeout=30)
    via = cluster.nodes[1]
    url = f"{via.admin}/api/config/reload"
    assert requests.post(url, json={"log_level": "INFO"}, timeout=10).status_code == 401
    secret = {"Authorization": f"Bearer {cluster.secret}"}
    bad = requests.post(url, json={"log_level": "LOUD"}, headers=secret, timeout=10)
    assert bad.status_code == 400 and "log_level" in bad.json()["detail"]
    done = run_cli(
        "cluster", "reload", "--admin", via.admin, "--level", "INFO", "--secret", cluster.secret
    )
    assert done.returncode == 0, done.stderr
    version = int(done.stdout.split()[1])  # "configuration <version> sent to every node"
    sent = time.monotonic()

    def everywhere() -> bool:
        for node in cluster.nodes:
            info = node.cluster_info()
            if info is None or any(m["config_version"] != version for m in info["nodes"]):
                return False
        return True

    eventually(everywhere, 5, "every node announcing the reload's version")
    print(f"\nreload {version} seen applied by every node {time.monotonic() - sent:.2f}s later")
    for node in cluster.nodes:
        assert f"configuration {version} applied: log_level=INFO" in node.log(), node.id
        # every node's frontends heard it from their node (topic system.config)
        for frontend in ("http", "stomp", "amqp"):
            assert f"{frontend}: configuration {version} applied" in node.log(), frontend
    listed = run_cli("cluster", "list", "--admin", cluster.nodes[0].admin, "--timeout", "10")
    assert listed.stdout.count(str(version)) == 3, listed.stdout
    # what the console's Cluster page shows (tests/cluster/test_console.py)
    info = requests.get(f"{cluster.nodes[2].admin}/api/cluster", timeout=10).json()
    assert [n["config_version"] for n in info["nodes"]] == [version] * 3, info
    # the console's reload form asks for the cluster secret here
    form = requests.get(f"{cluster.nodes[2].admin}/reload", timeout=10).text
    assert 'id="secret"' in form and "every node of the cluster" in form, form
    # a limit, set on every node through one
    done = run_cli(
        "cluster", "reload", "--admin", via.admin, "--limit", "max_pull=7",
        "--secret", cluster.secret,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for node in cluster.nodes:

        def refused(node: Node = node) -> bool:
            r = requests.post(
                f"{node.url('http')}/v1/queue/reload-limit/pull", params={"max": 8}, timeout=10
            )
            return r.status_code == 400 and "1..7" in r.text

        eventually(refused, 5, f"node {node.id} refusing to pull 8 after max_pull=7")
    # back to the default: the cluster is shared with other tests
    done = run_cli(
        "cluster", "reload", "--admin", via.admin, "--limit", "max_pull=1000",
        "--secret", cluster.secret,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
