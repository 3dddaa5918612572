"""A node's NATS routes: the union of its static peers and its Kubernetes Service's endpoints.

Cluster mode is on with ``--peers`` (``POLYMQ_PEERS``), with ``POLYMQ_K8S_SERVICE``, or
both. A node's nats-server routes to

- every address of ``--peers`` but this node's own (:func:`others`), always: a static peer
  is never removed;
- the cluster address of every endpoint of the Service's EndpointSlices, ready or not (NATS
  needs its routes before a pod is ready: the chart's headless Service publishes not-ready
  addresses), but this node's own (the endpoint named after this node, or one of this
  machine's addresses with this node's cluster port): the endpoint's address and the port
  its slice names ``cluster`` (:data:`polymq_core.cluster.endpoints.CLUSTER_PORT`), else this node's
  own cluster port (a StatefulSet's pods share it).

JetStream clustering needs a route when nats-server starts: a node without static peers
waits (:meth:`Routes.wait`) until the endpoints name another pod. Whenever the endpoints
change the set afterwards, the server reloads its config (:meth:`NatsServer.reroute`); when
they would leave it empty, it keeps the routes it has (a cluster block cannot be taken away
at runtime, and a route to a pod that is gone costs only its retries).

One :class:`Routes` serves both the core's own nats-server child
(:class:`polymq_core.cluster.node.ClusterNode`) and ``polymq nats`` (the chart's sidecar).

Errors::

    EndpointsError   (polymq_core.cluster.endpoints) no route in time: the API did not answer, or
                     named no pod but this one
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .endpoints import EndpointsError, EndpointWatcher, Member, api_client, own_namespace
from .natsd import hostport

if TYPE_CHECKING:
    from ..config import CoreSettings
    from .natsd import NatsServer

__all__ = ["Routes", "endpoint_routes", "others", "route_set", "watch_endpoints"]

log = logging.getLogger(__name__)

Route = tuple[str, int]
_LOG_EVERY = 5.0  # seconds between the log lines of a node waiting for its first route


def _local_addresses() -> set[str]:
    out = {"127.0.0.1", "::1", "localhost", "0.0.0.0"}
    name = socket.gethostname()
    out.add(name)
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(name, None):
            out.add(str(info[4][0]))
    return out


def _resolves_to(host: str, local: set[str]) -> bool:
    if host in local:
        return True
    try:
        return any(str(info[4][0]) in local for info in socket.getaddrinfo(host, None))
    except OSError:
        return False


def others(peers: tuple[Route, ...], port: int) -> tuple[Route, ...]:
    """``peers`` without this node (same cluster port on one of this machine's addresses),
    as SMQ's cluster connection manager detects itself in the shared list; no duplicates."""
    local = _local_addresses()
    me = socket.gethostname()
    out: list[Route] = []
    for host, p in peers:
        # (a StatefulSet pod is named by its hostname first: <pod>.<headless Service>, a
        # name that may not resolve yet while the pod starts)
        if p == port and (host.partition(".")[0] == me or _resolves_to(host.strip("[]"), local)):
            continue
        if (host, p) not in out:
            out.append((host, p))
    return tuple(out)


def endpoint_routes(
    members: Mapping[str, Member], *, me: str, cluster_port: int
) -> tuple[Route, ...]:
    """The cluster addresses of the Service's endpoints (by pod name), this node's left out:
    its pod (named ``me``) and any at one of this machine's addresses on ``cluster_port``."""
    named = tuple(
        (m.address, m.cluster_port or cluster_port)
        for name, m in sorted(members.items())
        if name != me
    )
    return others(named, cluster_port)


def route_set(
    static: tuple[Route, ...], members: Mapping[str, Member], *, me: str, cluster_port: int
) -> tuple[Route, ...]:
    """``static`` (this node already left out), then the endpoints' routes it lacks."""
    found = endpoint_routes(members, me=me, cluster_port=cluster_port)
    return static + tuple(r for r in found if r not in static)


class Routes:
    """The routes of one node's nats-server: ``static`` (``--peers`` without this node) and,
    fed to :meth:`update`, the Kubernetes endpoints. Once :meth:`attach`-ed to the running
    server, a change of the set reloads it."""

    def __init__(
        self, static: tuple[Route, ...], *, me: str, cluster_port: int, given: bool = False
    ) -> None:
        """``given``: ``--peers`` was given (it may name this node alone), so nats-server
        starts without waiting for the endpoints to name another node."""
        self.static = static
        self.me = me
        self.cluster_port = cluster_port
        self.members: dict[str, Member] | None = None  # None: the endpoints not listed yet
        self.current = static
        self.server: NatsServer | None = None
        self._some = asyncio.Event()
        if static or given:
            self._some.set()

    @classmethod
    def of(cls, settings: CoreSettings) -> Routes:
        port = settings.cluster_port
        given = settings.peer_addresses()
        return cls(others(given, port), me=settings.node, cluster_port=port, given=bool(given))

    @property
    def nodes(self) -> int:
        """How many nodes this node knows of, itself included: as many as its static peers
        or its Service's endpoints name, whichever name more (the two may name one node
        twice, by DNS name and by address; more replicas than nodes cannot be placed)."""
        found: tuple[Route, ...] = ()
        if self.members is not None:
            found = endpoint_routes(self.members, me=self.me, cluster_port=self.cluster_port)
        return 1 + max(len(self.static), len(found))

    def admin_addresses(self, admin_port: int) -> tuple[Route, ...]:
        """The other nodes' admin addresses, one for each node these routes name (what
        ``polymq nats``'s partition watch probes): an endpoint's address with the port its
        slice names ``admin``, else ``admin_port``; a static peer's host with
        ``admin_port``, unless an endpoint names the same node (the same route, or its pod:
        a StatefulSet pod's DNS name starts with the pod's name). ``admin_port`` 0 (not
        known): only endpoints that name their admin port."""
        out: list[Route] = []
        pods: set[str] = set()
        routed: set[Route] = set()
        if self.members is not None:
            kept = set(endpoint_routes(self.members, me=self.me, cluster_port=self.cluster_port))
            for name, member in sorted(self.members.items()):
                route = (member.address, member.cluster_port or self.cluster_port)
                if name == self.me or route not in kept:
                    continue  # (this node)
                pods.add(name)
                routed.add(route)
                port = member.admin_port or admin_port
                if port:
                    out.append((member.address, port))
        if admin_port:
            for host, port in self.static:
                if (host, port) not in routed and host.partition(".")[0] not in pods:
                    out.append((host, admin_port))
        return tuple(out)

    def update(self, members: dict[str, Member]) -> None:
        """The Service's endpoints are ``members`` now: the routes follow (a running server
        attached reloads them) unless that would leave none."""
        self.members = members
        routes = route_set(self.static, members, me=self.me, cluster_port=self.cluster_port)
        if not routes:
            if self.current:
                log.warning(
                    "the Kubernetes endpoints name no other node: the NATS routes stay %s",
                    _show(self.current),
                )
            return
        self._some.set()
        if set(routes) == set(self.current):
            return
        log.info("NATS routes: %s (was %s)", _show(routes), _show(self.current))
        self.current = routes
        if self.server is not None:
            self.server.reroute(routes)

    def attach(self, server: NatsServer) -> None:
        """``server`` runs (started with the routes then current): it follows changes from
        now on, and one made while it started is applied at once."""
        self.server = server
        server.reroute(self.current)

    async def wait(self, watcher: EndpointWatcher, timeout: float) -> tuple[Route, ...]:
        """Until there is a route (at once with ``--peers``), saying every few seconds what
        is awaited; the routes. ``EndpointsError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self._some.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                raise EndpointsError(f"no NATS route after {timeout:.0f} s: {self._hint(watcher)}")
            log.info("nats-server waits for its first route: %s", self._waiting(watcher))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._some.wait(), min(_LOG_EVERY, left))
        return self.current

    def _waiting(self, watcher: EndpointWatcher) -> str:
        if self.members is None:
            error = f" (last error: {watcher.last_error})" if watcher.last_error else ""
            return f"the endpoints of Service {watcher} are not listed yet{error}"
        names = ", ".join(sorted(self.members)) or "none"
        return f"the endpoints of Service {watcher} name no other node (pods: {names})"

    def _hint(self, watcher: EndpointWatcher) -> str:
        if self.members is None:
            return (
                f"{self._waiting(watcher)}: can this pod's service account list"
                " EndpointSlices there (the chart's Role), and is the API reachable?"
            )
        return (
            f"{self._waiting(watcher)}: one node alone should not set POLYMQ_K8S_SERVICE;"
            " a StatefulSet of several should start its pods together"
            " (podManagementPolicy: Parallel), or give --peers"
        )


def _show(routes: tuple[Route, ...]) -> str:
    return ", ".join(hostport(h, p) for h, p in routes) or "(none)"


def watch_endpoints(
    settings: CoreSettings,
    on_change: Callable[[dict[str, Member]], None],
    loop: asyncio.AbstractEventLoop,
) -> EndpointWatcher:
    """Start watching the EndpointSlices of ``settings.k8s_service`` (in
    ``settings.k8s_namespace``, else this pod's namespace); ``EndpointsError`` when the
    API cannot be configured."""
    watcher = EndpointWatcher(
        settings.k8s_namespace or own_namespace(),
        settings.k8s_service,
        on_change,
        api=api_client(settings.kubeconfig or None),
        loop=loop,
    )
    watcher.start()
    log.info("peers from Kubernetes: Service %s", watcher)
    return watcher
