"""``polymq run --workers N``: the STOMP and AMQP frontends in N - 1 more processes on the
same ports (docs/workers.md). Real processes, real clients (stomp.py, pika), the connections'
owners read from the kernel (psutil)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import psutil
import pytest
import stomp

from polymq_server.auth.provider import hash_password

from ...pki import HAVE_OPENSSL, Authority
from ...procs import PolymqProcess, connections_held, node_processes, spread_over

WAIT = 15.0


def _stomp(port: int, **kw: str) -> stomp.Connection:
    conn = stomp.Connection([("127.0.0.1", port)], heartbeats=(0, 0))
    conn.connect(wait=True, vhost="/", **kw)
    return conn


class _Inbox(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.bodies: list[str] = []

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.bodies.append(frame.body)


def _wait(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


def _metric(url: str, line_start: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{line_start} not in {url}")


@pytest.fixture
def three(tmp_path: Path) -> Iterator[PolymqProcess]:
    proc = PolymqProcess("run", tmp_path / "run", "--workers", "3").start(timeout=40)
    yield proc
    proc.kill()


@pytest.mark.timeout(120)
def test_connections_are_spread_over_the_processes_and_reach_one_core(
    three: PolymqProcess,
) -> None:
    family = node_processes(three)
    assert len(family) == 3, three.log()
    assert sorted(three.pids) == sorted(p.pid for p in family)  # the ports file names them all
    queue = f"/queue/workers-{uuid.uuid4().hex[:8]}"
    inbox = _Inbox()
    consumer = _stomp(three.ports["stomp"])
    consumer.set_listener("inbox", inbox)
    consumer.subscribe(queue, id="1", ack="auto")
    producers = [_stomp(three.ports["stomp"]) for _ in range(16)]
    amqp = [
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", three.ports["amqp"]))
        for _ in range(16)
    ]
    try:
        stomp_owners = connections_held(three.ports["stomp"], [p.pid for p in family])
        amqp_owners = connections_held(three.ports["amqp"], [p.pid for p in family])
        assert sum(stomp_owners.values()) == 17 and sum(amqp_owners.values()) == 16
        # 16 connections over 3 processes: all on one has odds of 3 * (1/3)^16
        assert len(stomp_owners) >= 2 and len(amqp_owners) >= 2, (stomp_owners, amqp_owners)
        for i, p in enumerate(producers):
            p.send(queue, f"stomp-{i}", receipt=f"r{i}")
        for i, c in enumerate(amqp):
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", queue.removeprefix("/queue/"), f"amqp-{i}".encode())
        want = {f"stomp-{i}" for i in range(16)} | {f"amqp-{i}" for i in range(16)}
        _wait(lambda: set(inbox.bodies) >= want, "every message through every process")
        assert len(inbox.bodies) == 32
        # the first process's /metrics counts every process's connections
        url = f"http://127.0.0.1:{three.ports['stomp_ws']}/metrics"
        _wait(
            lambda: (
                _metric(url, 'polymq_client_connections{listener="stomp",protocol="stomp"}') == 17
            ),
            "/metrics to count 17 STOMP connections over the three processes",
        )
        assert _metric(url, 'polymq_connections{protocol="stomp"}') == 3  # three core links
    finally:
        for c in amqp:
            c.close()
        for p in [consumer, *producers]:
            p.disconnect()


@pytest.mark.timeout(120)
def test_a_worker_that_dies_is_started_again(three: PolymqProcess) -> None:
    victim = node_processes(three)[1]
    held = _stomp(three.ports["stomp"])
    victim.kill()
    victim.wait(5)
    _wait(
        lambda: (
            len(node_processes(three)) == 3
            and victim.pid not in {p.pid for p in node_processes(three)}
        ),
        "a new worker in place of the killed one",
    )
    assert "worker 1 exited with -9" in three.log() or "worker 2 exited with -9" in three.log()
    assert three.alive
    # every new connection is served (none lands on a port nobody listens on)
    for _ in range(12):
        _stomp(three.ports["stomp"]).disconnect()
    held.disconnect()


@pytest.mark.timeout(120)
def test_sigterm_stops_every_worker_and_exits_0(three: PolymqProcess) -> None:
    family = node_processes(three)
    conn = _stomp(three.ports["stomp"])
    assert three.stop() == 0, three.log()
    for p in family[1:]:
        p.wait(5)  # (raises if a worker outlives the first process)
    assert "shutting down" in three.log()
    assert not conn.is_connected() or conn.disconnect() is None


@pytest.mark.timeout(120)
def test_ctrl_c_to_the_terminal_stops_the_node_in_order(tmp_path: Path) -> None:
    """A terminal's Ctrl-C signals the whole foreground process group: it reaches the first
    process alone (each worker runs in a session of its own), which stops the workers itself;
    none is taken for dead and started again."""
    ports_file = tmp_path / "ports.json"
    log = open(tmp_path / "run.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "polymq_cli", "run", "--workers", "3",
         "--data-dir", str(tmp_path / "d"), "--ports-file", str(ports_file),
         "--core-port", "0", "--admin-port", "0", "--http-port", "0", "--stomp-port", "0",
         "--stomp-ws-port", "0", "--longpoll-port", "0", "--avro-port", "0",
         "--amqp-port", "0", "--amqp-admin-port", "0"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    try:
        _wait(ports_file.exists, "polymq run --workers 3 to listen", 40)
        family = [psutil.Process(pid) for pid in json.loads(ports_file.read_text())["pids"]]
        assert len(family) == 3
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive
        text = (tmp_path / "run.log").read_text()
        assert "shutting down" in text and "exited with" not in text, text[-3000:]
    finally:
        proc.kill()


@pytest.mark.timeout(120)
def test_workers_die_with_a_killed_first_process(three: PolymqProcess) -> None:
    family = node_processes(three)
    os.kill(family[0].pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, f"workers outlived their first process: {alive}"


@pytest.mark.timeout(120)
def test_workers_log_in_to_a_core_that_requires_logins(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    grants = [{"pattern": "queue/ann.*", "permissions": ["read", "write"]}]
    ann = {"password_hash": hash_password("s3cret!"), "grants": grants}
    users.write_text(json.dumps({"users": {"ann": ann}}))
    proc = PolymqProcess(
        "run", tmp_path / "run", "--workers", "2", "--auth", f"file:{users}"
    ).start(timeout=40)
    try:
        assert len(node_processes(proc)) == 2
        inbox = _Inbox()
        conns = spread_over(  # (into both processes: it asserts so)
            lambda: _stomp(proc.ports["stomp"], username="ann", passcode="s3cret!"),
            proc.ports["stomp"],
            [p.pid for p in node_processes(proc)],
            8,
        )
        conns[0].set_listener("inbox", inbox)
        conns[0].subscribe("/queue/ann.in", id="1", ack="auto")
        for i, c in enumerate(conns):
            c.send("/queue/ann.in", f"m{i}", receipt=f"r{i}")
        _wait(lambda: len(inbox.bodies) == len(conns), "ann's messages, through both processes")
        for c in conns:
            c.disconnect()
    finally:
        proc.kill()


def _polymq_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymq_cli", "run", "--data-dir", str(tmp_path / "d"),
         "--core-port", "0", "--admin-port", "0", "--http-port", "0", "--stomp-port", "0",
         "--stomp-ws-port", "0", "--longpoll-port", "0", "--avro-port", "0",
         "--amqp-port", "0", "--amqp-admin-port", "0", *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "said"), [("0", "from 1 to 256"), ("many", "a number of processes, or 'auto'")]
)
def test_a_bad_worker_count_is_named(tmp_path: Path, value: str, said: str) -> None:
    r = _polymq_run(tmp_path, "--workers", value)
    assert r.returncode == 2 and said in r.stderr, r.stderr


@pytest.mark.skipif(not HAVE_OPENSSL, reason="needs the openssl command")
def test_workers_refuse_a_core_that_speaks_tls_only(tmp_path: Path) -> None:
    cert, key = Authority.make(tmp_path / "pki").issue("node")
    r = _polymq_run(
        tmp_path, "--workers", "2", "--core-tls-cert", str(cert), "--core-tls-key", str(key)
    )
    assert r.returncode == 2, r.stderr
    assert "configuration error: --workers" in r.stderr and "TLS only" in r.stderr
