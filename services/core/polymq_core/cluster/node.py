"""This node's part in a cluster (docs/cluster.md): its NATS server and connection, one
replicated log per shard, who leads which shard, forwarding addresses, announcements on
``system.peers`` and topic messages between nodes.

Life cycle, driven by :class:`~polymq_core.service.CoreService`:

1. :meth:`ClusterNode.connect`: with ``POLYMQ_K8S_SERVICE``, watch the Service's endpoints
   (without ``--peers``, until they name another pod: :mod:`polymq_core.cluster.natsroutes`); start
   our
   ``nats-server`` (or use ``--nats``) with routes to the other nodes, which then follow the
   endpoints; connect, make sure every shard's stream exists (waiting for JetStream's own
   leader election);
2. the broker opens its shards on :meth:`ClusterNode.store` (each tails its log);
3. :meth:`ClusterNode.start`: announce ourselves, exchange topic interest, and follow the
   shards' leaders every second: a shard whose stream this node leads is promoted (fenced
   takeover, then loaded), one led elsewhere is demoted (its
   :class:`~polymq_core.cluster.leadership.ShardLeadership`);
   The leader of each shard also purges its log every ``purge_every`` seconds, below what
   every node announced it applied; a node whose next entry was purged copies the shard
   from another node's admin HTTP (:meth:`ClusterNode.snapshot` serves it there: its
   :class:`~polymq_core.cluster.retention.LogRetention`);
4. :meth:`ClusterNode.leave` (announce leaving, stop following); once the broker has
   answered what it read, :meth:`ClusterNode.hand_over` (what only memory holds of the
   shards it leads, to their next leaders: :mod:`polymq_core.forwarding.handover`); once it closed
   its
   shards, :meth:`ClusterNode.close` (hand the other streams this node leads to others,
   close NATS).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from polymq.errors import PolymqError, QueueFull
from polymq.types import Message

from ..destinations.shard import shard_index
from ..forwarding.handover import HandOver
from ..reload import SUBJECT as RELOAD_SUBJECT
from ..reload import Reloader, ReloadError
from ..replication.jetstream import ShardLog
from ..replication.replicatedstore import ReplicatedStore
from ..store.contract import Store
from ..store.logentry import LogError
from ..store.sqlite import SqliteStore
from ..topics.durableroutes import DurableRoutes
from ..topics.mesh import Routed, TopicMesh
from .endpoints import EndpointWatcher, Member, scaled_below
from .isolation import Isolation
from .leadership import ShardLeadership
from .membership import Membership
from .natsd import (
    AUTH_REFUSED,
    TLS_REFUSED,
    NatsConfig,
    NatsError,
    NatsServer,
    hostport,
    remove_servers,
)
from .natsroutes import Routes, others, watch_endpoints
from .peerwatch import PeerWatch
from .retention import LogRetention
from .snapshot import KEEP_BYTES, KEEP_ENTRIES, MAX_ENTRIES, PURGE_EVERY
from .tls import ClusterTls

if TYPE_CHECKING:
    from ..broker import Broker
    from ..config import CoreSettings
    from ..destinations.shard import Shard

log = logging.getLogger(__name__)

VERSION = "0.1.0"
_ELECTED = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.>"
_CONNECT_FOR = 90.0  # seconds to wait for the cluster's JetStream to answer at start-up
_MAX_PAYLOAD = 64 * 1024 * 1024
_STOP_TASKS_WITHIN = 3.0  # seconds a stop waits for its following tasks to end
_PEER_WATCH_EVERY = 1.0  # seconds between looks for peer links of unreachable nodes


class ClusterNode:
    """This node in the cluster. Two parts of it act on timers of their own, each using
    what its host protocol names of the node: following and moving the shards' leaders
    (:attr:`leadership`, a :class:`~polymq_core.cluster.leadership.ShardLeadership`, with
    its balancer and the streams' replicas), and purging logs and copying shards
    (:attr:`retention`, a :class:`~polymq_core.cluster.retention.LogRetention`).

    ``purge_every``: seconds between the purges of the logs this node leads, each keeping
    at least ``keep_entries`` entries (fewer when they hold more than ``keep_bytes``:
    :func:`~polymq_core.cluster.snapshot.kept_entries`) and at most ``max_entries``
    (:func:`~polymq_core.cluster.snapshot.purge_point`)."""

    def __init__(
        self,
        settings: CoreSettings,
        *,
        purge_every: float = PURGE_EVERY,
        keep_entries: int = KEEP_ENTRIES,
        keep_bytes: int = KEEP_BYTES,
        max_entries: int | None = MAX_ENTRIES,
    ) -> None:
        self.settings = settings
        self.node_id = settings.node
        self.secret = settings.secret
        if not settings.cluster_secret:  # (CoreSettings.check: only with the switch)
            log.warning(
                "INSECURE: --insecure-dev-secret (POLYMQ_INSECURE_DEV_SECRET): no "
                "POLYMQ_CLUSTER_SECRET, this node runs on a public development secret. "
                "Anyone who reaches its ports logs in with it as a peer on the wire "
                "protocol, as an administrator on the admin API (with --auth too), and "
                "downloads every shard's data (GET /api/cluster/snapshot). Never use it "
                "where others can reach the node; set the same random POLYMQ_CLUSTER_SECRET "
                "on every node instead."
            )
        # TLS to and from the peers (None: plain), its files loaded now: a bad one stops
        # the start. Links to peers use peer_ssl; the service's peer listeners serve_ssl.
        self.tls = ClusterTls.of(settings)
        self.peer_ssl = self.tls.client_context() if self.tls is not None else None
        self.serve_ssl = self.tls.server_context() if self.tls is not None else None
        # the NATS routes: --peers and the Kubernetes endpoints (polymq_core.cluster.natsroutes);
        # the
        # replicas are counted again once the endpoints are listed (connect)
        self.routes = Routes.of(settings)
        self.replicas = _replicas(self.routes.nodes)
        self.nc = NatsClient()
        self.js = self.nc.jetstream(timeout=5.0)
        self.logs = [
            ShardLog(self.js, i, self.node_id, replicas=self.replicas)
            for i in range(settings.shards)
        ]
        self.stores: list[ReplicatedStore] = []
        # every shard's durable bindings, from its log: whose leaders a topic publish's
        # persistent messages wait for (polymq_core.topics.durableroutes)
        self.durable_routes = DurableRoutes(functools.partial(shard_index, shards=settings.shards))
        self.nats: NatsServer | None = None
        self.broker: Broker | None = None
        self.membership: Membership | None = None
        self.mesh: TopicMesh | None = None
        self.addresses: dict[str, str] = {}
        self.admin_url = ""
        self.started = time.time()
        self.state = "joining"
        # one per shard following its leader, the balancer, the peer watch, the unready guard
        self._tasks: list[asyncio.Task[None]] = []
        self._advisories: Subscription | None = None
        self._purger: asyncio.Task[None] | None = None
        self.reloader: Reloader | None = None  # applies system.config reloads (the service's)
        self._config_sub: Subscription | None = None
        self.k8s: EndpointWatcher | None = None  # the Service's EndpointSlices, if set
        self.k8s_members: dict[str, Member] = {}
        self.isolation: Isolation | None = None  # pauses our nats-server while cut off
        # on a planned stop, take this node out of the streams' replicas for good (it is not
        # coming back: POLYMQ_LEAVE=remove, or POST /api/cluster/leave), not just step down
        self.remove_on_leave = settings.leave == "remove"
        # its parts: who leads each shard (and moving leads), the logs' bounds and copies
        self.leadership = ShardLeadership(self, len(self.logs))
        self.retention = LogRetention(
            self,
            settings.data_dir / "snapshots",
            purge_every=purge_every,
            keep_entries=keep_entries,
            keep_bytes=keep_bytes,
            max_entries=max_entries,
        )

    # ---- life cycle ------------------------------------------------------------------------
    async def connect(self) -> None:
        s = self.settings
        url = s.nats_url
        if s.k8s_service:
            loop = asyncio.get_running_loop()
            self.k8s = watch_endpoints(s, self._k8s_changed, loop)
            # JetStream clustering needs a route at start: without --peers, the first
            # listing that names another pod
            await self.routes.wait(self.k8s, _CONNECT_FOR)
            self.replicas = _replicas(self.routes.nodes)
            for shard_log in self.logs:
                shard_log.replicas = self.replicas
        config = nats_config(s, routes=self.routes.current)
        if not url:
            self.nats = NatsServer(
                config,
                log_path=s.data_dir / "nats-server.log",
                work_dir=s.data_dir / "nats-run",
            )
            await self.nats.start()
            self.routes.attach(self.nats)  # (with --nats, its `polymq nats` keeps them)
            url = self.nats.client_url
        # copies served to other nodes (GET /api/cluster/snapshot) that a crash left behind
        shutil.rmtree(self.retention.snapshot_dir, ignore_errors=True)
        # our own child, or one run apart from the same settings (`polymq nats`, the chart's
        # sidecar): both ask for the login derived from the cluster secret; a URL with a
        # login of its own (nats://user:password@...) uses that one instead
        auth = None if "@" in url else config.client_auth
        user, password = auth if auth is not None else (None, None)
        await self.nc.connect(
            url,
            user=user,
            password=password,
            name=f"polymq-core/{self.node_id}",
            no_echo=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            allow_reconnect=True,
            error_cb=self._nats_error,
        )
        deadline = time.monotonic() + _CONNECT_FOR
        for shard_log in self.logs:
            while True:
                try:
                    await shard_log.ensure()
                    break
                except LogError as exc:
                    refused = self._refused()
                    if not self.routes.current:
                        # a seed that knows only itself waits for a node to join it, for
                        # as long as it takes: a JetStream cluster needs two servers (its
                        # route to itself may be refused: a certificate not naming it)
                        deadline = time.monotonic() + _CONNECT_FOR
                        log.info(
                            "waiting for a second node (%s): JetStream needs two servers;"
                            " start another node with --peers %s%s",
                            exc,
                            hostport(advertised(s.host), s.cluster_port),
                            f" ({refused})" if refused else "",
                        )
                        await asyncio.sleep(1.0)
                        continue
                    if time.monotonic() > deadline:
                        if refused:
                            raise LogError(f"{exc}; {refused}") from exc
                        raise
                    if refused:
                        log.error("waiting for the cluster's JetStream (%s): %s", exc, refused)
                    else:
                        log.info("waiting for the cluster's JetStream (%s)", exc)
                    await asyncio.sleep(1.0)
        # the streams' replicas, as whoever made them counted (a node given only seeds
        # counts fewer nodes than there are)
        self.replicas = max(shard_log.replicas for shard_log in self.logs)
        log.info(
            "cluster node %s: NATS at %s, %d shard logs of %d replicas, peers %s",
            self.node_id,
            url,
            len(self.logs),
            self.replicas,
            ", ".join(f"{h}:{p}" for h, p in self.routes.current) or "(none)",
        )

    def _refused(self) -> str:
        """Why this node's NATS may not be joining the others: routes whose TLS handshake
        failed, or logins refused (its log says so), else nothing."""
        if self.nats is None or not self.routes.current:
            return ""
        refused = self.nats.refusals()
        if refused[TLS_REFUSED]:
            return (
                f"the TLS handshakes of NATS routes between this node and its peers failed"
                f" ({TLS_REFUSED} in {self.nats.log_path}): is cluster TLS on for every node,"
                " each certificate signed by the POLYMQ_CLUSTER_TLS_CA of the others and"
                " naming the host its peers reach it by (--peers)?"
            )
        if not refused[AUTH_REFUSED]:
            return ""
        return (
            f"NATS routes between this node and its peers were refused ({AUTH_REFUSED} in"
            f" {self.nats.log_path}): is POLYMQ_CLUSTER_SECRET the same on every node?"
        )

    def store(self, index: int) -> Store:
        """Shard ``index``'s store: its log, applied to a local SQLite snapshot."""
        local = SqliteStore(self.settings.data_dir / f"shard-{index:03d}.db", synchronous="NORMAL")
        store = ReplicatedStore(
            local,
            self.logs[index],
            self.node_id,
            on_deposed=lambda: self.leadership.deposed(index),
            fetch_snapshot=functools.partial(self.retention.fetch_snapshot, index),
            routes=self.durable_routes.of(index),
        )
        self.stores.append(store)
        return store

    async def start(self, broker: Broker, ports: dict[str, int]) -> None:
        self.broker = broker
        host = advertised(self.settings.host)
        self.addresses = {name: f"{host}:{port}" for name, port in ports.items()}
        if "admin" in ports:
            scheme = "https" if self.settings.core_tls else "http"
            self.admin_url = f"{scheme}://{host}:{ports['admin']}/"
        self.mesh = TopicMesh(
            self.nc, self.node_id, self._remote_topic, self._waits_for, self._remote_append
        )
        await self.mesh.start()
        shared = broker.context  # (what the broker's handlers share)
        shared.mesh = self.mesh
        shared.topics.on_interest = self.mesh.interest
        shared.bindings.watch(self.mesh.interest)
        self.membership = Membership(
            self.nc, self.node_id, self._describe_self, on_announce=self._announced
        )
        await self.membership.start()
        if self.nats is not None and self.replicas > 1:  # (our own child: ours to pause)
            self.isolation = Isolation(self.nats, self._peer_admin_urls, self._cut_off)
            self.isolation.start()
        broker.sensors.watch_cluster(
            lambda: sum(1 for s in broker.shards if s.leading), self._node_states
        )
        self._advisories = await self.nc.subscribe(_ELECTED, cb=self.leadership.elected)
        self._config_sub = await self.nc.subscribe(RELOAD_SUBJECT, cb=self._config_message)
        loop = asyncio.get_running_loop()
        leadership, balancer = self.leadership, self.leadership.balancer
        self._tasks = [
            loop.create_task(leadership.follow(i), name=f"leader-{i}")
            for i in range(len(self.logs))
        ]
        if self.replicas > 1:
            self._tasks.append(loop.create_task(balancer.balance(), name="balance"))
        self._purger = loop.create_task(self.retention.purge_logs(), name="purge-logs")
        # the peer links of a node that hangs are closed here (what they hold goes back)
        watch = PeerWatch(lambda: broker.sessions, self.membership.state_of, _PEER_WATCH_EVERY)
        self._tasks.append(loop.create_task(watch.run(), name="peer-watch"))
        if self.k8s is not None:  # (watched since connect)
            self._tasks.append(loop.create_task(balancer.guard_unready(), name="unready"))

    def add_listeners(self, ports: dict[str, int]) -> None:
        """The frontends' listeners, announced with the core's."""
        host = advertised(self.settings.host)
        self.addresses.update({name: f"{host}:{port}" for name, port in ports.items()})

    async def leave(self) -> None:
        """Planned stop, step one: say we are leaving (for good, if so: see
        :meth:`_leaving_for_good`) and stop following leaders (the broker then answers what
        it read and closes its shards)."""
        self.state = "leaving"
        if self.isolation is not None:
            await self.isolation.stop()
        if not self.remove_on_leave and await self._leaving_for_good():
            self.remove_on_leave = True
        tasks, self._tasks = self._tasks, []
        if self._purger is not None:
            tasks.append(self._purger)
            self._purger = None
        await _cancelled(tasks)
        for sub in (self._advisories, self._config_sub):
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        self.leadership.cancel_changes()
        if self.membership is not None:
            with contextlib.suppress(Exception):
                await self.membership.stop(gone=self.remove_on_leave)

    async def hand_over(self, shards: Sequence[Shard]) -> None:
        """Between the two steps, once the broker answered its sessions and before it closes
        its shards: hand what only memory holds of the shards this node leads (transient
        messages, non-durable queues) to their next leaders
        (:mod:`polymq_core.forwarding.handover`),
        then step down every other stream this node leads, at once
        (:meth:`ShardLeadership.hand_on_led`). The shards handed or stepped down here are
        not this node's any more: :meth:`close` leaves them be."""
        if self.replicas < 2 or not self.nc.is_connected or self.broker is None:
            return
        handed = await HandOver(self, self.broker.context.bindings.of).run(shards)
        await self.leadership.hand_on_led(shards, handed)

    # ---- what the hand-over, the relay and the admin API ask of the node -------------------
    async def written(self, shard: int) -> None:
        """Shard ``shard``'s writes are in its log (or failed)."""
        await self.stores[shard].written()

    def address_of(self, node: str) -> tuple[str, int] | None:
        """Where ``node`` takes forwarded requests (None: not known)."""
        if self.membership is None:
            return None
        # with cluster TLS, the wire listener for peers (TLS, a certificate both ways)
        return self.membership.address_of(node, "core" if self.tls is None else "peer_wire")

    def leader_of(self, shard: int) -> str | None:
        return self.leadership.leader_of(shard)

    def heirs(self) -> set[str]:
        return self.leadership.heirs()

    async def step_down(self, shard: int) -> None:
        await self.leadership.step_down(shard)

    async def stream_leader(self, shard: int) -> str | None:
        return await self.leadership.stream_leader(shard)

    def ready(self) -> bool:
        return self.leadership.ready()

    async def snapshot(self, shard: int) -> tuple[Path, int]:
        return await self.retention.snapshot(shard)

    async def close(self) -> None:
        """Step two, once the broker closed its shards: hand the streams this node leads to
        the others (one election instead of a timeout), then close NATS."""
        if self.isolation is not None:
            await self.isolation.stop()
        if self.k8s is not None:
            self.k8s.stop(timeout=0)
        if self.replicas > 1 and self.nc.is_connected:
            led = [log for i, log in enumerate(self.logs) if self.leader_of(i) == self.node_id]
            for shard_log in led:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(shard_log.step_down(), 2.0)
            if self.remove_on_leave:
                await self._remove_from_logs()
                await self._remove_from_meta()
        if self.mesh is not None:
            with contextlib.suppress(Exception):
                await self.mesh.stop()
        if self.nc.is_connected:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), 3.0)
        with contextlib.suppress(Exception):
            await self.nc.close()
        if self.nats is not None:
            await self.nats.stop()

    async def _leaving_for_good(self) -> bool:
        """With POLYMQ_LEAVE=auto on Kubernetes: has this pod's StatefulSet been scaled
        below it (``kubectl scale``)? A restart, a rolling update, an uninstall, or an
        answer that does not come within 4 s: no."""
        if self.settings.leave != "auto" or self.k8s is None:
            return False
        try:
            below = await asyncio.wait_for(
                asyncio.to_thread(scaled_below, self.k8s.api, self.k8s.namespace, self.node_id),
                4.0,
            )
        except TimeoutError:
            below = None
        if below:
            log.info("the StatefulSet was scaled below this pod: leaving for good")
        return bool(below)

    async def _remove_from_logs(self) -> None:
        """Leaving for good: take this node out of every shard's stream while it still
        runs (JetStream's peer removal, which places a new replica on a node that has
        none). JetStream refuses when there is no such node (three scaled down to two):
        then the stream's leader drops this replica once it is offline
        (:meth:`~polymq_core.cluster.replicas.Replicas._drop_gone`, told by the ``gone`` in
        this node's last announcement)."""
        for shard_log in self.logs:
            try:
                await asyncio.wait_for(shard_log.remove_peer(self.node_id), 5.0)
                log.info("%s: this node left its replicas", shard_log.stream)
            except (LogError, TimeoutError) as exc:
                # (no node to replace it: the leader drops it once it is offline)
                log.info("%s: left to the others to take out (%s)", shard_log.stream, exc)

    async def _remove_from_meta(self) -> None:
        """Leaving for good, last: take this node's server (and those of nodes that left for
        good before it) out of JetStream's meta group when that makes the group tolerate
        more losses (:func:`polymq_core.cluster.natsd.meta_removals`), as the system account's user:
        five scaled down to three would otherwise count a majority of five with three up,
        and lose it with the next node down. With ``--nats`` at a URL with a login of its
        own there is no system login: the node says so."""
        url = self.nats.client_url if self.nats is not None else self.settings.nats_url
        auth = nats_config(self.settings).system_auth
        if auth is None or (self.nats is None and "@" in url):
            log.warning("no system account login: this node stays in JetStream's meta group")
            return
        peers = self.membership.peers() if self.membership is not None else {}
        gone = {n for n, p in peers.items() if p.gone}
        try:
            removed = await asyncio.wait_for(remove_servers(url, auth, self.node_id, gone), 15.0)
        except (NatsError, TimeoutError) as exc:
            log.warning("this node could not leave JetStream's meta group: %s", exc)
            return
        if removed:
            log.info("taken out of JetStream's meta group: %s", ", ".join(removed))
        else:
            log.info("JetStream's meta group keeps this node (as tolerant either way)")

    @property
    def pids(self) -> list[int]:
        pids = [os.getpid()]
        if self.nats is not None and self.nats.pid is not None:
            pids.append(self.nats.pid)
        return pids

    def _node_states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        if self.membership is not None:
            for node in self.membership.peers():
                state = self.membership.state_of(node)
                counts[state] = counts.get(state, 0) + 1
        return counts

    # ---- announcements and topics --------------------------------------------------------------
    async def _nats_error(self, exc: Exception) -> None:
        """The NATS connection's errors, one line each (nats-py logs a traceback per try
        to reconnect: every second while this node's nats-server is stopped, cut off)."""
        paused = self.nats is not None and self.nats.paused
        log.log(logging.DEBUG if paused else logging.WARNING, "NATS: %r", exc)

    def _cut_off(self, cut_off: bool) -> None:
        """This node was cut off from its peers (True), or reaches them again: the sessions'
        links to other nodes were left hanging by the cut; drop them, so that requests open
        new ones (at once after the heal, not after TCP's retransmission back-off)."""
        if self.broker is None:
            return
        for session in list(self.broker.sessions):
            if session.relay is not None:
                session.relay.drop_links()

    def _peer_admin_urls(self) -> list[str]:
        """The admin URLs of the other nodes that have not left (what the isolation watch
        probes)."""
        membership = self.membership
        if membership is None:
            return []
        return [
            peer.admin_url
            for node, peer in membership.peers().items()
            if node != self.node_id and not peer.gone and peer.state != "leaving"
        ]

    def _describe_self(self) -> dict[str, Any]:
        broker = self.broker
        return {
            "node_id": self.node_id,
            "addresses": dict(self.addresses),
            "admin_url": self.admin_url,
            "shards_led": [s.index for s in broker.shards if s.leading] if broker else [],
            "version": VERSION,
            "started": self.started,
            "applied": {str(i): st.applied for i, st in enumerate(self.stores)},
            "state": self.state,
            "config_version": self.reloader.version if self.reloader is not None else 0,
        }

    # ---- system.config ---------------------------------------------------------------------
    async def reload(self, change: dict[str, Any]) -> str | None:
        """Broadcast a reload on ``system.config`` and apply it here; what went wrong here,
        if anything (each node logs its own)."""
        await self.nc.publish(RELOAD_SUBJECT, json.dumps(change).encode())
        return self._apply(change)

    async def _config_message(self, msg: Msg) -> None:
        try:
            change = json.loads(msg.data)
        except ValueError:
            log.warning("system.config: not JSON: %r", msg.data[:200])
            return
        if isinstance(change, dict):
            self._apply(change)

    def _apply(self, change: dict[str, Any]) -> str | None:
        if self.reloader is None:
            return "this node cannot reload"
        try:
            self.reloader.apply(change)
        except ReloadError as exc:
            log.error("system.config: %s", exc)
            return str(exc)
        return None  # (the next announcement on system.peers carries the version)

    def _announced(self, announcement: dict[str, Any]) -> None:
        """Every announcement heard (ours too) goes to the leadership's balancer (what a node
        applied, beside what this one has: :meth:`~polymq_core.cluster.balancer.Balancer.heard`)
        and to local subscribers of ``system.peers``."""
        self.leadership.balancer.heard(str(announcement.get("node_id", "")))
        broker = self.broker
        if broker is None:
            return
        body = json.dumps(announcement, sort_keys=True).encode()
        msg = Message(body=body, content_type="application/json")
        broker.publisher.publish_topic("system.peers", [msg])

    def _waits_for(self, name: str) -> set[int]:
        """The shards led by other nodes whose durable queues are bound to ``topic/<name>``:
        a persistent message published to it here is confirmed once their leaders committed
        their copies (:mod:`polymq_core.topics.mesh`)."""
        shards = self.durable_routes.shards(name)
        broker = self.broker
        if not shards or broker is None:
            return shards
        return {s for s in shards if not broker.shards[s].leading}

    def _remote_topic(
        self, name: str, messages: list[Message], answer: bool
    ) -> Awaitable[Routed] | None:
        """Messages another node published to ``topic/<name>``: our subscribers and the bound
        queues this node leads; with ``answer``, what to tell that node about the copies
        once they are committed (the shards this node leads, those whose copy failed)."""
        broker = self.broker
        if broker is None:
            return None
        broker.publisher.publish_topic(name, messages)
        led = [s.index for s in broker.shards if s.leading]
        refused: list[str] = []
        taken, futs = broker.publisher.route_copies(name, messages, refused)
        if not answer:
            for _, fut in futs:
                fut.add_done_callback(_quiet)
            return None
        return _copies_done(led, taken, refused, futs)

    def _remote_append(
        self, shard: int, key: str, messages: list[Message]
    ) -> Awaitable[Routed] | None:
        """Another node sends ``messages`` to queue ``key`` of ``shard`` (a dead letter):
        appended if this node leads the shard (what to answer once committed), else None."""
        broker = self.broker
        if broker is None or not 0 <= shard < len(broker.shards):
            return None
        holder = broker.shards[shard]
        if not holder.leading or broker.shard_for(key) is not holder:
            return None
        try:
            fut = holder.publish(key, messages)
        except QueueFull:
            log.warning("dead-lettering to %s: refused (full)", key)
            return _answered(Routed([shard], [], 0, [key]))
        except PolymqError as exc:
            return _answered(Routed([shard], [(shard, str(exc))], 0, []))
        return _copies_done([shard], 1, [], [] if fut is None else [(shard, fut)])

    def describe(self) -> dict[str, Any]:
        nodes = self.membership.describe() if self.membership is not None else []
        return {
            "node_id": self.node_id,
            "state": self.state,
            "ready": self.ready(),
            # the streams' replicas: as counted at start, or as many as a stream has grown to
            "replicas": max(self.replicas, *(shard_log.configured for shard_log in self.logs)),
            "routes": [hostport(h, p) for h, p in self.routes.current],  # NATS routes
            "leave": "remove" if self.remove_on_leave else self.settings.leave,
            "nodes": nodes,
            "shards": [
                {
                    "shard": i,
                    "leader": self.leader_of(i),
                    "leading": bool(self.broker and self.broker.shards[i].leading),
                    "applied": self.stores[i].applied if i < len(self.stores) else 0,
                    "peers": list(self.logs[i].peers),  # the stream's replicas
                }
                for i in range(len(self.logs))
            ],
            "kubernetes": None
            if self.k8s is None
            else {
                "service": f"{self.k8s.namespace}/{self.k8s.service}",
                "members": [
                    {"name": m.name, "address": m.address, "ready": m.ready}
                    for m in sorted(self.k8s_members.values(), key=lambda m: m.name)
                ],
                "error": self.k8s.last_error,
            },
        }

    # ---- Kubernetes ------------------------------------------------------------------------
    def _k8s_changed(self, members: dict[str, Member]) -> None:
        """The Service's endpoints changed: which pods are ready is the balancer's to note
        (:meth:`~polymq_core.cluster.balancer.Balancer.endpoints_changed`); the NATS routes
        follow them."""
        self.leadership.balancer.endpoints_changed(members)
        before = {m.name: m.ready for m in self.k8s_members.values()}
        after = {m.name: m.ready for m in members.values()}
        if before != after:
            log.info(
                "Kubernetes endpoints: ready %s, not ready %s",
                sorted(n for n, r in after.items() if r) or "none",
                sorted(n for n, r in after.items() if not r) or "none",
            )
        self.k8s_members = members
        self.routes.update(members)  # the NATS routes: the endpoints are a source of them


