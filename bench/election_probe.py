"""Can the survivors of a JetStream cluster elect a stream leader sooner than Raft's election
timeout once the old leader is certainly dead? (issue 28, point 8; docs/cluster.md,
"Failover faster than the election?")

::

    python -m bench.election_probe [--servers 3] [--rounds 3] [--assist none,peer_remove,stepdown]

Bare nats-servers (the venv's, as polymq runs them: JetStream, file storage, sync always)
on 127.0.0.1, one R3 stream. Each round: a client on a survivor publishes to the stream
every 20 ms (each publish awaited apart, 2 s timeout); ``kill -9`` of the server leading the
stream; with ``assist``, right after the kill the survivor is asked (the stream's account's
JetStream API; no system account needed) to take the dead server out of the stream
(``$JS.API.STREAM.PEER.REMOVE.<stream>``) or to step the stream's leader down
(``$JS.API.STREAM.LEADER.STEPDOWN.<stream>``); the figure is the time from the kill to the
first acknowledged publish begun after it. The dead server is restarted and the stream has
three current replicas again between rounds. One JSON line per round, then the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.errors import APIError

from .cluster_nodes import free_ports

STREAM = "PROBE"
SUBJECT = "probe.x"


class Server:
    def __init__(self, root: Path, name: str, client: int, cluster: int, routes: list[int]):
        self.name, self.client, self.dir = name, client, root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        routes_s = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
        (self.dir / "nats.conf").write_text(
            f'server_name: "{name}"\nlisten: "127.0.0.1:{client}"\n'
            f'jetstream {{ store_dir: "{self.dir / "js"}", sync_interval: always }}\n'
            "accounts { SYS { users [ {user: sys, password: sys} ] }, "
            "APP { jetstream: enabled, users [ {user: app, password: app} ] } }\n"
            "system_account: SYS\n"
            f'cluster {{ name: "probe", listen: "127.0.0.1:{cluster}", routes: [{routes_s}] }}\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
        conf = str(self.dir / "nats.conf")
        with open(self.dir / "log", "ab") as log:
            self.proc = subprocess.Popen([exe, "-c", conf], stdout=log, stderr=log)

    def kill(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def url(self, user: str) -> str:
        return f"nats://{user}:{user}@127.0.0.1:{self.client}"


async def _info(nc: Any) -> dict[str, Any] | None:
    try:
        msg = await nc.request(f"$JS.API.STREAM.INFO.{STREAM}", b"", timeout=1.0)
        return json.loads(msg.data)
    except Exception:
        return None


async def _whole(servers: list[Server], timeout: float = 120.0) -> str:
    """Wait until the stream has a leader and every other replica is current; its leader."""
    nc = await nats.connect([s.url("app") for s in servers], max_reconnect_attempts=-1)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = await _info(nc)
            cl = (info or {}).get("cluster") or {}
            reps = cl.get("replicas") or []
            if (
                cl.get("leader")
                and len(reps) == 2
                and all(r.get("current") and not r.get("offline") for r in reps)
            ):
                return str(cl["leader"])
            await asyncio.sleep(0.2)
        raise RuntimeError(f"stream not whole within {timeout} s: {info}")
    finally:
        await nc.close()


async def _round(servers: list[Server], assist: str) -> dict[str, Any]:
    leader = await _whole(servers)
    victim = next(s for s in servers if s.name == leader)
    survivor = next(s for s in servers if s is not victim)
    nc = await nats.connect(survivor.url("app"), max_reconnect_attempts=-1)
    js = nc.jetstream(timeout=2.0)
    attempts: list[tuple[float, float | None]] = []
    killed: list[float] = []

    async def one() -> None:
        t0 = time.monotonic()
        try:
            await js.publish(SUBJECT, b"x" * 32)
            attempts.append((t0, time.monotonic()))
        except (APIError, TimeoutError, nats.errors.Error):
            attempts.append((t0, None))

    async def publisher(stop: asyncio.Event) -> None:
        tasks = set()
        while not stop.is_set():
            t = asyncio.ensure_future(one())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks, return_exceptions=True)

    stop = asyncio.Event()
    pub = asyncio.ensure_future(publisher(stop))
    await asyncio.sleep(1.0)
    t_kill = time.monotonic()
    victim.kill()
    killed.append(t_kill)
    answer: Any = None
    if assist != "none":
        subject = {
            "peer_remove": f"$JS.API.STREAM.PEER.REMOVE.{STREAM}",
            "stepdown": f"$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}",
        }[assist]
        body = json.dumps({"peer": victim.name}).encode() if assist == "peer_remove" else b""
        try:
            msg = await nc.request(subject, body, timeout=5.0)
            answer = json.loads(msg.data)
        except Exception as exc:
            answer = f"{type(exc).__name__}: {exc}"
    first = None
    deadline = time.monotonic() + 30
    while first is None and time.monotonic() < deadline:
        ok = [a for a in attempts if a[0] >= t_kill and a[1] is not None]
        if ok:
            first = min(ok, key=lambda a: a[1] or 0)
        await asyncio.sleep(0.05)
    stop.set()
    await pub
    cl = (await _info(nc) or {}).get("cluster") or {}
    await nc.close()
    victim.start()
    return {
        "assist": assist,
        "killed": victim.name,
        "answer": answer,
        "first_ack_s": round(first[1] - t_kill, 3) if first and first[1] else None,
        "leader_after": cl.get("leader"),
        "replicas_after": [r.get("name") for r in cl.get("replicas", [])],
    }


async def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--assist", default="none,peer_remove,stepdown")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="polymq-election-"))
    ports = free_ports(2 * a.servers)
    cports = ports[a.servers :]
    servers = [Server(root, f"s{i + 1}", ports[i], cports[i], cports) for i in range(a.servers)]
    for s in servers:
        s.start()
    try:
        await asyncio.sleep(2)
        nc = await nats.connect(servers[0].url("app"), max_reconnect_attempts=-1)
        js = nc.jetstream(timeout=10.0)
        for _ in range(60):
            try:
                await js.add_stream(name=STREAM, subjects=[SUBJECT], num_replicas=3)
                break
            except Exception:
                await asyncio.sleep(1)
        await nc.close()
        results: dict[str, list[float]] = {}
        for assist in a.assist.split(","):
            for _ in range(a.rounds):
                row = await _round(servers, assist)
                print(json.dumps(row), flush=True)
                if row["first_ack_s"] is not None:
                    results.setdefault(assist, []).append(row["first_ack_s"])
        for assist, vals in results.items():
            print(json.dumps({"assist": assist, "values": vals, "median": statistics.median(vals)}))
    finally:
        for s in servers:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
