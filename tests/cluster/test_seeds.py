"""A cluster grows and shrinks from any seed (issue 28, point 4).

- Nodes given one seed form one cluster: node 1 is given only itself (``--peers`` naming
  its own cluster address), nodes 2 and 3 only node 1. The seed listens on its cluster port
  all the same (routed to itself), and NATS' route gossip meshes the others. A JetStream
  cluster answers once two servers are in it: the seed alone waits, saying so, until node 2
  joins; a message stored then is there once node 3 has joined, every shard's stream then has three
  replicas, and a message published on one node is consumed on another.
- Five nodes scaled to three for good, one after the other (``POST /api/cluster/leave``,
  then SIGTERM) leave a meta group of three, all up (not five with two down: no loss
  tolerated); the nodes coming back with the same names and fresh stores serve again, and
  the meta group stays healthy (nats-server lets a server taken out join its meta group
  again after five minutes: ``peerRemoveTimeout``).
- One node's store (``polymq run`` without ``--peers``: the chart's ``core.replicaCount=1``)
  is not taken over by a replicated core started on it (1 -> 3 on pod 0's volume): it
  refuses to start (exit 2) and says what to do, rather than serving what no log holds.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nats
import pytest
import requests

from polymq_core.cluster.natsd import SYSTEM_USER, derived_password

from ..procs import PolymqProcess
from .harness import (
    HTTP_TIMEOUT,
    Cluster,
    Node,
    drain,
    eventually,
    free_ports,
    http_publish_ok,
    running_cluster,
)

pytestmark = pytest.mark.timeout(300)


def _nats_url(node: Node) -> str:
    """The client URL of ``node``'s nats-server, from the ports file it wrote."""
    found = sorted((node.data_dir / "nats-run").glob("*.ports"), key=lambda p: p.stat().st_mtime)
    assert found, f"{node.id}: no nats-server ports file"
    urls: list[str] = json.loads(found[-1].read_text())["nats"]
    return urls[0]


def meta_group(cluster: Cluster, node: Node) -> dict[str, Any]:
    """JetStream's meta group as ``node``'s nats-server sees it (``jsz``, asked as the
    system account's user, whose password the nodes derive from the cluster secret)."""

    async def ask() -> dict[str, Any]:
        nc = await nats.connect(
            _nats_url(node),
            user=SYSTEM_USER,
            password=derived_password(cluster.secret, "system"),
            allow_reconnect=False,
        )
        try:
            subject = "$SYS.REQ.SERVER.PING.JSZ"
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(subject, b"{}", reply=inbox)
            while True:  # the answer of node's own server
                msg = await sub.next_msg(timeout=5.0)
                answer = json.loads(msg.data)
                if answer["server"]["name"] == node.id:
                    meta: dict[str, Any] = answer["data"]["meta_cluster"]
                    return meta
        finally:
            await nc.close()

    return asyncio.run(ask())


def _healthy(meta: dict[str, Any], size: int) -> bool:
    """A meta group of ``size`` servers with a leader and none of them offline."""
    others = meta.get("replicas") or []
    return (
        meta.get("cluster_size") == size
        and bool(meta.get("leader"))
        and not any(r.get("offline") for r in others)
        and len(others) == size - 1
    )


