"""The three-node clusters the ``cluster`` scenario measures, on 127.0.0.1.

:class:`PolymqCluster`: ``n`` ``polymq run --node-id ... --peers ...`` processes (each with
its nats-server child, see docs/cluster.md), every port chosen here (checked free, outside the
kernel's ephemeral range) and passed explicitly, so a killed node restarts on the ports its
peers and clients know. The same ``POLYMQ_CLUSTER_SECRET`` on every node. It is *ready* when
every running node's ``GET /api/cluster`` says ``ready`` and all name the same leader, one of
them, for every shard. Its CPU is the sum over every node's pids (polymq and nats-server, as
the ports file lists them).

:class:`RabbitCluster`: ``n`` private RabbitMQ nodes (:class:`tests.rabbit.RabbitNode`: their
own node names ``bench-qq-<pid>-<i>@localhost``, AMQP and distribution ports, data, logs and
an empty plugin list under one temporary directory; the machine's RabbitMQ on :5672 is never
touched) sharing one Erlang cookie; nodes 2.. join node 1 with ``rabbitmqctl stop_app;
join_cluster; start_app``. Its CPU is the sum over the nodes' ``beam.smp`` processes.

Both are context managers that leave nothing running and remove their directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from .harness import BenchError, _pin_process, cpu_seconds_of
from .scenario import Skipped

__all__ = [
    "SHARDS",
    "PolymqCluster",
    "PolymqNode",
    "RabbitCluster",
    "free_ports",
    "polymq_cluster",
    "queue_in_shard",
    "rabbit_cluster",
    "shard_of",
]

SHARDS = 4  # `polymq run`'s default shard count
START_TIMEOUT = 120.0  # a node may wait for the others' JetStream before it writes its ports
PORT_NAMES = (
    "core", "admin", "http", "stomp", "stomp_ws", "longpoll", "avro",
    "amqp", "amqp_admin", "amqp_tls",
)  # fmt: skip
_PORT_RANGE = (15000, 32000)  # below Linux's ephemeral range: no client connection takes them
_taken: set[int] = set()


def shard_of(destination: str, shards: int = SHARDS) -> int:
    """The shard of a core destination (``queue/orders``), as the core computes it."""
    return zlib.crc32(destination.partition(">")[0].encode()) % shards


def queue_in_shard(shard: int, prefix: str, shards: int = SHARDS) -> str:
    """A fresh queue name (letters, digits and dots: the same name over AMQP and the native
    protocol) whose ``queue/<name>`` falls in ``shard``."""
    while True:
        name = f"{prefix}.{secrets.token_hex(4)}"
        if shard_of(f"queue/{name}", shards) == shard:
            return name


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now, none handed out before by this process."""
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


