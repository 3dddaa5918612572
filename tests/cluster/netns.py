"""Nodes in network namespaces, for partition tests: each node of a :class:`NetCluster` runs
in a namespace of its own (``ip netns``), with one veth whose other end is on a bridge in
the root namespace, and listens on its namespace's address; the test cuts one node off and
heals it:

- ``cut(node, "link")``: the veth's end on the bridge is taken down (the node's carrier
  goes; what it sends and what is sent to it is lost);
- ``cut(node, "drop")``: a blackhole route in the node's namespace for each other node, and
  one in each other node's namespace for it (its link stays up, its packets are dropped in
  silence: established TCP connections retransmit into nothing, new ones never open).

The test process reaches every node through the bridge's address (the root namespace is
never cut off: only the nodes are from each other; with ``"link"`` the test loses the cut
node too). A producer (``python -m tests.cluster.netns produce ...``) runs inside a node's
namespace and publishes to that node over AMQP with confirms, one connection per queue,
writing one line per publish (its outcome and when) to a file.

Needs root and ``ip`` with netns, veth and bridge support (:func:`unavailable` says why
not). Everything made is removed by :meth:`NetCluster.close` (namespaces, bridge, veths,
processes), which the fixture calls in its ``finally``; an ``atexit`` hook does it too.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from .harness import SHARDS, queue_in_shard

__all__ = ["NetCluster", "NetNode", "unavailable"]

_ALL: set[NetCluster] = set()
REPO = Path(__file__).resolve().parents[2]
CLUSTER_PORT = 7422
START_TIMEOUT = 120.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can): tries one, with a veth."""
    if os.geteuid() != 0:
        return "not root: ip netns needs root"
    name = f"pqprobe{os.getpid() % 100000}"
    try:
        made = _ip("netns", "add", name, check=False)
        if made.returncode != 0:
            return f"ip netns add failed: {made.stderr.strip()}"
        veth = _ip(
            "link", "add", f"{name[:11]}a", "type", "veth", "peer", "name", f"{name[:11]}b",
            check=False,
        )  # fmt: skip
        if veth.returncode != 0:
            return f"ip link add type veth failed: {veth.stderr.strip()}"
        _ip("link", "del", f"{name[:11]}a", check=False)
        bridge = _ip("link", "add", f"{name[:11]}r", "type", "bridge", check=False)
        if bridge.returncode != 0:
            return f"ip link add type bridge failed: {bridge.stderr.strip()}"
        _ip("link", "del", f"{name[:11]}r", check=False)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"ip: {exc}"
    finally:
        _ip("netns", "del", name, check=False)


