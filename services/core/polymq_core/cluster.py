"""This node's part in a cluster (docs/cluster.md): its NATS server and connection, one
replicated log per shard, who leads which shard, forwarding addresses, announcements on
``system.peers`` and topic messages between nodes.

Life cycle, driven by :class:`~polymq_core.service.CoreService`:

1. :meth:`ClusterNode.connect`: with ``POLYMQ_K8S_SERVICE``, watch the Service's endpoints
   (without ``--peers``, until they name another pod: :mod:`polymq_core.routes`); start our
   ``nats-server`` (or use ``--nats``) with routes to the other nodes, which then follow the
   endpoints; connect, make sure every shard's stream exists (waiting for JetStream's own
   leader election);
2. the broker opens its shards on :meth:`ClusterNode.store` (each tails its log);
3. :meth:`ClusterNode.start`: announce ourselves, exchange topic interest, and follow the
   shards' leaders every second: a shard whose stream this node leads is promoted (fenced
   takeover, then loaded), one led elsewhere is demoted;
   The leader of each shard also purges its log every ``purge_every`` seconds, below what
   every node announced it applied (:mod:`polymq_core.snapshot`); a node whose next entry was
   purged copies the shard from another node's admin HTTP (:meth:`ClusterNode.snapshot`
   serves it there);
4. :meth:`ClusterNode.leave` (announce leaving, stop following); once the broker has
   answered what it read, :meth:`ClusterNode.hand_over` (what only memory holds of the
   shards it leads, to their next leaders: :mod:`polymq_core.handover`); once it closed its
   shards, :meth:`ClusterNode.close` (hand the other streams this node leads to others,
   close NATS).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from polymq.types import Message

from .clustertls import ClusterTls
from .endpoints import EndpointWatcher, Member, scaled_below
from .handover import HandOver
from .logentry import LogError
from .membership import LEAVING, UNREACHABLE, Membership, PeerInfo
from .mesh import TopicMesh
from .natsd import AUTH_REFUSED, TLS_REFUSED, NatsConfig, NatsServer, hostport
from .reload import SUBJECT as RELOAD_SUBJECT
from .reload import Reloader, ReloadError
from .replog import ReplicatedStore
from .routes import Routes, others, watch_endpoints
from .shardlog import ShardLog
from .snapshot import (
    KEEP_ENTRIES,
    MAX_ENTRIES,
    PURGE_EVERY,
    SnapshotError,
    download,
    lowest_applied,
    purge_point,
    snapshot_sources,
    snapshot_url,
)
from .sqlitestore import SqliteStore
from .store import Store

if TYPE_CHECKING:
    from .broker import Broker
    from .config import CoreSettings
    from .shard import Shard

log = logging.getLogger(__name__)

VERSION = "0.1.0"
_POLL = 1.0  # seconds between looks at who leads each shard's stream
_INFO_TIMEOUT = 1.5  # seconds a look may take (a dead leader's stream does not answer)
_ELECTED = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.>"
_BALANCE_EVERY = 10.0  # seconds between looks at how the shards' leaders are spread
_CAUGHT_UP = 100  # entries a node may be behind and still be handed a shard's lead
# seconds a node keeps a shard it has just taken over before the balancer may hand it on: a
# failover is not followed at once by a second move (each move sends a subscription's
# unacknowledged deliveries again and refuses the writes in flight)
_SETTLE = 20.0
# seconds a shard may go without a leader (reported, or no answer at all) before this node
# stops serving it from memory; its writes fail meanwhile anyway (no majority, no commit)
_LEADERLESS = 10.0
_UNREADY_GRACE = 10.0  # seconds a pod Kubernetes calls not ready keeps its shards' leads
_CONNECT_FOR = 90.0  # seconds to wait for the cluster's JetStream to answer at start-up
_MAX_PAYLOAD = 64 * 1024 * 1024
_DEV_SECRET = "polymq-insecure-development-cluster-secret"


class ClusterNode:
    """``purge_every``: seconds between the purges of the logs this node leads, each keeping
    at least ``keep_entries`` entries and at most ``max_entries`` (:func:`purge_point`)."""

    def __init__(
        self,
        settings: CoreSettings,
        *,
        purge_every: float = PURGE_EVERY,
        keep_entries: int = KEEP_ENTRIES,
        max_entries: int | None = MAX_ENTRIES,
    ) -> None:
        if purge_every <= 0:
            raise ValueError("purge_every must be positive")
        purge_point(None, first=1, last=1, keep=keep_entries, most=max_entries)  # checks them
        self.settings = settings
        self.purge_every = purge_every
        self.keep_entries = keep_entries
        self.max_entries = max_entries
        self.node_id = settings.node
        self.secret = settings.cluster_secret or _DEV_SECRET
        if not settings.cluster_secret:
            log.warning(
                "POLYMQ_CLUSTER_SECRET is not set: peer links use a well-known development "
                "secret. Set the same secret on every node in production."
            )
        # TLS to and from the peers (None: plain), its files loaded now: a bad one stops
        # the start. Links to peers use peer_ssl; the service's peer listeners serve_ssl.
        self.tls = ClusterTls.of(settings)
        self.peer_ssl = self.tls.client_context() if self.tls is not None else None
        self.serve_ssl = self.tls.server_context() if self.tls is not None else None
        # the NATS routes: --peers and the Kubernetes endpoints (polymq_core.routes); the
        # replicas are counted again once the endpoints are listed (connect)
        self.routes = Routes.of(settings)
        self.replicas = min(3, self.routes.nodes)
        self.nc = NatsClient()
        self.js = self.nc.jetstream(timeout=5.0)
        self.logs = [
            ShardLog(self.js, i, self.node_id, replicas=self.replicas)
            for i in range(settings.shards)
        ]
        self.stores: list[ReplicatedStore] = []
        self.leaders: dict[int, str | None] = {}
        self._leaderless_since: dict[int, float] = {}
        self.nats: NatsServer | None = None
        self.broker: Broker | None = None
        self.membership: Membership | None = None
        self.mesh: TopicMesh | None = None
        self.addresses: dict[str, str] = {}
        self.admin_url = ""
        self.started = time.time()
        self.state = "joining"
        self._tasks: list[asyncio.Task[None]] = []  # one per shard: following its leader
        self._wake = [asyncio.Event() for _ in self.logs]
        self._advisories: Subscription | None = None
        self._promoting: dict[int, asyncio.Task[None]] = {}
        self._applied_seen: dict[int, int] = {}  # per shard, at the balancer's last look
        self._led_since: dict[int, float] = {}  # per shard this node took over: when
        self._purger: asyncio.Task[None] | None = None
        self.reloader: Reloader | None = None  # applies system.config reloads (the service's)
        self._config_sub: Subscription | None = None
        self.k8s: EndpointWatcher | None = None  # the Service's EndpointSlices, if set
        self.k8s_members: dict[str, Member] = {}
        # pods Kubernetes says are not ready, or that left the endpoints, and since when
        self._unready_since: dict[str, float] = {}
        self._k8s_known: set[str] = set()  # every pod the endpoints have named
        # on a planned stop, take this node out of the streams' replicas for good (it is not
        # coming back: POLYMQ_LEAVE=remove, or POST /api/cluster/leave), not just step down
        self.remove_on_leave = settings.leave == "remove"
        self._resizing: dict[int, asyncio.Task[None]] = {}  # per shard: its replicas changing

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
            self.replicas = min(3, self.routes.nodes)
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
        shutil.rmtree(self._snapshots, ignore_errors=True)
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
        )
        deadline = time.monotonic() + _CONNECT_FOR
        for shard_log in self.logs:
            while True:
                try:
                    await shard_log.ensure()
                    break
                except LogError as exc:
                    refused = self._refused()
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
            on_deposed=lambda: self._deposed(index),
            fetch_snapshot=functools.partial(self._fetch_snapshot, index),
        )
        self.stores.append(store)
        return store

    async def start(self, broker: Broker, ports: dict[str, int]) -> None:
        self.broker = broker
        host = advertised(self.settings.host)
        self.addresses = {name: f"{host}:{port}" for name, port in ports.items()}
        if "admin" in ports:
            self.admin_url = f"http://{host}:{ports['admin']}/"
        self.mesh = TopicMesh(self.nc, self.node_id, self._remote_topic)
        await self.mesh.start()
        broker.mesh = self.mesh
        broker.topics.on_interest = self.mesh.interest
        broker.bindings.watch(self.mesh.interest)
        self.membership = Membership(
            self.nc, self.node_id, self._describe_self, on_announce=self._announced
        )
        await self.membership.start()
        broker.sensors.watch_cluster(
            lambda: sum(1 for s in broker.shards if s.leading), self._node_states
        )
        self._advisories = await self.nc.subscribe(_ELECTED, cb=self._elected)
        self._config_sub = await self.nc.subscribe(RELOAD_SUBJECT, cb=self._config_message)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow(i), name=f"leader-{i}") for i in range(len(self.logs))
        ]
        if self.replicas > 1:
            self._tasks.append(loop.create_task(self._balance(), name="balance"))
        self._purger = loop.create_task(self._purge_logs(), name="purge-logs")
        if self.k8s is not None:  # (watched since connect)
            self._tasks.append(loop.create_task(self._guard_unready(), name="unready"))

    def add_listeners(self, ports: dict[str, int]) -> None:
        """The frontends' listeners, announced with the core's."""
        host = advertised(self.settings.host)
        self.addresses.update({name: f"{host}:{port}" for name, port in ports.items()})

    async def leave(self) -> None:
        """Planned stop, step one: say we are leaving (for good, if so: see
        :meth:`_leaving_for_good`) and stop following leaders (the broker then answers what
        it read and closes its shards)."""
        self.state = "leaving"
        if not self.remove_on_leave and await self._leaving_for_good():
            self.remove_on_leave = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._purger is not None:
            self._purger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._purger
            self._purger = None
        for sub in (self._advisories, self._config_sub):
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        for task in list(self._promoting.values()):
            task.cancel()
        for task in list(self._resizing.values()):
            task.cancel()
        if self.membership is not None:
            with contextlib.suppress(Exception):
                await self.membership.stop(gone=self.remove_on_leave)

    async def hand_over(self, shards: Sequence[Shard]) -> None:
        """Between the two steps, once the broker answered its sessions and before it closes
        its shards: hand what only memory holds of the shards this node leads (transient
        messages, non-durable queues) to their next leaders (:mod:`polymq_core.handover`).
        The shards handed are stepped down already: :meth:`close` leaves them be."""
        if self.replicas < 2 or not self.nc.is_connected or self.broker is None:
            return
        handed = await HandOver(self, self.broker.bindings.of).run(shards)
        self.leaders.update(handed)

    async def written(self, shard: int) -> None:
        """Shard ``shard``'s writes are in its log (or failed)."""
        await self.stores[shard].written()

    async def step_down(self, shard: int) -> None:
        """Hand shard ``shard``'s stream on (this node stops): to the ready replica that
        leads the fewest and has caught up, if there is one, else where JetStream likes."""
        heir = None
        if self.membership is not None:
            heir = self._heir(shard, self._candidates(self.membership))
        await self.logs[shard].step_down(preferred=heir)

    async def stream_leader(self, shard: int) -> str | None:
        """Who leads shard ``shard``'s stream now (None: nobody, or no answer in time)."""
        try:
            leader, _ = await asyncio.wait_for(self.logs[shard].info(), _INFO_TIMEOUT)
        except (LogError, TimeoutError):
            return None
        return leader

    def heirs(self) -> set[str]:
        """The other nodes that may take a shard this node hands on now (ready: not
        stopping, not unreachable, not a pod Kubernetes calls not ready)."""
        if self.membership is None:
            return set()
        return set(self._candidates(self.membership))

    async def close(self) -> None:
        """Step two, once the broker closed its shards: hand the streams this node leads to
        the others (one election instead of a timeout), then close NATS."""
        if self.k8s is not None:
            self.k8s.stop(timeout=0)
        if self.replicas > 1 and self.nc.is_connected:
            led = [log for i, log in enumerate(self.logs) if self.leaders.get(i) == self.node_id]
            for shard_log in led:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(shard_log.step_down(), 2.0)
            if self.remove_on_leave:
                await self._remove_from_logs()
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
        (:meth:`_drop_gone`, told by the ``gone`` in this node's last announcement)."""
        for shard_log in self.logs:
            try:
                await asyncio.wait_for(shard_log.remove_peer(self.node_id), 5.0)
                log.info("%s: this node left its replicas", shard_log.stream)
            except (LogError, TimeoutError) as exc:
                # (no node to replace it: the leader drops it once it is offline)
                log.info("%s: left to the others to take out (%s)", shard_log.stream, exc)

    @property
    def pids(self) -> list[int]:
        pids = [os.getpid()]
        if self.nats is not None and self.nats.pid is not None:
            pids.append(self.nats.pid)
        return pids

    # ---- leaders ------------------------------------------------------------------------------
    def leader_of(self, shard: int) -> str | None:
        return self.leaders.get(shard)

    def address_of(self, node: str) -> tuple[str, int] | None:
        if self.membership is None:
            return None
        # with cluster TLS, the wire listener for peers (TLS, a certificate both ways)
        return self.membership.address_of(node, "core" if self.tls is None else "peer_wire")

    async def _follow(self, index: int) -> None:
        """Follow shard ``index``'s stream leader: every second, and at once when JetStream
        announces a new leader for it."""
        wake = self._wake[index]
        while True:
            try:
                await self._look(index)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following shard %d's leader failed; trying again", index)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), _POLL)
            wake.clear()

    async def _elected(self, msg: Msg) -> None:
        """A JetStream advisory: a stream has a new leader. Act on the leader it names at
        once (a look in flight may be waiting for an answer the election never gave), and
        look again to be sure."""
        stream = msg.subject.rsplit(".", 1)[-1]
        try:
            leader = json.loads(msg.data).get("leader")
        except (ValueError, AttributeError):
            leader = None
        for i, shard_log in enumerate(self.logs):
            if shard_log.stream == stream:
                shard_log.nudge()
                if isinstance(leader, str) and leader and self.broker is not None:
                    self._saw(i, leader, time.monotonic())
                self._wake[i].set()

    async def _look(self, i: int) -> None:
        assert self.broker is not None
        now = time.monotonic()
        try:
            leader, _ = await asyncio.wait_for(self.logs[i].info(), _INFO_TIMEOUT)
        except (LogError, TimeoutError):
            # No answer is not "no leader": under load a look can time out. Keep what we
            # knew for routing; only a long silence counts as leaderless (below).
            leader = None
        self._saw(i, leader, now)
        if leader == self.node_id and i not in self._resizing:
            gone, more = self._gone_replicas(i), self._more_replicas(i)
            step = self._drop_gone if gone else self._grow if more else None
            if step is not None:
                self._resizing[i] = asyncio.get_running_loop().create_task(
                    self._resize(i, step), name=f"resize-{i}"
                )

    async def _resize(self, i: int, step: Callable[[int], Awaitable[None]]) -> None:
        """``step(i)``: change shard ``i``'s stream's replicas; one that fails is logged
        and tried again at a look after _BALANCE_EVERY."""
        try:
            await step(i)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: changing its replicas failed (%s)", self.logs[i].stream, exc)
            await asyncio.sleep(_BALANCE_EVERY)
        finally:
            self._resizing.pop(i, None)

    def _more_replicas(self, i: int) -> int:
        """How many replicas shard ``i``'s stream should have, if more than it has: one
        per ready node, at most three (a stream scaled down grows back when nodes join;
        one is never shrunk here)."""
        if self.membership is None or not self.logs[i].peers:
            return 0
        ready = [n for n in self.membership.peers() if self.membership.state_of(n) == "ready"]
        wanted = min(3, len(ready))
        has = max(self.logs[i].configured, len(self.logs[i].peers))
        return wanted if wanted > has else 0

    async def _grow(self, i: int) -> None:
        """Give shard ``i``'s stream a replica on each node that joined, up to three
        (JetStream places them; a new replica catches up from the leader)."""
        shard_log = self.logs[i]
        wanted = self._more_replicas(i)
        if wanted:
            await asyncio.wait_for(shard_log.resize(wanted), 5.0)
            log.info("%s: %d replicas (nodes joined)", shard_log.stream, wanted)

    def _gone_replicas(self, i: int) -> list[str]:
        """The replicas of shard ``i``'s stream that JetStream calls offline and whose node
        said it left for good."""
        if self.membership is None:
            return []
        peers = self.membership.peers()
        return [n for n in self.logs[i].offline if (p := peers.get(n)) is not None and p.gone]

    async def _drop_gone(self, i: int) -> None:
        """Take the replicas of nodes gone for good out of shard ``i``'s stream (its leader
        does, once JetStream calls them offline): a peer removal, which JetStream answers
        by placing a new replica on a node that has none; with no such node (three scaled
        down to two), one replica fewer, JetStream dropping the offline one."""
        shard_log = self.logs[i]
        gone = self._gone_replicas(i)
        for node in gone:
            try:
                await asyncio.wait_for(shard_log.remove_peer(node), 5.0)
                log.info("%s: took node %s (gone) out of its replicas", shard_log.stream, node)
            except LogError as exc:
                if "remap" not in str(exc):
                    raise
                keep = sum(1 for p in shard_log.peers if p not in gone)
                if 1 <= keep < shard_log.configured:
                    await asyncio.wait_for(shard_log.resize(keep), 5.0)
                    log.info(
                        "%s: %d replicas, without %s (gone; no node to replace it)",
                        shard_log.stream,
                        keep,
                        ", ".join(gone),
                    )
                return

    def _saw(self, i: int, leader: str | None, now: float) -> None:
        """Shard ``i``'s stream is led by ``leader`` (None: no answer, and the known leader
        stays for routing): take the shard over, let it go, or, after _LEADERLESS seconds
        without a leader, stop serving it."""
        assert self.broker is not None
        shard = self.broker.shards[i]
        if leader is None:
            since = self._leaderless_since.setdefault(i, now)
            if shard.leading and now - since >= _LEADERLESS:
                shard.demote("its log has no leader (no majority?)")
        else:
            self.leaders[i] = leader
            self._leaderless_since.pop(i, None)
            if leader == self.node_id:
                if not shard.leading and i not in self._promoting:
                    self._promoting[i] = asyncio.get_running_loop().create_task(
                        self._promote(i), name=f"promote-{i}"
                    )
            elif shard.leading:
                shard.demote(f"node {leader} leads it now")
        if self.state == "joining" and self.ready():
            self.state = "ready"

    async def _balance(self) -> None:
        """Spread the shards' leaders over the live nodes: a node that leads more than its
        share hands one shard at a time to the ready, caught-up node that leads the fewest
        (a JetStream leader step-down with that node preferred), the quietest shard
        first. JetStream places leaders where its elections fall; after a restart one node
        may lead everything."""
        await _every(_BALANCE_EVERY, self._balance_once, "balancing the shards' leaders")

    async def _balance_once(self) -> None:
        broker, membership = self.broker, self.membership
        if broker is None or membership is None:
            return
        ready = {
            node: peer
            for node, peer in membership.peers().items()
            if membership.state_of(node) == "ready"
        }
        # a pod Kubernetes says is not ready is no leader candidate: nothing is handed to
        # it, and once it has been so for a while it hands on what it leads
        unready = self._unready_since
        if self.node_id in unready:
            return  # (_guard_unready hands on what it leads)
        ready = {n: p for n, p in ready.items() if n not in unready}
        if self.node_id not in ready or len(ready) < 2:
            return
        led: dict[str, list[int]] = {node: [] for node in ready}
        for i in range(len(self.logs)):
            leader = self.leaders.get(i)
            if leader in led:
                led[leader].append(i)
        # The quietest shards first (entries since the last look): moving a leader fails
        # the writes it had not appended yet, so a busy shard moves last.
        applied = {i: store.applied for i, store in enumerate(self.stores)}
        busy = {i: n - self._applied_seen.get(i, n) for i, n in applied.items()}
        self._applied_seen = applied
        mine = sorted(
            (i for i in led[self.node_id] if broker.shards[i].leading),
            key=lambda i: (busy.get(i, 0), i),
        )
        # only a replica of a shard's stream can lead it (a fourth node, or one that came
        # back after it was taken out, has none until a stream grows onto it)
        shards = range(len(self.logs))
        able = [n for n in ready if any(self._replica_of(i, n) for i in shards)]
        share = -(-len(self.logs) // max(len(able), 1))  # the most any node should lead
        if len(mine) <= share:
            return
        now = time.monotonic()
        mine = [i for i in mine if now - self._led_since.get(i, -_SETTLE) >= _SETTLE]
        for i in mine:
            targets = [n for n in ready if n != self.node_id and self._replica_of(i, n)]
            if not targets:
                continue
            target = min(targets, key=lambda n: (len(led[n]), n))
            if len(led[target]) + 1 <= share and self._caught_up(i, ready[target]):
                await self._hand(i, target, "balance")
                return

    def _replica_of(self, i: int, node: str) -> bool:
        """Is ``node`` a replica of shard ``i``'s stream (yes while none is known)?"""
        peers = getattr(self.logs[i], "peers", ())
        return not peers or node in peers

    def _caught_up(self, i: int, peer: Any) -> bool:
        """Has ``peer`` applied shard ``i``'s log to within _CAUGHT_UP of this node?"""
        ours = self.stores[i].applied if i < len(self.stores) else 0
        return bool(ours - peer.applied.get(i, 0) <= _CAUGHT_UP)

    async def _hand(self, i: int, target: str, why: str) -> None:
        """Hand shard ``i``'s lead to ``target``: a step-down with it preferred."""
        log.info("shard %d: handing its lead to node %s (%s)", i, target, why)
        await asyncio.wait_for(self.logs[i].step_down(preferred=target), 5.0)

    async def _guard_unready(self) -> None:
        """Every second: once this node's pod has been not ready (or gone from the
        endpoints) for _UNREADY_GRACE, hand a shard it leads to a ready node (one a look;
        a blip shorter than the grace moves nothing)."""
        await _every(_POLL, self._guard_unready_once, "handing on a shard (not ready here)")

    async def _guard_unready_once(self) -> None:
        membership = self.membership
        since = self._unready_since.get(self.node_id)
        if membership is None or since is None or time.monotonic() - since < _UNREADY_GRACE:
            return
        others = self._candidates(membership)
        if others:
            await self._hand_off(others)

    def _candidates(self, membership: Membership) -> dict[str, PeerInfo]:
        """The other nodes that may lead a shard this node hands on: ready, and not a pod
        Kubernetes calls not ready."""
        return {
            node: peer
            for node, peer in membership.peers().items()
            if node != self.node_id
            and membership.state_of(node) == "ready"
            and node not in self._unready_since
        }

    def _heir(self, i: int, others: dict[str, PeerInfo]) -> str | None:
        """Of ``others``, the one to hand shard ``i`` to: a replica of its stream that has
        caught up with this node, leading the fewest shards; None if none may."""
        led = collections.Counter(self.leaders.values())
        able = [n for n in others if self._replica_of(i, n) and self._caught_up(i, others[n])]
        return min(able, key=lambda n: (led[n], n), default=None)

    async def _hand_off(self, others: dict[str, PeerInfo]) -> None:
        """Hand one shard this node leads to the candidate leading the fewest that has
        caught up with it (one a round, as the balancer moves them)."""
        assert self.broker is not None
        for i, shard in enumerate(self.broker.shards):
            if self.leaders.get(i) != self.node_id or not shard.leading:
                continue
            target = self._heir(i, others)
            if target is not None:
                await self._hand(i, target, "not ready here")
                return

    async def _promote(self, index: int) -> None:
        assert self.broker is not None
        try:
            await self.broker.shards[index].promote()
            if self.broker.shards[index].leading:
                self._led_since[index] = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("shard %d: taking over failed (%s); trying again", index, exc)
        finally:
            self._promoting.pop(index, None)

    def _deposed(self, index: int) -> None:
        """The shard's log refused our append: somebody else leads it now."""
        if self.broker is not None:
            self.broker.shards[index].demote("another node appended to its log (deposed)")

    def _node_states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        if self.membership is not None:
            for node in self.membership.peers():
                state = self.membership.state_of(node)
                counts[state] = counts.get(state, 0) + 1
        return counts

    def ready(self) -> bool:
        """Can this node serve every shard: lead it, or forward to a leader it can reach?"""
        if self.broker is None or self.state == "leaving":
            return False
        for shard in self.broker.shards:
            leader = self.leaders.get(shard.index)
            if leader is None:
                return False
            if leader == self.node_id:
                if not shard.leading:
                    return False
            elif self.address_of(leader) is None:
                return False
        return True

    # ---- a bounded log, and snapshots for who fell behind it -------------------------------------
    async def _purge_logs(self) -> None:
        """Every ``purge_every`` seconds, purge the logs of the shards this node leads."""
        while True:
            await asyncio.sleep(self.purge_every)
            for i, store in enumerate(self.stores):
                if not store.is_leader:
                    continue
                try:
                    await self.purge(i)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("shard %d: purging its log failed: %s", i, exc)

    async def purge(self, index: int) -> int:
        """Purge shard ``index``'s log below what every node announced it applied (keeping
        at least ``keep_entries``); the sequence purged below, 0 if nothing was."""
        if self.membership is None:
            return 0
        shard_log = self.logs[index]
        lowest = lowest_applied(self.membership.peers().values(), index)
        first, last = await shard_log.span()
        point = purge_point(
            lowest, first=first, last=last, keep=self.keep_entries, most=self.max_entries
        )
        if point:
            await shard_log.purge_below(point)
            log.info(
                "shard %d: purged its log below entry %d (every node applied %s; last %d)",
                index,
                point,
                lowest,
                last,
            )
        return point

    @property
    def _snapshots(self) -> Path:
        return self.settings.data_dir / "snapshots"

    async def snapshot(self, shard: int) -> tuple[Path, int]:
        """A consistent copy of shard ``shard``'s SQLite in a new file (the caller removes
        it) and the log sequence applied in it: what ``GET /api/cluster/snapshot/<shard>``
        serves. IndexError for no such shard, StoreError if it cannot be copied now."""
        if not 0 <= shard < len(self.stores):
            raise IndexError(f"no shard {shard}")
        path = self._snapshots / f"shard-{shard:03d}-{uuid.uuid4().hex}.db"
        try:
            return path, await self.stores[shard].snapshot(path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    async def _fetch_snapshot(self, index: int, target: Path) -> int:
        """Copy shard ``index`` from another node into ``target`` (its leader if it can,
        else a node that announced enough applied); the sequence applied in the copy."""
        membership = self.membership
        if membership is None:
            raise SnapshotError("no other node heard from yet")
        try:
            first: int | None = (await self.logs[index].span())[0]
        except LogError:
            first = None
        reachable = [
            peer
            for peer in membership.peers().values()
            if membership.state_of(peer.node_id) not in (LEAVING, UNREACHABLE)
        ]
        sources = snapshot_sources(
            reachable, index, me=self.node_id, leader=self.leaders.get(index), first=first
        )
        if not sources:
            needed = f" applied up to entry {first - 1}" if first else ""
            raise SnapshotError(f"no reachable node has announced shard {index}{needed}")
        failures = []
        for peer in sources:
            try:
                url = snapshot_url(self._admin_url_of(peer), index)
                applied = await download(url, self.secret, target, ssl=self.peer_ssl)
            except SnapshotError as exc:
                failures.append(str(exc))
                continue
            log.info("shard %d: copied from node %s at entry %d", index, peer.node_id, applied)
            return applied
        raise SnapshotError("; ".join(failures))

    def _admin_url_of(self, peer: PeerInfo) -> str:
        """Where ``peer`` serves snapshots: its admin URL, or with cluster TLS its admin
        listener for peers (https, a certificate both ways)."""
        if self.tls is None:
            return peer.admin_url
        address = peer.addresses.get("peer_admin")
        if address is None:
            raise SnapshotError(
                f"node {peer.node_id} announced no TLS admin listener for peers: is cluster "
                "TLS on there?"
            )
        return f"https://{address}/"

    # ---- announcements and topics --------------------------------------------------------------
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
        """Every announcement heard (ours too) goes to local subscribers of ``system.peers``."""
        broker = self.broker
        if broker is None:
            return
        body = json.dumps(announcement, sort_keys=True).encode()
        msg = Message(body=body, content_type="application/json")
        broker.publisher.publish_topic("system.peers", [msg])

    def _remote_topic(self, name: str, messages: list[Message]) -> None:
        """Messages another node published to ``topic/<name>``: our subscribers and the bound
        queues this node leads."""
        broker = self.broker
        if broker is None:
            return
        broker.publisher.publish_topic(name, messages)
        if broker.bindings.size:
            result: dict[str, Any] = {"refused": []}
            answer = broker.publisher.route(name, messages, result)
            if not isinstance(answer, dict):
                asyncio.ensure_future(answer).add_done_callback(_quiet)

    def describe(self) -> dict[str, Any]:
        nodes = self.membership.describe() if self.membership is not None else []
        return {
            "node_id": self.node_id,
            "state": self.state,
            "ready": self.ready(),
            "replicas": self.replicas,
            "routes": [hostport(h, p) for h, p in self.routes.current],  # NATS routes
            "leave": "remove" if self.remove_on_leave else self.settings.leave,
            "nodes": nodes,
            "shards": [
                {
                    "shard": i,
                    "leader": self.leaders.get(i),
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
        """The Service's endpoints changed: note which pods are not ready, or have left
        the endpoints after being in them, and since when (such a pod is no leader
        candidate, and once so for _UNREADY_GRACE it hands its shards' leads to ready
        ones). A node never named by the endpoints (its id is not its pod's name) is
        judged by its NATS peers alone."""
        now = time.monotonic()
        self._k8s_known.update(members)
        for name in self._k8s_known:
            member = members.get(name)
            if member is not None and member.ready:
                self._unready_since.pop(name, None)
            else:
                self._unready_since.setdefault(name, now)
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


async def _every(seconds: float, step: Callable[[], Awaitable[None]], what: str) -> None:
    """``step()`` every ``seconds``, for ever; a step that fails is logged and tried again."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("%s failed (%s); trying again", what, exc)


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
        server_name=settings.node,
        store_dir=settings.data_dir / "nats",
        cluster_port=settings.cluster_port,
        routes=routes,
        host=settings.host,
        client_port=client_port,
        # a log entry carries a whole frame's worth of messages (NATS allows 64 MiB)
        max_payload=min(_MAX_PAYLOAD, settings.max_frame + 1024 * 1024),
        secret=settings.cluster_secret or _DEV_SECRET,
        tls=ClusterTls.of(settings),
    )


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