async def _cancelled(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until they end, cancelling again every half second (a
    cancel can be swallowed on the way: see
    :func:`polymq_core.replication.jetstream.check_cancelled`),
    for at most _STOP_TASKS_WITHIN seconds: a task that still runs then is logged and left,
    not waited for (a stop must end; the process exits after it)."""
    deadline = time.monotonic() + _STOP_TASKS_WITHIN
    left = [t for t in tasks if not t.done()]
    while left and time.monotonic() < deadline:
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=0.5)
        left = [t for t in left if not t.done()]
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())
    if left:
        log.warning(
            "stopping: %s did not end within %.0f s of its cancel; going on without it",
            ", ".join(t.get_name() for t in left),
            _STOP_TASKS_WITHIN,
        )


async def _answered(routed: Routed) -> Routed:
    return routed


async def _copies_done(
    led: list[int], taken: int, refused: list[str], futs: list[tuple[int, asyncio.Future[None]]]
) -> Routed:
    """What to answer about copies of another node's confirmed message, once they are done."""
    failed: list[tuple[int, str]] = []
    for shard, fut in futs:
        try:
            await asyncio.shield(fut)
        except Exception as exc:
            failed.append((shard, str(exc)))
    return Routed(led, failed, taken, refused)


def _quiet(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("a topic message from another node was not kept: %s", fut.exception())


def nats_config(
    settings: CoreSettings,
    *,
    routes: tuple[tuple[str, int], ...] | None = None,
    client_port: int = -1,
) -> NatsConfig:
    """The nats-server of a node with these ``settings``: the one :class:`ClusterNode`
    starts as its child, and the one ``polymq nats`` runs in the foreground beside a core
    given ``--nats`` (the chart's sidecar), so the two cannot differ. ``routes``: the other
    nodes' cluster addresses when already worked out (default: ``--peers`` without this
    node); ``client_port``: -1 picks a free one (the child), a fixed one for a sidecar."""
    if routes is None:
        routes = others(settings.peer_addresses(), settings.cluster_port)
    return NatsConfig(
        clustered=True,
        server_name=settings.node,
        store_dir=settings.data_dir / "nats",
        cluster_port=settings.cluster_port,
        routes=routes,
        host=settings.host,
        client_port=client_port,
        # a log entry carries a whole frame's worth of messages (NATS allows 64 MiB)
        max_payload=min(_MAX_PAYLOAD, settings.max_frame + 1024 * 1024),
        secret=settings.secret,
        tls=ClusterTls.of(settings),
        memory_limit=settings.nats_memory_limit,
    )


def _replicas(nodes: int) -> int:
    """The replicas of the streams a node makes that counts ``nodes`` nodes: one per node,
    at most three, and at least two: a JetStream cluster answers only once two servers are
    in it (a seed given only itself counts one)."""
    return min(3, max(2, nodes))


def advertised(host: str) -> str:
    """The host the other nodes reach this node's listeners at, bound to ``host``: ``host``
    itself, but for a bind-all address (``0.0.0.0``, ``::``, empty: the chart's), which
    names no one (a peer connecting to it reaches itself), the address of this machine's
    name (in a pod: the pod's IP, from its /etc/hosts); an IPv6 one in brackets."""
    if host not in ("", "0.0.0.0", "::"):
        return f"[{host}]" if ":" in host else host
    family = socket.AF_INET6 if host == "::" else socket.AF_INET
    try:
        found = str(socket.getaddrinfo(socket.gethostname(), None, family)[0][4][0])
    except (OSError, IndexError):
        return socket.gethostname()
    return f"[{found}]" if ":" in found else found


__all__ = ["ClusterNode", "nats_config"]