def test_nodes_given_one_seed_form_one_cluster_and_grow_to_three_replicas(
    tmp_path: Path,
) -> None:
    # node 1 is given only itself; nodes 2 and 3 only node 1
    cluster = Cluster(tmp_path, 3, seeds={1: [1], 2: [1], 3: [1]})
    seed, second, third = cluster.nodes
    try:
        cluster.started_at = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            # the seed alone waits (for as long as it takes) for a second node to join it
            starting = pool.submit(cluster.start_nodes, [seed])
            eventually(
                lambda: "waiting for a second node" in seed.log(), 60, "the seed waits, saying so"
            )
            assert not starting.done()  # it serves no client alone: a JetStream cluster
            cluster.start_nodes([second])  # needs two servers
            starting.result()
        cluster.wait_formed(timeout=60, nodes=[seed, second])
        formed = time.monotonic() - cluster.started_at
        q = "seeded"
        http_publish_ok(second, q, "stored-by-two")

        began = time.monotonic()
        cluster.start_nodes([third])
        cluster.wait_formed(timeout=60)
        everyone = sorted(n.id for n in cluster.nodes)

        def replicas() -> bool:
            info = third.cluster_info()
            return info is not None and all(s["peers"] == everyone for s in info["shards"])

        eventually(replicas, 60, f"every shard's stream has {everyone} as its replicas")
        grown = time.monotonic() - began
        print(f"\ntwo nodes formed {formed:.1f}s after spawn; three replicas {grown:.1f}s after")

        got = drain(third, q, expect=1)
        assert [m["body"] for m in got] == ["stored-by-two"]
        http_publish_ok(third, "seeded-after", "through-the-third")
        got = drain(seed, "seeded-after", expect=1)
        assert [m["body"] for m in got] == ["through-the-third"]
    finally:
        problems = cluster.stop_all()
    assert not problems, "; ".join(problems)


def _leave_for_good(cluster: Cluster, node: Node) -> None:
    """``POST /api/cluster/leave`` (a preStop hook's), then SIGTERM."""
    r = requests.post(
        f"{node.admin}/api/cluster/leave",
        headers={"Authorization": f"Bearer {cluster.secret}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    cluster.stop(node)


def test_five_scaled_to_three_and_back_keep_a_healthy_meta_group(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 5) as cluster:
        began = time.monotonic()
        stay, leaving = cluster.nodes[:3], cluster.nodes[3:]
        for node in leaving:  # one after the other, as a StatefulSet scales down
            _leave_for_good(cluster, node)
            cluster.wait_formed(timeout=60, nodes=cluster.running())
        # the meta group is the three left, all up (not five with two down: no loss
        # tolerated), and the streams have them as their replicas
        eventually(
            lambda: _healthy(meta_group(cluster, stay[0]), 3),
            30,
            "a meta group of the three nodes left, all up",
        )
        expected = sorted(n.id for n in stay)

        def replicas() -> bool:
            info = stay[0].cluster_info()
            return info is not None and all(s["peers"] == expected for s in info["shards"])

        eventually(replicas, 30, f"every shard's stream has {expected} as its replicas")
        shrunk = time.monotonic() - began
        assert "taken out of JetStream's meta group" in leaving[-1].log()

        # the same names come back with fresh stores (new pods of the StatefulSet)
        for node in leaving:
            cluster.restart(node, wipe=True)
        cluster.wait_formed(timeout=60)
        for node in leaving:
            queue = f"back-{node.index}"
            http_publish_ok(node, queue, f"through {node.id}")
            got = drain(stay[0], queue, expect=1)
            assert [m["body"] for m in got] == [f"through {node.id}"]
        meta = meta_group(cluster, stay[0])
        assert _healthy(meta, meta["cluster_size"]) and meta["cluster_size"] in (3, 4, 5), meta
        print(
            f"\n5 -> 3 in {shrunk:.1f}s: meta group of 3, all up; 3 -> 5: meta group"
            f" {meta['cluster_size']}, all up; {time.monotonic() - began:.1f}s in all"
        )


def test_a_single_nodes_store_is_not_taken_over_by_a_replicated_core(tmp_path: Path) -> None:
    with PolymqProcess("run", tmp_path) as single:
        r = requests.post(
            f"{single.url()}/v1/queue/kept/messages",
            json={"body": "on one node", "persistent": True},
            timeout=HTTP_TIMEOUT,
        )
        assert r.status_code == 200, r.text
        assert single.stop() == 0, single.log()
    [port] = free_ports(1)
    args = ["--node-id", "a", "--peers", f"127.0.0.1:{port}", "--cluster-port", str(port)]
    done = subprocess.run(
        [sys.executable, "-m", "polymq_cli", "run", *args, "--data-dir", str(single.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "POLYMQ_CLUSTER_SECRET": "c" * 32},
    )
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "holds the store of a single node" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not (single.data_dir / "nats").exists()  # no nats-server was started
