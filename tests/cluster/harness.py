"""A replicated polymq on 127.0.0.1 for the cluster tests: ``Cluster(root, n=3)`` starts
``n`` ``polymq run --peers ...`` processes at the same moment (each with its own nats-server
child, or with ``nats_apart`` a ``polymq nats`` process beside it and ``--nats``, as the
chart's sidecar), waits until they form one cluster, and kills, freezes, thaws and restarts
nodes the way a crash, a hung machine or an operator would. Small clients for the frontends
(STOMP with stomp.py, AMQP with pika, the HTTP JSON API with requests) come with it.

Every port is chosen here, outside the kernel's ephemeral range and checked free, and passed
explicitly, so a node restarts on the ports it had (its peers know its cluster port, its
clients its listeners). Node ids carry a per-cluster random suffix; other runs (and a NATS on
:4222) may share the machine.

Nothing is left running: :meth:`Cluster.stop_all` (SIGCONT, SIGTERM, then SIGKILL for
stragglers) runs in the fixtures' ``finally``, and an ``atexit`` hook kills what any cluster
still has, should the test process be interrupted.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pika
import psutil
import requests
import stomp
from stomp.utils import Frame as StompFrame

from ..procs import PolymqProcess, freeze

T = TypeVar("T")

SHARDS = 4  # the default shard count of `polymq run`
HTTP_TIMEOUT = 30.0  # seconds an HTTP request to a node may take (a commit may wait for a quorum)
START_TIMEOUT = 120.0  # seconds a node may take to write its ports file (it waits for JetStream)
PORT_NAMES = (
    "core",
    "admin",
    "http",
    "stomp",
    "stomp_ws",
    "longpoll",
    "avro",
    "amqp",
    "amqp_admin",
    "amqp_tls",
)
_PORT_RANGE = (15000, 32000)  # below Linux's ephemeral range (32768-60999): no client takes them
_taken: set[int] = set()
_ACTIVE: set[Cluster] = set()


def unique(prefix: str = "t") -> str:
    """A name no other test (or run) uses."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def shard_of(key: str, shards: int = SHARDS) -> int:
    """The shard of a destination key (``queue/orders``), as the core computes it."""
    return zlib.crc32(key.partition(">")[0].encode()) % shards


def queue_in_shard(shard: int, prefix: str = "q", shards: int = SHARDS, kind: str = "queue") -> str:
    """A fresh queue name whose destination ``queue/<name>`` (or ``<kind>/<name>``) falls in
    ``shard``."""
    while True:
        name = unique(prefix)
        if shard_of(f"{kind}/{name}", shards) == shard:
            return name


