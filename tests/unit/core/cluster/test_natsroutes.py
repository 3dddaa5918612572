"""polymq_core.cluster.natsroutes without a server: a node's NATS routes are its static peers and
the
cluster addresses of its Service's endpoints (never itself), a running server is told only
when that set changes, static peers stay, and a node without static peers waits for the
endpoints to name another one (saying why when they do not)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from polymq_core.cluster.endpoints import EndpointsError, Member
from polymq_core.cluster.natsd import NatsConfig, NatsServer
from polymq_core.cluster.natsroutes import Routes, endpoint_routes, route_set
from polymq_core.cluster.node import ClusterNode
from polymq_core.config import CoreSettings

PORT = 7422  # this node's cluster port


def pods(*members: Member) -> dict[str, Member]:
    return {m.name: m for m in members}


class Recorder(NatsServer):
    """A server that is not started: records what it is told to route to."""

    def __init__(self, routes: tuple[tuple[str, int], ...]) -> None:
        super().__init__(NatsConfig("core-0", Path("/nonexistent"), PORT, routes=routes))
        self.told: list[tuple[tuple[str, int], ...]] = []

    def reroute(self, routes: tuple[tuple[str, int], ...]) -> bool:
        changed = super().reroute(routes)
        if changed:
            self.told.append(routes)
        return changed


class Watcher:
    """What :meth:`Routes.wait` reads of an EndpointWatcher."""

    last_error: str | None = None

    def __str__(self) -> str:
        return "polymq/core-headless"


def test_endpoints_route_to_their_slices_cluster_port_else_this_nodes_and_never_to_itself() -> None:
    members = pods(
        Member("core-0", "10.0.0.10", True, 7422),  # this node, by its pod's name
        Member("core-1", "10.0.0.11", False, 7422),  # not ready: a route all the same
        Member("core-2", "10.0.0.12", True),  # its slice names no cluster port: ours
        Member("other", "127.0.0.1", True, PORT),  # this machine, our port: ourselves
        Member("beside", "127.0.0.1", True, 17422),  # another node on this machine
    )
    assert endpoint_routes(members, me="core-0", cluster_port=PORT) == (
        ("127.0.0.1", 17422),
        ("10.0.0.11", 7422),
        ("10.0.0.12", 7422),
    )


def test_the_route_set_is_the_static_peers_then_what_the_endpoints_add() -> None:
    static = (("core-1.core-headless", 7422), ("10.0.0.12", 7422))
    members = pods(
        Member("core-0", "10.0.0.10", True),
        Member("core-2", "10.0.0.12", True),  # named by --peers already
        Member("core-3", "10.0.0.13", True),  # missing from --peers
    )
    assert route_set(static, members, me="core-0", cluster_port=PORT) == (
        *static,
        ("10.0.0.13", 7422),
    )
    assert route_set(static, {}, me="core-0", cluster_port=PORT) == static
    assert route_set((), {}, me="core-0", cluster_port=PORT) == ()


def test_a_running_server_is_rerouted_only_when_the_set_changes_and_keeps_static_peers() -> None:
    static = (("10.0.0.11", 7422),)
    routes = Routes(static, me="core-0", cluster_port=PORT)
    server = Recorder(static)
    routes.attach(server)
    assert server.told == []  # started with these

    three = pods(
        Member("core-0", "10.0.0.10", True),
        Member("core-1", "10.0.0.11", True),
        Member("core-2", "10.0.0.12", False),
    )
    routes.update(three)
    assert server.told == [(("10.0.0.11", 7422), ("10.0.0.12", 7422))]
    assert server.config.routes == server.told[-1]

    routes.update({**three, "core-2": Member("core-2", "10.0.0.12", True)})  # ready now
    assert len(server.told) == 1, "a change of readiness alone reloaded nats-server"

    routes.update(pods(Member("core-0", "10.0.0.10", True)))  # core-1 and core-2 gone
    assert server.told[-1] == static, "the static peer was removed with the endpoints"
    assert routes.current == static


def test_endpoints_naming_nobody_else_leave_the_routes_as_they_were(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes = Routes((), me="core-0", cluster_port=PORT)
    routes.update(pods(Member("core-0", "10.0.0.10", True)))
    assert routes.current == ()
    two = pods(Member("core-0", "10.0.0.10", True), Member("core-1", "10.0.0.11", True))
    routes.update(two)
    server = Recorder(routes.current)
    routes.attach(server)
    with caplog.at_level(logging.WARNING, "polymq_core.cluster.natsroutes"):
        routes.update(pods(Member("core-0", "10.0.0.10", True)))
    assert routes.current == (("10.0.0.11", 7422),)
    assert server.told == []
    assert "name no other node" in caplog.text


def test_a_change_while_the_server_started_is_applied_when_it_is_attached() -> None:
    routes = Routes((), me="core-0", cluster_port=PORT)
    routes.update(pods(Member("core-1", "10.0.0.11", True)))
    server = Recorder(routes.current)  # started with one route
    routes.update(pods(Member("core-1", "10.0.0.11", True), Member("core-2", "10.0.0.12", True)))
    routes.attach(server)
    assert server.told == [(("10.0.0.11", 7422), ("10.0.0.12", 7422))]


@pytest.mark.parametrize(
    ("static", "endpoints", "nodes"),
    [
        (0, None, 1),  # make run: one node
        (2, None, 3),  # --peers names three nodes
        (0, 3, 3),  # the endpoints name three pods
        (1, 3, 3),  # --peers misses one
        (2, 2, 3),  # the same nodes by DNS name and by address: not four
    ],
)
def test_the_node_count_is_the_larger_of_the_two_sources(
    static: int, endpoints: int | None, nodes: int
) -> None:
    peers = tuple((f"core-{i}.core-headless", 7422) for i in range(1, static + 1))
    routes = Routes(peers, me="core-0", cluster_port=PORT)
    if endpoints is not None:
        routes.update(pods(*(Member(f"core-{i}", f"10.0.0.{i}", True) for i in range(endpoints))))
    assert routes.nodes == nodes


def test_the_admin_addresses_probed_are_one_per_other_node() -> None:
    """What ``polymq nats``'s partition watch probes: static peers on the given admin port
    until the endpoints name the same node (by pod name or route), then the endpoint's
    address and the admin port its slice names; never this node; port 0: endpoints' only."""
    static = (("core-1.core-headless", 7422), ("10.0.0.12", 7422), ("10.0.0.14", 7422))
    routes = Routes(static, me="core-0", cluster_port=PORT)
    assert routes.admin_addresses(7401) == (
        ("core-1.core-headless", 7401),
        ("10.0.0.12", 7401),
        ("10.0.0.14", 7401),
    )
    routes.update(
        pods(
            Member("core-0", "10.0.0.10", True, 7422, 7401),  # this node
            Member("core-1", "10.0.0.11", False, 7422, 17401),  # the DNS name's pod
            Member("core-2", "10.0.0.12", True, 7422),  # the same route; no admin port named
            Member("core-3", "10.0.0.13", True, 7422, 7401),  # missing from --peers
            Member("other", "127.0.0.1", True, PORT, 7401),  # this machine, our port
        )
    )
    assert routes.admin_addresses(7401) == (
        ("10.0.0.11", 17401),
        ("10.0.0.12", 7401),
        ("10.0.0.13", 7401),
        ("10.0.0.14", 7401),  # a static peer no endpoint names
    )
    assert routes.admin_addresses(0) == (("10.0.0.11", 17401), ("10.0.0.13", 7401))


