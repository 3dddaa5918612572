"""polymq_core.cluster.node without NATS: which of the ``--peers`` a node takes for itself
(:func:`polymq_core.cluster.natsroutes.others`); whether a stopping node leaves for good."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polymq_core.cluster import node as cluster_mod
from polymq_core.cluster.natsroutes import others
from polymq_core.cluster.node import advertised
from polymq_core.config import CoreSettings


def test_a_node_skips_itself_in_the_peers_by_address_or_by_its_pod_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_mod.socket, "gethostname", lambda: "polymq-core-1")
    peers = (
        ("polymq-core-0.polymq-core-headless", 7422),
        ("polymq-core-1.polymq-core-headless", 7422),  # this pod: its name may not resolve yet
        ("127.0.0.1", 7422),  # this machine
        ("127.0.0.1", 7423),  # another node on this machine
    )
    assert others(peers, 7422) == (
        ("polymq-core-0.polymq-core-headless", 7422),
        ("127.0.0.1", 7423),
    )


@pytest.mark.parametrize(
    ("leave", "on_kubernetes", "scaled_below", "for_good"),
    [
        ("auto", True, True, True),  # kubectl scale below this pod
        ("auto", True, False, False),  # a restart, a rolling update
        ("auto", True, None, False),  # uninstalled, or the API cannot tell
        ("auto", False, True, False),  # not on Kubernetes: a restart
        ("stay", True, True, False),
        ("remove", False, None, True),
    ],
)
async def test_a_stopping_node_leaves_for_good_only_when_told_or_scaled_below(
    monkeypatch: pytest.MonkeyPatch,
    leave: str,
    on_kubernetes: bool,
    scaled_below: bool | None,
    for_good: bool,
) -> None:
    asked: list[tuple[Any, ...]] = []

    def fake_scaled_below(*args: Any) -> bool | None:
        asked.append(args)
        return scaled_below

    monkeypatch.setattr(cluster_mod, "scaled_below", fake_scaled_below)
    settings = CoreSettings(
        node_id="polymq-core-2", peers="127.0.0.1:17422", leave=leave, cluster_secret="s" * 32
    )
    node = cluster_mod.ClusterNode(settings)
    if on_kubernetes:
        fields = {"api": "api", "namespace": "ns", "service": "core", "last_error": None}
        node.k8s = type("Watcher", (), fields)()  # type: ignore[assignment]
    await node.leave()
    assert node.remove_on_leave is for_good
    assert node.describe()["leave"] == ("remove" if for_good else leave)
    if leave == "auto" and on_kubernetes:
        assert asked == [("api", "ns", "polymq-core-2")]


def test_a_bind_all_address_is_announced_as_this_machines_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod listens on 0.0.0.0 (the chart's listenAddress): its peers must be told its IP,
    not 0.0.0.0, where a peer would reach itself."""
    asked: list[tuple[str, int]] = []

    def getaddrinfo(name: str, port: Any, family: int = 0, *rest: Any) -> list[Any]:
        asked.append((name, family))
        ip = "fd00::7" if family == cluster_mod.socket.AF_INET6 else "10.1.2.3"
        return [(family, 1, 6, "", (ip, 0))]

    monkeypatch.setattr(cluster_mod.socket, "gethostname", lambda: "polymq-core-0")
    monkeypatch.setattr(cluster_mod.socket, "getaddrinfo", getaddrinfo)
    assert advertised("0.0.0.0") == advertised("") == "10.1.2.3"
    assert advertised("::") == "[fd00::7]"
    assert {name for name, _ in asked} == {"polymq-core-0"}
    # an address given is announced as it is (an IPv6 one in brackets, to take a :port)
    assert advertised("10.9.8.7") == "10.9.8.7"
    assert advertised("node-a.example") == "node-a.example"
    assert advertised("::1") == "[::1]"


class _AnsweredAsLeaveBegins:
    """A shard's log whose stream info answers, and in the same step the node's stop
    begins: the stop's cancel then meets a ``wait_for`` whose inner call has just finished
    (Python 3.11's ``wait_for`` returns the result and swallows the cancel)."""

    def __init__(self, node: cluster_mod.ClusterNode) -> None:
        self.node = node
        self.leaving: asyncio.Task[None] | None = None
        self.began = asyncio.Event()

    async def info(self) -> tuple[str | None, int]:
        await asyncio.sleep(0)
        if self.leaving is None:
            self.leaving = asyncio.ensure_future(self.node.leave())
            self.began.set()
        return "b", 0


async def test_a_stopping_node_stops_following_even_when_a_cancel_meets_an_answer() -> None:
    settings = CoreSettings(node_id="a", peers="127.0.0.1:17422", cluster_secret="s" * 32)
    node = cluster_mod.ClusterNode(settings)
    shard_log = _AnsweredAsLeaveBegins(node)
    node.logs = [shard_log]  # type: ignore[list-item]
    shard = type("Shard", (), {"leading": False, "index": 0})()
    node.broker = type("Broker", (), {"shards": [shard]})()  # type: ignore[assignment]
    node.state = "ready"
    node._tasks = [asyncio.get_running_loop().create_task(node.leadership.follow(0))]
    await asyncio.wait_for(shard_log.began.wait(), 5.0)
    assert shard_log.leaving is not None
    # before: leave() waited for ever on a follower that swallowed its cancel
    done, _ = await asyncio.wait([shard_log.leaving], timeout=5.0)
    assert done, "leave() still waits for the shard's follower"
    assert node._tasks == []