def eventually(check: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy (returned); AssertionError naming
    ``what`` (and the last value) once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s (last: {value!r})")
        time.sleep(interval)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free on 127.0.0.1 now (none handed out before)."""
    out: list[int] = []
    while len(out) < n:
        port = random.randrange(*_PORT_RANGE)
        if port in _taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _taken.add(port)
        out.append(port)
    return out


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---- one node ----------------------------------------------------------------------------------
class Node:
    """One ``polymq run`` of the cluster. ``state``: ``new``, ``running``, ``frozen``
    (SIGSTOP), ``killed`` (SIGKILL) or ``stopped`` (SIGTERM)."""

    def __init__(
        self,
        cluster: Cluster,
        index: int,
        node_id: str,
        cluster_port: int,
        ports: dict[str, int],
    ) -> None:
        self.cluster = cluster
        self.index = index  # 1-based: node 1, 2, 3
        self.id = node_id
        self.workdir = cluster.root / node_id
        self.cluster_port = cluster_port
        self.ports = dict(ports)
        self.proc: PolymqProcess | None = None
        self.nats_port = 0  # with cluster.nats_apart: the client port of its `polymq nats`
        self.nats_proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []
        self._procs: list[psutil.Process] = []
        self.state = "new"

    def __repr__(self) -> str:
        return f"<node {self.index} {self.id} {self.state}>"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "run.log"

    def args(self) -> list[str]:
        out = ["--node-id", self.id, *self.peers_args(), "--cluster-port", str(self.cluster_port)]
        for name, port in self.ports.items():
            out += [f"--{name.replace('_', '-')}-port", str(port)]
        if self.nats_port:
            out += ["--nats", f"nats://127.0.0.1:{self.nats_port}"]
        return out

    def peers_args(self) -> list[str]:
        """``--peers`` and its value, or nothing for a node given none (it finds its peers
        in Kubernetes' endpoints)."""
        peers = self.cluster.peers_of(self)
        return ["--peers", peers] if peers else []

    def start_nats(self, timeout: float = 20.0) -> None:
        """``polymq nats`` with this node's settings (its log: nats.log), as the chart's
        sidecar runs it; returns once its client port accepts."""
        argv = [
            sys.executable, "-m", "polymq_cli", "nats",
            "--node-id", self.id,
            *self.peers_args(),
            "--cluster-port", str(self.cluster_port),
            "--client-port", str(self.nats_port),
            "--data-dir", str(self.data_dir),
        ]  # fmt: skip
        with open(self.workdir / "nats.log", "ab") as log:
            self.nats_proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.cluster.env}
            )
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", self.nats_port))
                return
            code = self.nats_proc.poll()
            assert code is None, f"{self.id}: polymq nats exited {code}:\n{self.nats_log()}"
            assert time.monotonic() < deadline, f"{self.id}: polymq nats not up:\n{self.nats_log()}"
            time.sleep(0.05)

    def nats_log(self) -> str:
        path = self.workdir / "nats.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def _stop_nats(self, timeout: float = 10.0) -> list[str]:
        """SIGTERM the ``polymq nats`` process (after polymq stopped, as Kubernetes stops a
        sidecar after the main container); what went wrong."""
        proc = self.nats_proc
        if proc is None or proc.poll() is not None:
            return []
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return [f"{self.id}: its nats-server did not stop within {timeout:g}s of SIGTERM"]
        return []

    # life cycle
    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start and wait for the ports file (the node listens); ``pids`` from it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"\n==== harness: starting {self.id} at {time.strftime('%H:%M:%S')} ====\n")
        if self.nats_port:
            self.start_nats()
        self.proc = PolymqProcess("run", self.workdir, *self.args(), env=self.cluster.env)
        written = self.proc.start(timeout).ports
        told = json.loads((self.workdir / "run-ports.json").read_text())
        pids = told.get("pids")
        assert isinstance(pids, list) and pids, f"{self.id}: no pids in the ports file {told}"
        self.pids = [int(p) for p in pids]
        if self.nats_proc is not None:
            self.pids.append(self.nats_proc.pid)
        self._procs = []
        for pid in self.pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._procs.append(psutil.Process(pid))
        for name in self.ports:
            if name in written:
                assert written[name] == self.ports[name], (name, written, self.ports)
        self.state = "running"

    def _signal(self, sig: int) -> None:
        for p in self._procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)

    def alive_pids(self) -> list[int]:
        return [p.pid for p in self._procs if not _gone(p)]

    def kill(self) -> None:
        """SIGKILL to polymq and its nats-server: a crash."""
        self._signal(signal.SIGKILL)
        self._reap(10.0)
        left = self.alive_pids()
        assert not left, f"{self.id}: pids {left} survived SIGKILL"
        self.state = "killed"

    def freeze(self) -> None:
        """SIGSTOP to polymq and its nats-server: a hung machine (sockets stay open)."""
        freeze(*(p.pid for p in self._procs), within=5.0)  # (every thread of each)
        self.state = "frozen"

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)
        self.state = "running"

    def stop(self, timeout: float = 20.0) -> list[str]:
        """SIGCONT, SIGTERM to polymq, wait; SIGKILL whatever is left. What went wrong: a
        non-zero exit, a polymq that had to be killed, a nats-server that outlived it."""
        problems: list[str] = []
        if self.proc is None or self.proc.proc is None:
            return problems
        self._signal(signal.SIGCONT)
        popen = self.proc.proc
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                rc = popen.wait(timeout)
                if rc != 0 and self.state == "running":
                    problems.append(f"{self.id}: polymq exited {rc} on SIGTERM")
            except subprocess.TimeoutExpired:
                problems.append(f"{self.id}: polymq did not stop within {timeout:g}s of SIGTERM")
        problems += self._stop_nats()
        self._signal(signal.SIGCONT)
        deadline = time.monotonic() + 10.0
        while self.alive_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self.alive_pids()
        if left and self.state in ("running", "frozen"):
            problems.append(f"{self.id}: pids {left} outlived polymq's SIGTERM (killed now)")
        self._signal(signal.SIGKILL)
        self._reap(10.0)
        self.state = "stopped" if self.state in ("running", "frozen") else self.state
        return problems

    def _reap(self, timeout: float) -> None:
        if self.proc is not None and self.proc.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while self.alive_pids() and time.monotonic() < deadline:
            time.sleep(0.02)

    def hard_kill(self) -> None:
        """Whatever the state: SIGKILL everything (for teardown and atexit)."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        for popen in (self.proc.proc if self.proc is not None else None, self.nats_proc):
            if popen is not None:
                with contextlib.suppress(Exception):
                    popen.kill()
                    popen.wait(5)

    # reading it
    def url(self, name: str = "http") -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    @property
    def admin(self) -> str:
        return self.url("admin")

    def cluster_info(self, timeout: float = 3.0) -> dict[str, Any] | None:
        """``GET /api/cluster``, or None if the node does not answer (with 200)."""
        try:
            r = requests.get(f"{self.admin}/api/cluster", timeout=timeout)
        except requests.RequestException:
            return None
        if r.status_code != 200:
            return None
        out: dict[str, Any] = r.json()
        return out

    def readyz(self, timeout: float = 3.0) -> int | None:
        try:
            return requests.get(f"{self.admin}/readyz", timeout=timeout).status_code
        except requests.RequestException:
            return None

    def applied(self) -> dict[int, int] | None:
        info = self.cluster_info()
        if info is None:
            return None
        return {int(s["shard"]): int(s["applied"]) for s in info["shards"]}

    def leads(self) -> set[int] | None:
        """The shards this node says it leads (``leading``), or None if it does not answer."""
        info = self.cluster_info()
        if info is None:
            return None
        return {int(s["shard"]) for s in info["shards"] if s.get("leading")}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


# ---- the cluster -------------------------------------------------------------------------------
class Cluster:
    """``n`` nodes under ``root`` (one workdir each, named by node id)."""

    def __init__(
        self,
        root: Path,
        n: int = 3,
        *,
        env: dict[str, str] | None = None,
        seeds: dict[int, list[int]] | None = None,
        nats_apart: bool = False,
        before_start: Callable[[Cluster], None] | None = None,
    ) -> None:
        self.root = root
        self.n = n
        self.nats_apart = nats_apart  # each node's NATS a `polymq nats` of its own
        # node index -> the only other nodes its --peers names (none: no --peers at all)
        self.seeds = seeds or {}
        # called before each attempt to start (the nodes' ids and ports are fresh at each)
        self.before_start = before_start
        self.secret = secrets.token_hex(16)
        self.env = {"POLYMQ_CLUSTER_SECRET": self.secret, **(env or {})}
        self.shards = SHARDS
        self.started_at = 0.0  # time.monotonic() when the nodes were spawned
        self.formed_after: float | None = None  # seconds from spawn to the first wait_formed
        self._make_nodes()
        _ACTIVE.add(self)

    def _make_nodes(self) -> None:
        """Fresh node ids (so fresh workdirs) and fresh ports."""
        self.run_id = uuid.uuid4().hex[:6]
        ports = free_ports(self.n * (1 + len(PORT_NAMES) + self.nats_apart))
        cluster_ports, ports = ports[: self.n], ports[self.n :]
        nats_ports = [0] * self.n
        if self.nats_apart:
            nats_ports, ports = ports[: self.n], ports[self.n :]
        self.peers = ",".join(f"127.0.0.1:{p}" for p in cluster_ports)
        self.nodes: list[Node] = []
        for i in range(self.n):
            mine = ports[i * len(PORT_NAMES) : (i + 1) * len(PORT_NAMES)]
            self.nodes.append(
                Node(self, i + 1, f"n{i + 1}-{self.run_id}", cluster_ports[i],
                     dict(zip(PORT_NAMES, mine, strict=True)))
            )  # fmt: skip
            self.nodes[-1].nats_port = nats_ports[i]

    def __repr__(self) -> str:
        return f"<cluster {self.run_id} {self.nodes}>"

    def peers_of(self, node: Node) -> str:
        """``--peers`` of ``node``: every node, or its seeds and itself, or "" (none)."""
        seeds = self.seeds.get(node.index)
        if seeds is None:
            return self.peers
        if not seeds:
            return ""
        named = [self.nodes[i - 1] for i in seeds] + [node]
        return ",".join(f"127.0.0.1:{n.cluster_port}" for n in named)

    # starting
    def start(self, timeout: float = START_TIMEOUT, tries: int = 3) -> Cluster:
        """Spawn every node at the same moment; return once all wrote their ports files.
        A node listens only once its cluster's JetStream answers, seconds after the ports
        were found free: if another process took one meanwhile ("address already in use"),
        the nodes are killed and the cluster starts over on fresh ports and node ids."""
        for attempt in range(tries):
            if self.before_start is not None:
                self.before_start(self)
            self.started_at = time.monotonic()
            try:
                self.start_nodes(self.nodes, timeout)
                return self
            except AssertionError as exc:
                if "address already in use" not in str(exc) or attempt == tries - 1:
                    raise
                print(f"cluster {self.run_id}: a port was taken meanwhile, starting over")
                for node in self.nodes:
                    node.hard_kill()
                self._make_nodes()
        raise AssertionError("unreachable")

    def start_nodes(self, nodes: list[Node], timeout: float = START_TIMEOUT) -> None:
        """Start ``nodes`` concurrently (a node may wait for the others' JetStream before it
        listens); AssertionError with every failing node's log if one does not come up."""
        errors: dict[str, BaseException] = {}

        def start(node: Node) -> None:
            try:
                node.start(timeout)
            except BaseException as exc:
                errors[node.id] = exc

        threads = [threading.Thread(target=start, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30)
        if errors:
            detail = "\n".join(f"--- {nid}: {exc}" for nid, exc in errors.items())
            raise AssertionError(f"nodes did not start:\n{detail}\n{self.diagnose()}")

    def restart(self, node: Node, wipe: bool = False, timeout: float = START_TIMEOUT) -> None:
        """Start ``node`` again with the same id and ports (killed first if it runs); with
        ``wipe``, its data dir (SQLite and JetStream store) is removed first."""
        if node.state in ("running", "frozen"):
            node.kill()
        if wipe:
            shutil.rmtree(node.data_dir, ignore_errors=True)
            assert not node.data_dir.exists()
        self.start_nodes([node], timeout)

    def stop(self, node: Node) -> None:
        """SIGTERM ``node`` (a graceful stop: it hands the streams it leads to the others);
        AssertionError if it does not exit 0 in time or leaves its nats-server behind."""
        problems = node.stop()
        assert not problems, "; ".join(problems) + "\n" + node.log_tail()

    def wait_balanced(self, timeout: float = 90.0) -> dict[int, Node]:
        """The leaders once no node leads more than its share (shards over nodes, rounded
        up): until then the balancer moves one shard every 10 s, and a move sends the
        unacknowledged deliveries of that shard again, flagged redelivered."""
        deadline = time.monotonic() + timeout
        while True:
            leaders = self.wait_formed(timeout=60)
            share = -(-len(leaders) // len(self.nodes))
            counts = collections.Counter(n.id for n in leaders.values())
            if max(counts.values()) <= share or time.monotonic() > deadline:
                return leaders
            time.sleep(1.0)

    def spread_leaders(self, among: list[Node], attempts: int = 4) -> dict[int, Node]:
        """Try to have each node of ``among`` lead a shard (JetStream places stream leaders
        as it likes: one of three nodes may lead none of four shards). While one leads none,
        the node leading the most is killed (-9: each of its streams holds an election of its
        own; a graceful stop was seen to hand them all to one node) and started again, up to
        ``attempts`` times. The killed node comes back leading nothing, so ``among`` should
        not be every node. The leaders then."""
        wanted = among
        leaders = self.wait_formed(timeout=60)
        for _ in range(attempts):
            counts = collections.Counter(n.id for n in leaders.values())
            if all(counts[n.id] for n in wanted):
                break
            busiest = self.node_by_id(counts.most_common(1)[0][0])
            self.kill(busiest)
            self.wait_formed(timeout=60, nodes=self.others(busiest))
            self.restart(busiest)
            leaders = self.wait_formed(timeout=60)
        return leaders

    # faults
    def kill(self, node: Node) -> None:
        node.kill()

    def kill_all(self) -> None:
        """SIGKILL every pid of every node in one sweep (a power cut), then reap."""
        for node in self.nodes:
            node._signal(signal.SIGKILL)
        for node in self.nodes:
            if node.state in ("running", "frozen"):
                node.kill()

    def freeze(self, node: Node) -> None:
        node.freeze()

    def thaw(self, node: Node) -> None:
        node.thaw()

    def stop_all(self) -> list[str]:
        """Stop every node (SIGCONT, SIGTERM, SIGKILL for stragglers), make sure no pid of
        any node survives; what went wrong on the way (see :meth:`Node.stop`)."""
        problems: list[str] = []
        try:
            for node in self.nodes:
                node._signal(signal.SIGCONT)
            threads = []
            results: dict[str, list[str]] = {}

            def stop(node: Node) -> None:
                results[node.id] = node.stop()

            for node in self.nodes:
                t = threading.Thread(target=stop, args=(node,), daemon=True)
                t.start()
                threads.append(t)
            for t in threads:
                t.join(60)
            for node in self.nodes:
                problems += results.get(node.id, [f"{node.id}: stop did not finish"])
        finally:
            for node in self.nodes:
                node.hard_kill()
            for node in self.nodes:
                deadline = time.monotonic() + 10
                while node.alive_pids() and time.monotonic() < deadline:
                    time.sleep(0.05)
                if node.alive_pids():
                    problems.append(f"{node.id}: pids {node.alive_pids()} survive even SIGKILL")
            _ACTIVE.discard(self)
        return problems

    # reading it
    def running(self) -> list[Node]:
        return [n for n in self.nodes if n.state == "running"]

    def node_by_id(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(f"no node {node_id!r} in {self}")

    def others(self, *nodes: Node) -> list[Node]:
        return [n for n in self.nodes if n not in nodes]

    def _consensus(self, members: list[Node], *, ready: bool) -> tuple[dict[int, Node] | None, str]:
        """Every member answers, lists every member (``ready`` ones: in state ready), and all
        agree on one leader per shard, a member that says it leads it; with ``ready``, every
        member's /readyz is 200 too. The leaders, or None and why not."""
        ids = {n.id for n in members}
        agreed: dict[int, str] | None = None
        infos: dict[str, dict[str, Any]] = {}
        for node in members:
            info = node.cluster_info()
            if info is None:
                return None, f"{node.id}: /api/cluster does not answer"
            infos[node.id] = info
            listed = {m["id"]: m.get("state") for m in info.get("nodes", [])}
            missing = ids - set(listed)
            if missing:
                return None, f"{node.id} does not list {sorted(missing)} (lists {listed})"
            if ready:
                unready = {i: listed[i] for i in ids if listed[i] != "ready"}
                if unready:
                    return None, f"{node.id} shows {unready}"
            leaders = {int(s["shard"]): s.get("leader") for s in info["shards"]}
            if len(leaders) != self.shards:
                return None, f"{node.id} shows {len(leaders)} shards, expected {self.shards}"
            for shard, leader in leaders.items():
                if leader not in ids:
                    return None, f"{node.id}: shard {shard} leader {leader!r} is not a member"
            if agreed is None:
                agreed = leaders
            elif leaders != agreed:
                return None, f"leaders disagree: {agreed} vs {node.id}'s {leaders}"
        assert agreed is not None
        for shard, leader in agreed.items():
            mine = {int(s["shard"]): s.get("leading") for s in infos[leader]["shards"]}
            if not mine.get(shard):
                return None, f"{leader} is named leader of shard {shard} but not leading it"
        if ready:
            for node in members:
                status = node.readyz()
                if status != 200:
                    return None, f"{node.id}: /readyz {status}"
        return {s: self.node_by_id(nid) for s, nid in agreed.items()}, "ok"

    def wait_formed(
        self, timeout: float = 30.0, nodes: list[Node] | None = None
    ) -> dict[int, Node]:
        """Wait until the running nodes (or ``nodes``) form one cluster: each lists all of
        them as ready, all agree on a leader for every shard (one of them, leading it), and
        each /readyz is 200. The leaders by shard."""
        members = nodes if nodes is not None else self.running()
        deadline = time.monotonic() + timeout
        while True:
            leaders, why = self._consensus(members, ready=True)
            if leaders is not None:
                if self.formed_after is None and self.started_at:
                    self.formed_after = time.monotonic() - self.started_at
                return leaders
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the cluster did not form within {timeout:g}s: {why}\n{self.diagnose()}"
                )
            time.sleep(0.25)

    def leaders(self, timeout: float = 30.0, nodes: list[Node] | None = None) -> dict[int, Node]:
        """The leader of every shard, once the running nodes (or ``nodes``) agree on them."""
        members = nodes if nodes is not None else self.running()
        deadline = time.monotonic() + timeout
        while True:
            leaders, why = self._consensus(members, ready=False)
            if leaders is not None:
                return leaders
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no agreed leaders within {timeout:g}s: {why}\n{self.diagnose()}"
                )
            time.sleep(0.25)

    def leader_of(self, shard: int, timeout: float = 30.0) -> Node:
        return self.leaders(timeout)[shard]

    def queue_in_shard(self, shard: int, prefix: str = "q", kind: str = "queue") -> str:
        return queue_in_shard(shard, prefix, self.shards, kind)

    def diagnose(self, lines: int = 25) -> str:
        """Each node's state, cluster view, /readyz and the tail of its log."""
        out = []
        for node in self.nodes:
            out.append(f"===== {node!r} pids={node.pids} alive={node.alive_pids()}")
            if node.state == "running":
                out.append(f"  readyz: {node.readyz(1.0)}  cluster: {node.cluster_info(1.0)}")
            out.append(node.log_tail(lines))
        return "\n".join(out)


def started_cluster(cluster: Cluster) -> Cluster:
    """``cluster`` started and formed; every process stopped again if it does not form."""
    try:
        cluster.start()
        cluster.wait_formed(timeout=60)
    except BaseException:
        cluster.stop_all()
        raise
    return cluster


@contextlib.contextmanager
def running_cluster(root: Path, n: int = 3, **kw: Any) -> Iterator[Cluster]:
    """A started, formed cluster; stopped (and checked: no process left) afterwards, however
    the tests ended."""
    cluster = started_cluster(Cluster(root, n, **kw))
    try:
        yield cluster
    except BaseException:
        cluster.stop_all()
        raise
    problems = cluster.stop_all()
    assert not problems, "stopping the cluster: " + "; ".join(problems)


@contextlib.contextmanager
def outsider(
    cluster: Cluster, root: Path, env: dict[str, str], node_id: str = "intruder"
) -> Iterator[Path]:
    """A node that names ``cluster``'s nodes as its peers but runs with ``env`` over this
    process's environment, not the cluster's (another secret, another certificate), every
    listener on a free port. Not waited for: it may never join. Yields its log's path; it
    is killed on the way out."""
    [cluster_port] = free_ports(1)
    args = [sys.executable, "-m", "polymq_cli", "run", "--workers", "1", "--node-id", node_id]
    args += ["--peers", f"{cluster.peers},127.0.0.1:{cluster_port}"]
    args += ["--cluster-port", str(cluster_port), "--data-dir", str(root / f"{node_id}-data")]
    for name in PORT_NAMES:
        args += [f"--{name.replace('_', '-')}-port", "0"]
    log_path = root / f"{node_id}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    try:
        yield log_path
    finally:
        proc.kill()
        proc.wait(10)


def assert_nobody_lists(cluster: Cluster, node_id: str) -> None:
    """No node of ``cluster`` lists ``node_id`` (an outsider it refused)."""
    for node in cluster.nodes:
        info = node.cluster_info()
        assert info is not None, f"{node.id}: /api/cluster does not answer"
        listed = {m["id"] for m in info["nodes"]}
        assert node_id not in listed, f"{node.id} lists {node_id}: {listed}"


@atexit.register
def _kill_everything() -> None:
    for cluster in list(_ACTIVE):
        for node in cluster.nodes:
            node.hard_kill()


def active_clusters() -> list[Cluster]:
    return list(_ACTIVE)


# ---- HTTP JSON API -----------------------------------------------------------------------------
def http_publish(
    node: Node,
    queue: str,
    body: str,
    *,
    kind: str = "queue",
    persistent: bool = True,
    timeout: float = HTTP_TIMEOUT,
    **fields: Any,
) -> requests.Response:
    """POST one message; the response, whatever its status."""
    payload = {"body": body, "persistent": persistent, **fields}
    return requests.post(f"{node.url()}/v1/{kind}/{queue}/messages", json=payload, timeout=timeout)


def http_publish_ok(node: Node, queue: str, body: str, **fields: Any) -> dict[str, Any]:
    r = http_publish(node, queue, body, **fields)
    assert r.status_code == 200, f"publish {body!r} via {node.id}: {r.status_code} {r.text}"
    out: dict[str, Any] = r.json()
    return out


def http_pull(
    node: Node,
    queue: str,
    n: int = 100,
    wait: float = 1.0,
    visibility: float = 30.0,
    retry_until: float = 0.0,
) -> list[dict[str, Any]]:
    """Pull up to ``n``; a 503 (the shard's leader moving: nothing was taken) is tried
    again after its Retry-After until the monotonic time ``retry_until``, as a client
    would."""
    while True:
        r = requests.post(
            f"{node.url()}/v1/queue/{queue}/pull",
            params={"max": n, "wait": wait, "visibility": visibility},
            timeout=HTTP_TIMEOUT + wait,
        )
        if r.status_code != 503 or time.monotonic() >= retry_until:
            break
        assert "Retry-After" in r.headers, r.headers
        time.sleep(min(float(r.headers["Retry-After"]), 1.0))
    assert r.status_code == 200, f"pull {queue} via {node.id}: {r.status_code} {r.text}"
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def http_ack(node: Node, receipts: list[str]) -> dict[str, Any]:
    r = requests.post(f"{node.url()}/v1/ack", json={"receipts": receipts}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, f"ack via {node.id}: {r.status_code} {r.text}"
    out: dict[str, Any] = r.json()
    return out


def http_stats(node: Node, queue: str) -> dict[str, Any]:
    r = requests.get(f"{node.url()}/v1/queue/{queue}", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, f"stats {queue} via {node.id}: {r.status_code} {r.text}"
    out: dict[str, Any] = r.json()
    return out


def drain(
    node: Node, queue: str, expect: int | None = None, timeout: float = 60.0, ack: bool = True
) -> list[dict[str, Any]]:
    """Pull (and ack) everything from ``queue`` through ``node``: until ``expect`` messages
    came and one more pull found nothing (so duplicates show), or, without ``expect``, until
    a pull finds nothing; or until ``timeout``. Everything pulled, in order."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = http_pull(node, queue, 100, wait=1.0, retry_until=deadline)
        if batch and ack:
            answer = http_ack(node, [m["receipt"] for m in batch])
            assert answer["settled"] == len(batch), answer
        got += batch
        if not batch and (expect is None or len(got) >= expect):
            break
    return got


# ---- STOMP (stomp.py) ----------------------------------------------------------------------------
class StompConn(stomp.ConnectionListener):  # type: ignore[misc]
    """A stomp.py 1.2 connection to one node's STOMP listener that keeps what comes (MESSAGE,
    RECEIPT, ERROR frames, a disconnect) and can wait for any of it with a deadline."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.conn = stomp.Connection12(
            [("127.0.0.1", node.ports["stomp"])],
            vhost="/",
            reconnect_attempts_max=1,
            heartbeats=(0, 0),
            timeout=10,
        )
        self.conn.set_listener("harness", self)
        self.messages: list[StompFrame] = []
        self.receipts: set[str] = set()
        self.errors: list[StompFrame] = []
        self.connected = False
        self.disconnected = False
        self._cond = threading.Condition()

    # the listener
    def _note(self, change: Callable[[], None]) -> None:
        with self._cond:
            change()
            self._cond.notify_all()

    def on_connected(self, frame: StompFrame) -> None:
        self._note(lambda: setattr(self, "connected", True))

    def on_message(self, frame: StompFrame) -> None:
        self._note(lambda: self.messages.append(frame))

    def on_receipt(self, frame: StompFrame) -> None:
        self._note(lambda: self.receipts.add(frame.headers["receipt-id"]))

    def on_error(self, frame: StompFrame) -> None:
        self._note(lambda: self.errors.append(frame))

    def on_disconnected(self) -> None:
        self._note(lambda: setattr(self, "disconnected", True))

    def wait(self, check: Callable[[], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(check, timeout)

    # the client
    def connect(self, timeout: float = 10.0) -> StompConn:
        self.conn.connect(wait=False)
        ok = self.wait(lambda: self.connected or self.disconnected or bool(self.errors), timeout)
        if not (ok and self.connected):
            self.close()
            raise ConnectionError(f"STOMP to {self.node.id}: no CONNECTED (errors: {self.errors})")
        return self

    def send(self, destination: str, body: str, **headers: str) -> str:
        """SEND with a receipt; the receipt id (see :meth:`outcome`)."""
        receipt = unique("r")
        self.conn.send(destination, body, headers={**headers, "receipt": receipt})
        return receipt

    def outcome(self, receipt: str, timeout: float) -> str:
        """``receipt``, ``error``, ``closed`` or ``timeout``: what came first for a SEND."""
        self.wait(
            lambda: receipt in self.receipts or bool(self.errors) or self.disconnected, timeout
        )
        with self._cond:
            if receipt in self.receipts:
                return "receipt"
            if self.errors:
                return "error"
            return "closed" if self.disconnected else "timeout"

    def send_ok(self, destination: str, body: str, timeout: float = 30.0, **headers: str) -> None:
        receipt = self.send(destination, body, **headers)
        got = self.outcome(receipt, timeout)
        assert got == "receipt", f"SEND {body!r} to {destination} via {self.node.id}: {got} " + (
            f"{self.errors[0].headers} {self.errors[0].body}" if self.errors else ""
        )

    def subscribe(self, destination: str, sid: str = "s", ack: str = "auto") -> None:
        receipt = unique("sub")
        self.conn.subscribe(destination, id=sid, ack=ack, headers={"receipt": receipt})
        got = self.outcome(receipt, 30.0)
        assert got == "receipt", f"SUBSCRIBE {destination} via {self.node.id}: {got} {self.errors}"

    def bodies(self) -> list[str]:
        with self._cond:
            return [m.body for m in self.messages]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.conn.is_connected():
                self.conn.disconnect()
        with contextlib.suppress(Exception):
            self.conn.transport.stop()


@contextlib.contextmanager
def stomp_conn(node: Node) -> Iterator[StompConn]:
    client = StompConn(node).connect()
    try:
        yield client
    finally:
        client.close()


# ---- AMQP (pika, aio-pika) ---------------------------------------------------------------------
def amqp_url(node: Node) -> str:
    return f"amqp://guest:guest@127.0.0.1:{node.ports['amqp']}/%2F"


def pika_connection(node: Node, **params: Any) -> pika.BlockingConnection:
    params.setdefault("socket_timeout", 10)
    params.setdefault("blocked_connection_timeout", 30)
    params.setdefault("heartbeat", 0)
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", node.ports["amqp"], **params)
    )


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m polymq_cli ARGS``: its exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "polymq_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "POLYMQ_LOG_LEVEL": "INFO"},
    )