def _get_json(url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out
    except (OSError, urllib.error.URLError, ValueError):
        return None


# ---- polymq ------------------------------------------------------------------------------------
class PolymqNode:
    """One ``polymq run`` of a :class:`PolymqCluster`; ``state`` is ``new``, ``running``,
    ``killed`` or ``stopped``."""

    def __init__(
        self,
        index: int,
        node_id: str,
        workdir: Path,
        cluster_port: int,
        ports: dict[str, int],
        peers: str,
        env: dict[str, str],
    ) -> None:
        self.index = index
        self.id = node_id
        self.workdir = workdir
        self.cluster_port = cluster_port
        self.ports = dict(ports)
        self.peers = peers
        self.env = env
        self.proc: Any = None  # tests.procs.PolymqProcess
        self.pids: list[int] = []
        self.procs: list[psutil.Process] = []
        self.state = "new"
        self.cpu_of_dead = 0.0  # CPU-seconds of earlier incarnations (killed, restarted)

    def __repr__(self) -> str:
        return f"<polymq node {self.id} {self.state}>"

    def args(self) -> list[str]:
        out = [
            "--node-id",
            self.id,
            "--peers",
            self.peers,
            "--cluster-port",
            str(self.cluster_port),
        ]
        for name, port in self.ports.items():
            out += [f"--{name.replace('_', '-')}-port", str(port)]
        return out

    def start(self, timeout: float = START_TIMEOUT) -> None:
        from tests.procs import PolymqProcess

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = PolymqProcess("run", self.workdir, *self.args(), env=self.env)
        try:
            self.proc.start(timeout)
        except RuntimeError as exc:
            raise BenchError(f"polymq node {self.id} did not start:\n{self.log_tail()}") from exc
        self.pids = [int(p) for p in self.proc.pids]
        if not self.pids:
            raise BenchError(f"polymq node {self.id} wrote no pids in its ports file")
        self.procs = []
        for pid in self.pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.procs.append(psutil.Process(pid))
        self.state = "running"

    def alive_pids(self) -> list[int]:
        out = []
        for p in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
        return out

    def cpu_seconds(self) -> float:
        return cpu_seconds_of(self.procs) if self.state == "running" else 0.0

    def cpu_parts(self) -> dict[str, float]:
        """CPU-seconds of polymq and of its nats-server (the ports file lists them so)."""
        if self.state != "running":
            return {}
        polymq = [p for p in self.procs if p.pid == self.pids[0]]
        nats = [p for p in self.procs if p.pid != self.pids[0]]
        return {"polymq": cpu_seconds_of(polymq), "nats_server": cpu_seconds_of(nats)}

    def pin(self, cpus: list[int] | None) -> None:
        if cpus is None or self.state != "running":
            return
        for pid in self.pids:
            with contextlib.suppress(psutil.Error, OSError):
                _pin_process(pid, cpus)

    def _signal(self, sig: int) -> None:
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL to polymq and its nats-server at once: a crash."""
        self.cpu_of_dead += self.cpu_seconds()
        self._signal(signal.SIGKILL)
        self._reap(10.0)
        self.state = "killed"

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to polymq (it stops its nats-server), SIGKILL for whatever is left."""
        if self.state == "running" and self.proc is not None and self.proc.proc is not None:
            popen = self.proc.proc
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout)
        self._signal(signal.SIGKILL)
        self._reap(10.0)
        if self.state == "running":
            self.state = "stopped"

    def _reap(self, timeout: float) -> None:
        if self.proc is not None and self.proc.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while self.alive_pids() and time.monotonic() < deadline:
            time.sleep(0.02)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def info(self, timeout: float = 3.0) -> dict[str, Any] | None:
        """``GET /api/cluster``, or None if the node does not answer."""
        return _get_json(f"{self.url('admin')}/api/cluster", timeout)

    def log(self) -> str:
        path = self.workdir / "run.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


