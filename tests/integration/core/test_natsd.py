"""polymq_core.cluster.natsd with real nats-server processes: a three-node JetStream cluster on
free 127.0.0.1 ports, a clean stop, and a child that dies with a kill -9'ed parent.

:func:`nats_cluster` is also what the membership and mesh tests start their NATS with."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig

from polymq_core.cluster.natsd import NatsConfig, NatsError, NatsServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@contextlib.asynccontextmanager
async def nats_cluster(
    base: Path, n: int = 3, secrets: list[str | None] | None = None
) -> AsyncIterator[list[NatsServer]]:
    """``n`` nats-servers routed to each other on free ports, with unique names (and each
    its cluster secret from ``secrets``, if given); all are stopped on exit."""
    tag = uuid.uuid4().hex[:6]
    names = [f"n{i}-{tag}" for i in range(n)]
    ports = [free_port() for _ in names]
    servers = [
        NatsServer(
            NatsConfig(
                server_name=name,
                store_dir=base / name / "js",
                cluster_port=port,
                routes=tuple(("127.0.0.1", p) for p in ports if p != port),
                cluster_name=f"c-{tag}",
                secret=secret,
            ),
            work_dir=base / name,
        )
        for name, port, secret in zip(names, ports, secrets or [None] * n, strict=True)
    ]
    try:
        await asyncio.gather(*(s.start(timeout=60) for s in servers))
        yield servers
    finally:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)


async def add_stream_when_ready(js: JetStreamContext, config: StreamConfig) -> None:
    """Create a stream once the JetStream cluster has elected its meta leader."""
    deadline = time.monotonic() + 45
    while True:
        try:
            await js.add_stream(config)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


SECRET = "a-cluster-secret-of-at-least-32-characters"


@pytest.mark.parametrize("secret", [None, SECRET])
async def test_three_node_jetstream_cluster(tmp_path: Path, secret: str | None) -> None:
    async with nats_cluster(tmp_path, secrets=[secret] * 3) as servers:
        pids = [s.pid for s in servers]
        assert all(pid is not None and alive(pid) for pid in pids)
        assert len({s.client_url for s in servers}) == 3
        assert all(s.client_url.startswith("nats://127.0.0.1:") for s in servers)
        user, password = servers[1].config.client_auth or (None, None)
        nc = await nats.connect(servers[1].client_url, user=user, password=password)
        try:
            js = nc.jetstream(timeout=10)
            name = f"T{uuid.uuid4().hex[:8]}"
            config = StreamConfig(
                name=name, subjects=[name], num_replicas=3, storage=StorageType.FILE
            )
            await add_stream_when_ready(js, config)
            ack = await js.publish(name, b"hello", timeout=10)
            assert ack.stream == name
            assert ack.seq == 1
            info = await js.stream_info(name)
            assert info.cluster is not None
            assert info.cluster.leader in {s.config.server_name for s in servers}
            assert len(info.cluster.replicas or []) == 2  # the two followers
            assert info.state.messages == 1
        finally:
            await nc.close()
        await asyncio.gather(*(s.stop() for s in servers))
        assert all(s.pid is None for s in servers)
        for pid in pids:
            assert pid is not None and not alive(pid)
        await servers[0].stop()  # idempotent


async def test_a_server_with_another_secret_is_refused_and_so_is_a_client_without_one(
    tmp_path: Path,
) -> None:
    other = "another-secret-of-at-least-32-characters!"
    async with nats_cluster(tmp_path, secrets=[SECRET, SECRET, other]) as servers:
        deadline = time.monotonic() + 20
        while not all(s.refused_logins() for s in (servers[0], servers[2])):
            assert time.monotonic() < deadline, [s.log_tail()[-500:] for s in servers]
            await asyncio.sleep(0.2)
        with pytest.raises(Exception, match=r"[Aa]uthoriz"):
            await nats.connect(
                servers[0].client_url, allow_reconnect=False, max_reconnect_attempts=0
            )
        user, password = servers[0].config.client_auth or (None, None)
        nc = await nats.connect(servers[0].client_url, user=user, password=password)
        await nc.close()


async def test_start_failure_quotes_the_log(tmp_path: Path) -> None:
    # the route port is taken: nats-server exits and says so
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = NatsServer(
            NatsConfig(
                server_name=f"busy-{uuid.uuid4().hex[:6]}",
                store_dir=tmp_path / "js",
                cluster_port=port,
                routes=(("127.0.0.1", free_port()),),
            ),
            work_dir=tmp_path,
        )
        with pytest.raises(NatsError, match="exited") as err:
            await server.start(timeout=30)
    assert str(port) in str(err.value)
    assert server.pid is None


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


async def test_the_server_runs_under_its_memory_limit(tmp_path: Path) -> None:
    server = NatsServer(
        NatsConfig(
            server_name=f"lim-{uuid.uuid4().hex[:6]}",
            store_dir=tmp_path / "js",
            cluster_port=free_port(),
            secret=SECRET,
            memory_limit=300 << 20,
        ),
        work_dir=tmp_path,
    )
    await server.start(timeout=30)
    try:
        assert server.pid is not None
        environ = _environ(server.pid)
        assert f"GOMEMLIMIT={300 << 20}".encode() in environ
        # and nats-server runs under it (its varz, asked as the system account)
        user, password = server.config.system_auth or ("", "")
        nc = await nats.connect(server.client_url, user=user, password=password)
        try:
            reply = await nc.request("$SYS.REQ.SERVER.PING.VARZ", b"{}", timeout=5)
            assert json.loads(reply.data)["data"]["gomemlimit"] == 300 << 20
        finally:
            await nc.close()
    finally:
        await server.stop()


async def test_missing_binary(tmp_path: Path) -> None:
    server = NatsServer(
        NatsConfig(server_name="x", store_dir=tmp_path, cluster_port=free_port()),
        binary=str(tmp_path / "no-such-nats-server"),
    )
    with pytest.raises(NatsError, match="cannot run"):
        await server.start()


CHILD = """
import asyncio, sys
from pathlib import Path
from polymq_core.cluster.natsd import NatsConfig, NatsServer

