"""The core's settings: ``POLYMQ_*`` environment variables, overridden by CLI flags."""

from __future__ import annotations

import re
import socket
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polymq_server.config import ConfigError, check_readable

_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CLUSTER_TLS = ("cluster_tls_cert", "cluster_tls_key", "cluster_tls_ca")
_NATS_MEMORY_LEAST = 64 * 1024 * 1024  # a smaller GOMEMLIMIT: nats-server collects nonstop
# the cluster secret of a node run with --insecure-dev-secret: public (it is in this file),
# so whoever reaches a node's ports logs in with it (see CoreSettings.secret)
DEV_SECRET = "polymq-insecure-development-cluster-secret"


@dataclass(frozen=True)
class CoreSettings:
    host: str = "127.0.0.1"
    core_port: int = 7400
    admin_port: int = 7401
    data_dir: Path = Path("./polymq-data")
    shards: int = 4
    node_name: str = socket.gethostname()
    auth: str = "anonymous"  # 'anonymous' or 'file:/path/users.json'
    max_frame: int = 64 * 1024 * 1024
    # before a client's Hello has logged it in: the largest frame taken (the Hello itself
    # included) and the seconds from the socket to the Welcome, else the socket is closed
    max_login_frame: int = 64 * 1024
    handshake_timeout: float = 10.0
    # connections the wire port takes at once (0: the room the open-files limit leaves) and
    # one user may hold (0: no limit; the frontends' and peers' own links are not counted)
    max_connections: int = 0
    max_connections_per_user: int = 0
    # resource alarms (polymq_core.alarms): a fraction (<= 1) of the memory this process may
    # use, or bytes (> 1), that its memory is to stay under; the share of that mark kept for
    # what comes while the alarm takes hold (it rises at 1 - headroom of the mark); the share
    # of the mark under which it clears; the least free bytes on the data directory's disk
    memory_high_watermark: float = 0.4
    memory_headroom: float = 0.1
    memory_low_watermark: float = 0.85
    disk_free_limit: int = 50_000_000
    # a durable queue's window of ready messages kept in memory: past either bound its
    # messages stay in the store only, and are read back in order as it drains (0 messages:
    # keep everything in memory). The bytes count each message's body plus what it costs
    # in memory besides (destinations.paging.OVERHEAD), so for most sizes they bind first
    queue_window_messages: int = 100_000
    queue_window_bytes: int = 32 * 1024 * 1024
    max_body: int = 16 * 1024 * 1024
    # per-destination metrics on /metrics (polymq_destination_*{destination}: one series each,
    # mind the cardinality), for at most that many destinations (the rest are counted)
    metrics_per_destination: bool = False
    metrics_max_destinations: int = 1000
    max_subscriptions_per_connection: int = 100_000
    max_pull: int = 1000
    max_wait: float = 60.0
    batch_window: float = 900.0  # seconds a publish's batch id is remembered (idempotency)
    # the console (polymq_core.admin.overview, .console): seconds between two samples of the
    # overview's rates, and the directory of the chart library's files (uPlot's dist/;
    # empty: services/core/web/node_modules/uplot/dist, where `make run` installs it)
    overview_interval: float = 5.0
    console_chart: str = ""
    # cluster mode (docs/cluster.md): on when `peers` or `k8s_service` is set (the NATS
    # routes are the union of both: polymq_core.cluster.natsroutes)
    node_id: str = ""  # this node's id in the cluster (default: node_name)
    peers: str = ""  # "host:port,host:port": the nodes' cluster (NATS route) addresses
    cluster_port: int = 7422  # this node's cluster (NATS route) listener
    nats_url: str = ""  # a NATS server run apart (e.g. a sidecar) instead of our own child
    # peer links, NATS routes and snapshot copies log in with it; the same on every node,
    # required in cluster mode unless insecure_dev_secret (a public one: development only)
    cluster_secret: str = ""
    insecure_dev_secret: bool = False
    # TLS between the nodes (docs/cluster.md, "Security"): this node's PEM certificate
    # (chain) and key, and the CA bundle every node's certificate is signed by; all three or
    # none. With them, NATS routes are TLS and peers reach this node's wire protocol and
    # admin HTTP on two TLS listeners of their own (0 picks a free port: it is announced)
    cluster_tls_cert: str = ""
    cluster_tls_key: str = ""
    cluster_tls_ca: str = ""
    # TLS on the core's own wire and admin ports (for frontends, clients, probes): a PEM
    # certificate (chain) and its key; both or neither. With them both ports speak TLS only
    core_tls_cert: str = ""
    core_tls_key: str = ""
    peer_wire_port: int = 7423
    peer_admin_port: int = 7424
    # the replicated log of each shard (docs/cluster.md): seconds between a leader's purges,
    # entries a purge always keeps, entries past which a purge cuts even past a node that
    # has not applied them (0: never)
    log_purge_every: float = 30.0
    log_keep_entries: int = 10_000
    log_max_entries: int = 1_000_000
    # the most bytes of log entries a purge keeps as its last ``log_keep_entries`` (fewer
    # entries when they are large: a publisher's whole window of 1 KB messages is ~1.5 MB)
    log_keep_bytes: int = 64 * 1024 * 1024
    # the nats-server child's Go memory limit (its GOMEMLIMIT, bytes; 0: none, Go's own
    # default): JetStream's file store caches the blocks it writes and reads, and keeps
    # them, weakly held, until the Go heap's next collection (docs/cluster.md, "Memory")
    nats_memory_limit: int = 512 * 1024 * 1024
    # peers from Kubernetes (docs/cluster.md): the core's headless Service, whose
    # EndpointSlices are watched (empty: not on Kubernetes); its namespace (empty: this
    # pod's own); a kubeconfig file for running outside the cluster (empty: in-cluster)
    k8s_service: str = ""
    k8s_namespace: str = ""
    kubeconfig: str = ""
    # what a planned stop does to this node's place in the shards' replicas (docs/cluster.md,
    # "Stopping a node"): "stay" (a restart: it comes back to them), "remove" (scaled down
    # for good: the streams go on without it) or "auto" (on Kubernetes, remove when its
    # StatefulSet was scaled below this pod; else stay)
    leave: str = "auto"

    def check(self) -> None:
        if not 1 <= self.shards <= 1024:
            raise ConfigError("POLYMQ_SHARDS must be 1..1024")
        for name in ("core_port", "admin_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"POLYMQ_{name.upper()} must be 0..65535 (0 picks a free port)")
        if not 0 < self.batch_window <= 7 * 86400:
            raise ConfigError("POLYMQ_BATCH_WINDOW must be 0 < seconds <= 604800 (a week)")
        if not 0.1 <= self.overview_interval <= 60:
            raise ConfigError("POLYMQ_OVERVIEW_INTERVAL must be 0.1..60 seconds")
        if self.max_body > self.max_frame:
            raise ConfigError("POLYMQ_MAX_BODY cannot exceed POLYMQ_MAX_FRAME")
        if not 1024 <= self.max_login_frame <= self.max_frame:
            raise ConfigError("POLYMQ_MAX_LOGIN_FRAME must be 1024 bytes .. POLYMQ_MAX_FRAME")
        if not 0.1 <= self.handshake_timeout <= 3600:
            raise ConfigError("POLYMQ_HANDSHAKE_TIMEOUT must be 0.1..3600 seconds")
        if not 0 < self.memory_high_watermark <= 2**50:
            raise ConfigError(
                "POLYMQ_MEMORY_HIGH_WATERMARK must be a fraction of the memory (0 < f <= 1) "
                "or a number of bytes"
            )
        if not 0 <= self.memory_headroom < 1:
            raise ConfigError(
                "POLYMQ_MEMORY_HEADROOM must be a fraction of the memory high watermark "
                "(0 <= f < 1): the memory alarm rises at 1 - f of it"
            )
        if not 0 < self.memory_low_watermark <= 1 - self.memory_headroom:
            raise ConfigError(
                "POLYMQ_MEMORY_LOW_WATERMARK must be a fraction of the memory high watermark "
                f"(0 < f <= 1 - POLYMQ_MEMORY_HEADROOM = {1 - self.memory_headroom:g}): the "
                "memory alarm clears under it"
            )
        if not 0 <= self.disk_free_limit <= 2**60:
            raise ConfigError("POLYMQ_DISK_FREE_LIMIT must be a number of bytes (0: none)")
        if not 0 <= self.queue_window_messages <= 100_000_000:
            raise ConfigError("POLYMQ_QUEUE_WINDOW_MESSAGES must be 0 (no paging) .. 100000000")
        if not 1024 <= self.queue_window_bytes <= 2**40:
            raise ConfigError("POLYMQ_QUEUE_WINDOW_BYTES must be 1024 .. 2**40 bytes")
        if not 1 <= self.metrics_max_destinations <= 1_000_000:
            raise ConfigError("POLYMQ_METRICS_MAX_DESTINATIONS must be 1..1000000")
        for name in ("max_connections", "max_connections_per_user"):
            if not 0 <= getattr(self, name) <= 10_000_000:
                raise ConfigError(f"POLYMQ_{name.upper()} must be 0 (no limit) .. 10000000")
        if self.clustered:
            if not 1 <= self.cluster_port <= 65535:
                raise ConfigError("POLYMQ_CLUSTER_PORT must be 1..65535 (the peers know it)")
            if not _NODE_ID.fullmatch(self.node):
                raise ConfigError(
                    f"node id {self.node!r}: use 1..64 letters, digits, '-' and '_' "
                    "(it names the node's NATS server too); set --node-id"
                )
            self.peer_addresses()  # a ConfigError if unparsable
            if not 0 < self.log_purge_every <= 86400:
                raise ConfigError("POLYMQ_LOG_PURGE_EVERY must be 0 < seconds <= 86400 (a day)")
            if self.log_keep_entries < 0:
                raise ConfigError("POLYMQ_LOG_KEEP_ENTRIES must be 0 or more")
            if self.log_keep_bytes < 0:
                raise ConfigError("POLYMQ_LOG_KEEP_BYTES must be 0 or more")
            if self.nats_memory_limit != 0 and self.nats_memory_limit < _NATS_MEMORY_LEAST:
                raise ConfigError(
                    "POLYMQ_NATS_MEMORY_LIMIT must be 0 (no limit) or at least "
                    f"{_NATS_MEMORY_LEAST} bytes (64 MiB): bytes, not MiB"
                )
            if self.log_max_entries and self.log_max_entries < max(self.log_keep_entries, 1):
                raise ConfigError(
                    "POLYMQ_LOG_MAX_ENTRIES must be 0 (never cut) or at least "
                    "POLYMQ_LOG_KEEP_ENTRIES"
                )
            if self.leave not in ("auto", "stay", "remove"):
                raise ConfigError(
                    f"POLYMQ_LEAVE={self.leave!r}: 'auto' (default), 'stay' or 'remove'"
                )
            self._check_secret()
            self._check_cluster_tls()
            self._check_not_single_store()
            if self.core_tls and not self.cluster_tls:
                raise ConfigError(
                    "TLS on the core's wire and admin ports (POLYMQ_CORE_TLS_CERT) in a "
                    "cluster needs cluster TLS too (--cluster-tls-cert/-key/-ca): the nodes "
                    "reach each other on the peers' TLS listeners, not on those ports"
                )
        self._check_core_tls()

    def _check_not_single_store(self) -> None:
        """A replicated core does not take over a single node's store (``polymq run``
        without ``--peers`` on the same data dir, or the chart's ``core.replicaCount`` 1 -> 3
        on pod 0's volume): what it holds is in no log, so the other nodes would never have
        it, and the first entry of the log would be applied over it. A shard file that
        holds something and no applied log sequence is such a store."""
        for path in sorted(self.data_dir.glob("shard-*.db")):
            if _single_node_store(path):
                raise ConfigError(
                    f"{path} holds the store of a single node (polymq run without --peers):"
                    " a replicated core does not take it over (what it holds is in no log,"
                    " the other nodes would never have it). Drain it as a single node first,"
                    " then start the replicated core on another data dir (the chart: a fresh"
                    " volume for pod 0); see docs/cluster.md, 'Not yet'"
                )

    def _check_secret(self) -> None:
        """Cluster mode needs the cluster secret (the nodes' logins at each other, at NATS
        and on the admin API), or the explicit development switch."""
        if self.cluster_secret and len(self.cluster_secret) < 32:
            raise ConfigError(
                "POLYMQ_CLUSTER_SECRET needs at least 32 characters (e.g. `openssl rand "
                "-hex 16`), the same on every node"
            )
        if not self.cluster_secret and not self.insecure_dev_secret:
            raise ConfigError(
                "a replicated core (--peers or POLYMQ_K8S_SERVICE) needs a cluster secret: "
                "set POLYMQ_CLUSTER_SECRET to the same random value on every node (at least "
                "32 characters, e.g. `openssl rand -hex 16`). For a development cluster "
                "only, --insecure-dev-secret (POLYMQ_INSECURE_DEV_SECRET=1) runs on a "
                "public secret that lets anyone who reaches a node's ports in as a peer "
                "and an administrator"
            )

    def _check_core_tls(self) -> None:
        """The core's own TLS files: both or neither, each readable (what is in them is
        checked when the listeners' context is made)."""
        if bool(self.core_tls_cert) != bool(self.core_tls_key):
            raise ConfigError(
                "TLS on the core's ports needs both POLYMQ_CORE_TLS_CERT and "
                "POLYMQ_CORE_TLS_KEY (--core-tls-cert/--core-tls-key)"
            )
        for name in ("core_tls_cert", "core_tls_key"):
            path = getattr(self, name)
            if path:
                check_readable(f"POLYMQ_{name.upper()}", path)

    def _check_cluster_tls(self) -> None:
        """The cluster TLS files: all three or none, each readable (what is in them is
        :mod:`polymq_core.cluster.tls`'s to judge, at start-up). Out of cluster mode there
        is no traffic between nodes, and they are not used."""
        files = {f"POLYMQ_{name.upper()}": getattr(self, name) for name in _CLUSTER_TLS}
        given = [var for var, path in files.items() if path]
        if not given:
            return
        if len(given) != len(files):
            missing = ", ".join(var for var in files if var not in given)
            raise ConfigError(
                "cluster TLS needs a certificate, its key and the CA that signed every "
                "node's certificate (POLYMQ_CLUSTER_TLS_CERT, _KEY and _CA, or "
                f"--cluster-tls-cert/-key/-ca): {missing} missing"
            )
        for var, path in files.items():
            check_readable(var, path)
        for name in ("peer_wire_port", "peer_admin_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"POLYMQ_{name.upper()} must be 0..65535 (0 picks a free port)")

    @property
    def cluster_tls(self) -> bool:
        """Whether the nodes talk TLS to each other (a cluster, all three files given)."""
        return self.clustered and all(getattr(self, name) for name in _CLUSTER_TLS)

    @property
    def core_tls(self) -> bool:
        """Whether the core's wire and admin ports speak TLS (only)."""
        return bool(self.core_tls_cert and self.core_tls_key)

    @property
    def secret(self) -> str:
        """The cluster secret the nodes log in with: ``cluster_secret``, else (allowed by
        :meth:`check` only with ``insecure_dev_secret``) the public :data:`DEV_SECRET`."""
        return self.cluster_secret or DEV_SECRET

    @property
    def clustered(self) -> bool:
        """Cluster mode: peers from ``--peers``, from the Kubernetes Service, or both."""
        return bool(self.peers.strip() or self.k8s_service.strip())

    @property
    def node(self) -> str:
        """This node's id: ``node_id``, else ``node_name``."""
        return self.node_id or self.node_name

    def peer_addresses(self) -> tuple[tuple[str, int], ...]:
        return parse_peers(self.peers)

    def limits(self) -> dict[str, Any]:
        return {
            "max_frame": self.max_frame,
            "max_body": self.max_body,
            "max_pull": self.max_pull,
            "max_wait": self.max_wait,
        }


def _split_peer(item: str, what: str) -> tuple[str, int]:
    if item.startswith("["):
        addr, sep, rest = item[1:].partition("]")
        if not sep or not addr:
            raise ConfigError(f"{what}: {item!r} is not [IPV6-ADDRESS]:PORT")
        if not rest.startswith(":"):
            raise ConfigError(f"{what}: {item!r} has no port (expected [IPV6-ADDRESS]:PORT)")
        host, port_text = addr, rest[1:]
    else:
        host, sep, port_text = item.rpartition(":")
        if not sep:
            raise ConfigError(f"{what}: {item!r} has no port (expected HOST:PORT)")
        if not host:
            raise ConfigError(f"{what}: {item!r} has an empty host (expected HOST:PORT)")
        if ":" in host:
            raise ConfigError(
                f"{what}: {item!r} looks like an IPv6 address: write it as [ADDRESS]:PORT"
            )
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{what}: {item!r} has port {port_text!r}; a port is 1..65535")
    if any(c.isspace() for c in host):
        raise ConfigError(f"{what}: {item!r} has a space in its host")
    return host, int(port_text)


def parse_peers(text: str) -> tuple[tuple[str, int], ...]:
    """``"h:p,h:p"`` -> ``(("h", p), ...)``. Spaces around items are stripped, empty items
    ignored; an IPv6 address is written ``[addr]:port`` and comes back without brackets.
    ``ConfigError`` says what is wrong with the first bad item."""
    what = "--peers (POLYMQ_PEERS)"
    out = []
    for raw in text.split(","):
        item = raw.strip()
        if item:
            out.append(_split_peer(item, what))
    return tuple(out)


_HELD = ("messages", "destinations", "bindings", "kv", "sequences")  # what a store holds


def _single_node_store(path: Path) -> bool:
    """``path`` is a shard's SQLite store written by a single node: it holds something
    (messages, destinations, ...) and no applied log sequence (every change of a replicated
    core's store comes from its log and records the sequence). Unreadable or not SQLite:
    no (the store's own open says why)."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        held = [t for t in _HELD if t in tables]
        if not any(conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() for t in held):
            return False
        if "replication" not in tables:
            return True
        return conn.execute("SELECT 1 FROM replication LIMIT 1").fetchone() is None
    except sqlite3.Error:
        return False
    finally:
        conn.close()