class PolymqCluster:
    """``n`` polymq nodes under ``root``; all processes pinned to ``cpus`` (None: anywhere)."""

    def __init__(
        self,
        root: Path,
        n: int = 3,
        cpus: list[int] | None = None,
        log_level: str = "WARNING",
        profile_dir: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``env``: more of the nodes' environment (POLYMQ_QUEUE_WINDOW_MESSAGES, say)."""
        self.root = root
        self.cpus = cpus
        self.profiles: list[Path] = []
        run_id = secrets.token_hex(3)
        env = {
            "POLYMQ_CLUSTER_SECRET": secrets.token_hex(24),
            "POLYMQ_LOG_LEVEL": log_level,
            **(env or {}),
        }
        ports = free_ports(n * (1 + len(PORT_NAMES)))
        cluster_ports, ports = ports[:n], ports[n:]
        peers = ",".join(f"127.0.0.1:{p}" for p in cluster_ports)
        k = len(PORT_NAMES)
        self.nodes = [
            PolymqNode(
                i + 1,
                f"n{i + 1}-{run_id}",
                root / f"n{i + 1}",
                cluster_ports[i],
                dict(zip(PORT_NAMES, ports[i * k : (i + 1) * k], strict=True)),
                peers,
                {**env, **self._profiled(profile_dir, i + 1)},
            )
            for i in range(n)
        ]

    def _profiled(self, profile_dir: Path | None, index: int) -> dict[str, str]:
        """With ``profile_dir`` (``--profile``): node ``index`` runs under cProfile (its
        event-loop thread) and writes ``cluster-n<index>.pstats`` there when it stops
        (SIGTERM; a killed incarnation writes nothing)."""
        if profile_dir is None:
            return {}
        profile_dir.mkdir(parents=True, exist_ok=True)
        path = profile_dir / f"cluster-n{index}.pstats"
        self.profiles.append(path)
        hook = str(Path(__file__).resolve().parent / "_profile")
        return {
            "PYTHONPATH": os.pathsep.join(filter(None, [hook, os.environ.get("PYTHONPATH")])),
            "POLYMQ_BENCH_PROFILE": str(path),
        }

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start every node at the same moment (a node may wait for the others before it
        writes its ports file)."""
        self.start_nodes(self.nodes, timeout)

    def start_nodes(self, nodes: list[PolymqNode], timeout: float = START_TIMEOUT) -> None:
        errors: dict[str, BaseException] = {}

        def start(node: PolymqNode) -> None:
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
            raise BenchError(
                "polymq nodes did not start: "
                + "; ".join(f"{nid}: {exc}" for nid, exc in errors.items())
            )
        self.pin()

    def pin(self) -> None:
        for node in self.running():
            node.pin(self.cpus)

    def running(self) -> list[PolymqNode]:
        return [n for n in self.nodes if n.state == "running"]

    def node(self, node_id: str) -> PolymqNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def others(self, node: PolymqNode) -> list[PolymqNode]:
        return [n for n in self.nodes if n is not node]

    def cpu_seconds(self) -> float:
        return sum(n.cpu_seconds() for n in self.running())

    def cpu_parts(self) -> dict[str, float]:
        """CPU-seconds by process kind summed over the running nodes (``polymq``,
        ``nats_server``), and by node and kind (``<node id>/polymq``, ...)."""
        out: dict[str, float] = {}
        for n in self.running():
            for k, v in n.cpu_parts().items():
                out[k] = out.get(k, 0.0) + v
                out[f"{n.id}/{k}"] = v
        return out

    def pids(self) -> list[int]:
        return [p for n in self.running() for p in n.pids]

    def view(self, members: list[PolymqNode] | None = None) -> tuple[dict[int, str] | None, str]:
        """The leader of every shard if every member says it is ready, all agree on the
        leaders and none leads more than its share (the nodes' balancer moves a leader at a
        time; a cell measured meanwhile would see it move); else None and why not."""
        members = members if members is not None else self.running()
        ids = {n.id for n in members}
        agreed: dict[int, str] | None = None
        for node in members:
            info = node.info()
            if info is None:
                return None, f"{node.id}: /api/cluster does not answer"
            if not info.get("ready"):
                return None, f"{node.id}: not ready ({info.get('state')})"
            leaders = {int(s["shard"]): s.get("leader") for s in info.get("shards", [])}
            if len(leaders) != SHARDS:
                return None, f"{node.id} shows {len(leaders)} shards"
            for shard, leader in leaders.items():
                if leader not in ids:
                    return None, f"{node.id}: shard {shard} led by {leader!r}, not a member"
            if agreed is None:
                agreed = leaders
            elif leaders != agreed:
                return None, f"leaders disagree: {agreed} vs {node.id}'s {leaders}"
        if agreed is not None:
            share = -(-SHARDS // len(members))
            for nid in ids:
                led = sum(1 for leader in agreed.values() if leader == nid)
                if led > share:
                    return None, f"{nid} leads {led} shards, more than its share ({share})"
        return agreed, "ok"

    def wait_ready(
        self, timeout: float = 90.0, members: list[PolymqNode] | None = None
    ) -> dict[int, PolymqNode]:
        """Wait until the running nodes (or ``members``) are ready and agree on the leaders;
        the leader of every shard."""
        deadline = time.monotonic() + timeout
        while True:
            leaders, why = self.view(members)
            if leaders is not None:
                return {s: self.node(nid) for s, nid in leaders.items()}
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the polymq cluster was not ready within {timeout:g}s: {why}\n"
                    + self.diagnose()
                )
            time.sleep(0.2)

    def leader_changed(self, node: PolymqNode, shard: int, old: str) -> Callable[[], str | None]:
        """A probe: the leader ``node`` names for ``shard`` if it is not ``old`` any more."""

        def probe() -> str | None:
            info = node.info(1.0)
            if info is None:
                return None
            for s in info.get("shards", []):
                if int(s["shard"]) == shard and s.get("leader") and s["leader"] != old:
                    return str(s["leader"])
            return None

        return probe

    def diagnose(self, lines: int = 25) -> str:
        out = []
        for node in self.nodes:
            out.append(f"===== {node!r} pids={node.pids} alive={node.alive_pids()}")
            if node.state == "running":
                out.append(f"  /api/cluster: {node.info(1.0)}")
            out.append(node.log_tail(lines))
        return "\n".join(out)

    def stop_all(self) -> None:
        threads = [threading.Thread(target=n.stop, daemon=True) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        for n in self.nodes:
            n._signal(signal.SIGKILL)


@contextlib.contextmanager
def polymq_cluster(
    n: int = 3,
    cpus: list[int] | None = None,
    log_level: str = "WARNING",
    keep: bool = False,
    profile_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[PolymqCluster]:
    """A started, ready cluster; stopped and removed afterwards (``keep``: the directory
    stays, for its logs)."""
    root = Path(tempfile.mkdtemp(prefix="polymq-bench-cluster-"))
    cluster = PolymqCluster(root, n, cpus, log_level, profile_dir, env)
    try:
        cluster.start()
        cluster.wait_ready(timeout=120)
        yield cluster
    finally:
        cluster.stop_all()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


# ---- RabbitMQ ----------------------------------------------------------------------------------
def _ctl_path(server: str) -> str:
    """``rabbitmqctl`` beside the release's ``rabbitmq-server`` script (not Debian's su
    wrapper in /usr/sbin, which would lose our environment)."""
    ctl = Path(server).with_name("rabbitmqctl")
    if ctl.exists():
        return str(ctl)
    found = shutil.which("rabbitmqctl")
    if found is None:
        raise Skipped("rabbitmq-server is installed but rabbitmqctl is not")
    return found


class RabbitCluster:
    """``n`` private RabbitMQ nodes joined into one cluster (see the module docstring)."""

    def __init__(self, root: Path, n: int = 3) -> None:
        from tests.rabbit import RabbitNode, find_server

        server = find_server()
        if server is None:
            raise Skipped("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        self.root = root
        self.ctl = _ctl_path(server)
        cookie = secrets.token_hex(16).upper()
        self.nodes: list[Any] = []
        for i in range(n):
            node = RabbitNode(root / f"rabbit{i + 1}")
            node.node = f"bench-qq-{os.getpid()}-{i + 1}@localhost"
            path = node.dir / ".erlang.cookie"  # HOME is the node's directory
            path.write_text(cookie)
            path.chmod(0o400)
            self.nodes.append(node)
        self.version = Path(server).parent.parent.name.removeprefix("rabbitmq_server-")
        self._beams: list[psutil.Process] = []

    def run_ctl(self, node: Any, *args: str, timeout: float = 120.0) -> str:
        argv = [self.ctl, "-n", node.node, *args]
        try:
            r = subprocess.run(
                argv, env=node.env(), capture_output=True, text=True, timeout=timeout
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise BenchError(f"{' '.join(argv[1:])}: {exc}") from exc
        if r.returncode != 0:
            raise BenchError(
                f"rabbitmqctl {' '.join(argv[1:])} exited {r.returncode}: "
                f"{(r.stderr or r.stdout).strip()[-800:]}"
            )
        return r.stdout

    def start(self) -> None:
        errors: dict[str, BaseException] = {}

        def start(node: Any) -> None:
            try:
                node.start(timeout=90)
            except BaseException as exc:
                errors[node.node] = exc

        threads = [threading.Thread(target=start, args=(n,), daemon=True) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:
            raise BenchError(
                "RabbitMQ nodes did not start: "
                + "; ".join(f"{n}: {str(e)[-1500:]}" for n, e in errors.items())
            )
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.run_ctl(node, "stop_app")
            self.run_ctl(node, "join_cluster", first.node)
            self.run_ctl(node, "start_app")
        from tests.rabbit import _amqp_ready

        deadline = time.monotonic() + 60
        while not all(_amqp_ready(n.port) for n in self.nodes):
            if time.monotonic() > deadline:
                raise BenchError("RabbitMQ nodes did not accept AMQP after joining the cluster")
            time.sleep(0.2)
        status = json.loads(self.run_ctl(first, "cluster_status", "--formatter", "json"))
        running = set(status.get("running_nodes", []))
        want = {n.node for n in self.nodes}
        if running != want:
            raise BenchError(f"RabbitMQ cluster_status runs {sorted(running)}, not {sorted(want)}")

    def beams(self) -> list[psutil.Process]:
        out = []
        for n in self.nodes:
            b = n.beam()
            if b is not None:
                out.append(b)
        return out

    def cpu_seconds(self) -> float:
        return cpu_seconds_of(self._beams)

    def pin(self, cpus: list[int] | None) -> None:
        self._beams = self.beams()
        if cpus is None:
            return
        for b in self._beams:
            with contextlib.suppress(psutil.Error, OSError):
                _pin_process(b.pid, cpus)

    def cleanup(self) -> None:
        for n in self.nodes:
            with contextlib.suppress(Exception):
                n.kill()

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(n.log_tail(lines) for n in self.nodes)


@contextlib.contextmanager
def rabbit_cluster(n: int = 3, cpus: list[int] | None = None) -> Iterator[RabbitCluster]:
    """A started and joined RabbitMQ cluster, pinned to ``cpus``; killed and removed after."""
    root = Path(tempfile.mkdtemp(prefix="polymq-bench-rabbitqq-"))
    cluster: RabbitCluster | None = None
    try:
        cluster = RabbitCluster(root, n)
        cluster.start()
        cluster.pin(cpus)
        yield cluster
    finally:
        if cluster is not None:
            cluster.cleanup()
        shutil.rmtree(root, ignore_errors=True)
