"""The admin API in a cluster: what one node's API does to a queue whose shard another node
leads is forwarded there (publish, peek, purge go over the admin's own wire link, as any
frontend's requests do), and any node lists, and closes, a connection of another node's
frontend (the request crosses the mesh on a system topic)."""

from __future__ import annotations

import time

import pytest
import requests
import stomp

from .harness import Cluster, drain

pytestmark = pytest.mark.timeout(240)


def test_any_node_peeks_publishes_and_purges_where_the_shard_is_led(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    leader = cluster.leader_of(0)
    other = cluster.others(leader)[0]
    name = cluster.queue_in_shard(0, "admin")
    path = f"{other.admin}/api/destinations/queue/{name}"
    for body, priority in (("a", 1), ("b", 9), ("c", 1)):
        r = requests.post(f"{path}/messages", json={"body": body, "priority": priority}, timeout=30)
        assert r.status_code == 201, r.text
    r = requests.get(f"{path}/messages", timeout=30)
    assert r.status_code == 200, r.text
    shown = r.json()["messages"]
    assert [m["body"] for m in shown] == ["b", "a", "c"]
    # nothing was taken: the leader's consumers get every one, in that order
    assert [m["body"] for m in drain(leader, name, 3)] == ["b", "a", "c"]
    requests.post(f"{path}/messages", json={"body": "d"}, timeout=30)
    assert requests.delete(f"{path}/contents", timeout=30).json() == {"purged": 1}
    r = requests.get(f"{path}/messages", timeout=30)
    # empty; or gone already: a queue nobody declared is forgotten once empty (the leader's
    # sweep, every 0.5 s), and the peek then finds no queue
    assert r.status_code in (200, 404), r.text
    if r.status_code == 200:
        assert r.json() == {"messages": []}


def test_any_node_lists_and_closes_another_nodes_connections(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    there, here = cluster.running()[0], cluster.running()[1]
    conn = stomp.Connection([("127.0.0.1", there.ports["stomp"])])
    conn.connect("far-away", "pw", wait=True)
    try:
        rows = requests.get(f"{here.admin}/api/connections", timeout=30).json()["connections"]
        mine = [c for c in rows if c.get("user") == "far-away"]
        assert len(mine) == 1, rows
        assert mine[0]["protocol"] == "stomp" and mine[0]["node"] == there.id
        r = requests.delete(f"{here.admin}/api/connections/{mine[0]['id']}", timeout=30)
        assert r.status_code == 204, r.text
        deadline = time.monotonic() + 10
        while conn.is_connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not conn.is_connected()
    finally:
        if conn.is_connected():
            conn.disconnect()