class NetNode:
    def __init__(self, cluster: NetCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        tag = cluster.tag
        self.id = f"p{index}-{tag}"
        self.ns = f"pq{tag}-{index}"
        self.veth_host = f"pq{tag}h{index}"  # on the bridge
        self.veth_node = f"pq{tag}n{index}"  # in the namespace
        self.address = f"{cluster.prefix}.{index}"
        self.workdir = cluster.root / self.id
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<node {self.index} {self.id} {self.address}>"

    def exec_argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def spawn(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports_file = self.workdir / "ports.json"
        ports_file.unlink(missing_ok=True)
        peers = ",".join(f"{n.address}:{CLUSTER_PORT}" for n in self.cluster.nodes)
        argv = self.exec_argv(
            sys.executable, "-m", "polymq_cli", "run", "--workers", "1",
            "--host", self.address,
            "--node-id", self.id,
            "--peers", peers,
            "--cluster-port", str(CLUSTER_PORT),
            "--data-dir", str(self.workdir / "data"),
            "--ports-file", str(ports_file),
        )  # fmt: skip
        with open(self.workdir / "run.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.cluster.env, cwd=REPO
            )

    def wait_started(self, deadline: float) -> None:
        ports_file = self.workdir / "ports.json"
        while not ports_file.exists():
            assert self.proc is not None
            code = self.proc.poll()
            assert code is None, f"{self.id} exited {code}:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"{self.id} did not start:\n{self.log_tail()}"
            time.sleep(0.1)
        self.ports = json.loads(ports_file.read_text())

    def url(self, name: str = "http") -> str:
        return f"http://{self.address}:{self.ports[name]}"

    def cluster_info(self) -> dict[str, Any] | None:
        try:
            r = requests.get(self.url("admin") + "/api/cluster", timeout=3)
            return r.json() if r.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None

    def leads(self) -> set[int] | None:
        info = self.cluster_info()
        if info is None:
            return None
        return {int(s["shard"]) for s in info["shards"] if s.get("leading")}

    def log(self) -> str:
        path = self.workdir / "run.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def nats_log(self) -> str:
        path = self.workdir / "data" / "nats-server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class NetCluster:
    """``n`` nodes, each in a namespace of its own on one bridge (see the module)."""

    def __init__(self, root: Path, n: int = 3) -> None:
        self.root = root
        self.tag = uuid.uuid4().hex[:4]
        octet = 100 + int(self.tag, 16) % 150
        self.prefix = f"10.{octet}.{int(self.tag[:2], 16)}"  # a /24 of our own
        self.bridge = f"pq{self.tag}br"
        self.env = {
            **os.environ,
            "POLYMQ_CLUSTER_SECRET": secrets.token_hex(16),
            "POLYMQ_LOG_LEVEL": "INFO",
        }
        self.nodes = [NetNode(self, i + 1) for i in range(n)]
        self.producers: list[subprocess.Popen[bytes]] = []
        self.cuts: set[tuple[int, str]] = set()
        _ALL.add(self)

    def __repr__(self) -> str:
        return f"<netcluster {self.tag} {self.nodes}>"

    # ---- the network ---------------------------------------------------------------------
    def make_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.prefix}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            _ip("netns", "add", node.ns)
            _ip("link", "add", node.veth_host, "type", "veth", "peer", "name", node.veth_node)
            _ip("link", "set", node.veth_node, "netns", node.ns)
            _ip("-n", node.ns, "addr", "add", f"{node.address}/24", "dev", node.veth_node)
            _ip("-n", node.ns, "link", "set", "lo", "up")
            _ip("-n", node.ns, "link", "set", node.veth_node, "up")
            _ip("link", "set", node.veth_host, "master", self.bridge)
            _ip("link", "set", node.veth_host, "up")

    def cut(self, node: NetNode, how: str) -> None:
        """Cut ``node`` off from the others: ``"link"`` (its veth down) or ``"drop"``
        (blackhole routes both ways)."""
        if how == "link":
            _ip("link", "set", node.veth_host, "down")
        else:
            self._blackholes(node, "add")
        self.cuts.add((node.index, how))

    def heal(self, node: NetNode, how: str) -> None:
        if how == "link":
            _ip("link", "set", node.veth_host, "up")
        else:
            self._blackholes(node, "del")
        self.cuts.discard((node.index, how))

    def _blackholes(self, node: NetNode, verb: str) -> None:
        """``verb`` (``add``, ``del``) the blackhole routes between ``node`` and every other
        node, both ways."""
        for other in self.nodes:
            if other is not node:
                _ip("-n", node.ns, "route", verb, "blackhole", f"{other.address}/32")
                _ip("-n", other.ns, "route", verb, "blackhole", f"{node.address}/32")

    # ---- the nodes -----------------------------------------------------------------------
    def start(self) -> NetCluster:
        self.make_network()
        for node in self.nodes:
            node.spawn()
        deadline = time.monotonic() + START_TIMEOUT
        for node in self.nodes:
            node.wait_started(deadline)
        return self

    def leaders(self, timeout: float = 60.0) -> dict[int, NetNode]:
        """Each shard's leader, once every node lists every node as ready and all agree on
        one leader for every shard, which says it leads it."""
        deadline = time.monotonic() + timeout
        while True:
            views = {}
            for node in self.nodes:
                info = node.cluster_info()
                listed = {m["id"]: m.get("state") for m in (info or {}).get("nodes", [])}
                if info is not None and all(listed.get(n.id) == "ready" for n in self.nodes):
                    views[node.id] = {int(s["shard"]): s.get("leader") for s in info["shards"]}
            ids = {n.id: n for n in self.nodes}
            if len(views) == len(self.nodes):
                first = next(iter(views.values()))
                if (
                    len(first) == SHARDS
                    and all(v == first for v in views.values())
                    and all(first[i] in ids for i in first)
                    and all(i in (ids[str(first[i])].leads() or ()) for i in first)
                ):
                    return {i: ids[str(leader)] for i, leader in first.items()}
            assert time.monotonic() < deadline, f"no agreed leaders: {views}\n{self.diagnose()}"
            time.sleep(0.5)

    def queue_in_shard(self, shard: int) -> str:
        return queue_in_shard(shard, prefix=f"part{self.tag}")

    def produce(self, node: NetNode, queues: list[str], out: Path, seconds: float) -> None:
        """A producer in ``node``'s namespace publishing to ``node`` (see the module)."""
        argv = node.exec_argv(
            sys.executable, "-m", "tests.cluster.netns", "produce",
            node.address, str(node.ports["amqp"]), str(out), str(seconds), node.id, *queues,
        )  # fmt: skip
        log = open(out.with_suffix(".log"), "ab")
        self.producers.append(
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        )
        log.close()

    def diagnose(self, lines: int = 30) -> str:
        out = []
        for node in self.nodes:
            out.append(f"==== {node!r}: {node.cluster_info()}\n{node.log_tail(lines)}")
        return "\n".join(out)

    def close(self) -> None:
        """Stop everything and remove the namespaces and the bridge (idempotent)."""
        for proc in self.producers:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        for index, how in list(self.cuts):
            with contextlib.suppress(subprocess.SubprocessError):
                self.heal(self.nodes[index - 1], how)
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        for node in self.nodes:
            # whatever is left in the namespace (a nats-server whose polymq was killed)
            pids = _ip("netns", "pids", node.ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", node.ns, check=False)
            _ip("link", "del", node.veth_host, check=False)
        _ip("link", "del", self.bridge, check=False)
        _ALL.discard(self)


@atexit.register
def _close_all() -> None:
    for cluster in list(_ALL):
        with contextlib.suppress(Exception):
            cluster.close()


# ---- the producer (runs in a node's namespace) ---------------------------------------------
async def _produce_one(host: str, port: int, queue: str, out: Any, until: float, tag: str) -> None:
    import aio_pika  # (only the producer needs it)

    n = 0
    while time.time() < until:
        try:
            connection = await asyncio.wait_for(
                aio_pika.connect(host=host, port=port, login="guest", password="guest"), 3
            )
        except Exception as exc:
            out.write(f"{queue} - connect-failed {time.time():.3f} {time.time():.3f} {exc!r}\n")
            await asyncio.sleep(0.2)
            continue
        out.write(f"{queue} - connected {time.time():.3f} {time.time():.3f}\n")
        try:
            channel = await connection.channel(publisher_confirms=True)
            while time.time() < until and not connection.is_closed:
                n += 1
                body = f"{tag}-{queue}-{n}"
                sent = time.time()
                try:
                    await asyncio.wait_for(
                        channel.default_exchange.publish(
                            aio_pika.Message(body.encode(), delivery_mode=2), routing_key=queue
                        ),
                        2.0,
                    )
                    result = "ack"
                except TimeoutError:
                    result = "timeout"
                except aio_pika.exceptions.DeliveryError:
                    result = "nack"
                out.write(f"{queue} {body} {result} {sent:.3f} {time.time():.3f}\n")
                if result == "nack":
                    await asyncio.sleep(0.05)
        except Exception as exc:
            out.write(f"{queue} - closed {time.time():.3f} {time.time():.3f} {exc!r}\n")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)


async def _produce(argv: list[str], out: Any) -> None:
    host, port, _path, seconds, tag, *queues = argv
    until = time.time() + float(seconds)
    await asyncio.gather(*(_produce_one(host, int(port), q, out, until, tag) for q in queues))


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        with open(sys.argv[4], "a", buffering=1) as output:
            asyncio.run(_produce(sys.argv[2:], output))