async def test_waiting_for_a_route_ends_at_once_with_static_peers() -> None:
    static = (("10.0.0.11", 7422),)
    assert await Routes(static, me="core-0", cluster_port=PORT).wait(Watcher(), 0.01) == static  # type: ignore[arg-type]


async def test_waiting_for_a_route_ends_when_the_endpoints_name_another_pod() -> None:
    routes = Routes((), me="core-0", cluster_port=PORT)
    routes.update(pods(Member("core-0", "10.0.0.10", True)))
    routes.update(pods(Member("core-0", "10.0.0.10", True), Member("core-1", "10.0.0.11", False)))
    assert await routes.wait(Watcher(), 1.0) == (("10.0.0.11", 7422),)  # type: ignore[arg-type]


async def test_no_route_in_time_says_whether_the_api_answered() -> None:
    routes = Routes((), me="core-0", cluster_port=PORT)
    watcher = Watcher()
    watcher.last_error = "403 Forbidden"
    with pytest.raises(EndpointsError, match=r"listed yet \(last error: 403 Forbidden\)") as err:
        await routes.wait(watcher, 0.05)  # type: ignore[arg-type]
    assert "service account" in str(err.value)

    routes.update(pods(Member("core-0", "10.0.0.10", True)))
    with pytest.raises(EndpointsError, match=r"name no other node \(pods: core-0\)") as err:
        await routes.wait(watcher, 0.05)  # type: ignore[arg-type]
    assert "POLYMQ_K8S_SERVICE" in str(err.value)


def test_the_endpoints_feed_a_cluster_nodes_routes() -> None:
    settings = CoreSettings(node_id="core-0", k8s_service="core-headless", cluster_secret="s" * 32)
    node = ClusterNode(settings)
    assert node.routes.current == ()
    # counted again once the endpoints are listed (connect); at least two, as a JetStream
    # cluster answers only once two servers are in it
    assert node.replicas == 2
    node._k8s_changed(
        pods(Member("core-0", "10.0.0.10", True), Member("core-1", "10.0.0.11", True, 7500))
    )
    assert node.describe()["routes"] == ["10.0.0.11:7500"]
    assert node.routes.nodes == 2