async def main() -> None:
    base = Path(sys.argv[1])
    server = NatsServer(NatsConfig(server_name=sys.argv[2], store_dir=base / "js",
                                   cluster_port=int(sys.argv[3])), work_dir=base)
    await server.start(timeout=60)
    print(server.pid, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_dies_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), f"orphan-{uuid.uuid4().hex[:6]}",
         str(free_port())],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent did not start its nats-server: {line!r}"
        pid = int(line)
        assert alive(pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("nats-server outlived its kill -9'ed parent")


async def test_a_running_server_takes_new_routes_on_reroute(tmp_path: Path) -> None:
    """Two servers each started with one route to nobody: apart until one is rerouted to
    the other (its config written again, SIGHUP): then a message crosses between them."""
    tag = uuid.uuid4().hex[:6]
    ports = [free_port() for _ in range(3)]  # the last: a node that never starts
    servers = [
        NatsServer(
            NatsConfig(
                server_name=f"r{i}-{tag}",
                store_dir=tmp_path / f"r{i}" / "js",
                cluster_port=ports[i],
                routes=(("127.0.0.1", ports[2]),),
                cluster_name=f"c-{tag}",
            ),
            work_dir=tmp_path / f"r{i}",
        )
        for i in range(2)
    ]
    try:
        await asyncio.gather(*(s.start(timeout=60) for s in servers))
        a = await nats.connect(servers[0].client_url)
        b = await nats.connect(servers[1].client_url)
        try:
            got: asyncio.Queue[bytes] = asyncio.Queue()

            async def on_message(msg: Msg) -> None:
                await got.put(msg.data)

            await b.subscribe("cross", cb=on_message)
            await b.flush()
            await a.publish("cross", b"apart")
            await a.flush()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(got.get(), 1.0)

            assert not servers[0].reroute((("127.0.0.1", ports[2]),))  # the same: no reload
            assert servers[0].reroute((("127.0.0.1", ports[2]), ("127.0.0.1", ports[1])))
            conf = (tmp_path / "r0" / "nats.conf").read_text()
            assert f'"nats-route://127.0.0.1:{ports[1]}"' in conf
            deadline = time.monotonic() + 20
            while True:  # until the route is up and b's interest has reached a
                await a.publish("cross", b"routed")
                with contextlib.suppress(TimeoutError):
                    if await asyncio.wait_for(got.get(), 0.5) == b"routed":
                        break
                assert time.monotonic() < deadline, servers[0].log_tail()
            assert "Reloaded: cluster routes" in servers[0].log_tail()
        finally:
            await a.close()
            await b.close()
    finally:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
