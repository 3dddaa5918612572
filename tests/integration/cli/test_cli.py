"""The ``polymq`` command: ports, graceful shutdown, and clear start-up errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from polymq import Client, ConnectionClosed, Message, PolymqError

from ...procs import PolymqProcess


def _polymq(
    *args: str, env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymq_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.timeout(90)
async def test_sigterm_answers_every_request_read_and_exits_0(tmp_path: Path) -> None:
    """Every publish read before SIGTERM is answered, and every answered one is durable."""
    proc = PolymqProcess("core", tmp_path / "core").start()
    queue = f"queue/term{uuid.uuid4().hex[:10]}"
    receipted: list[bytes] = []
    enough = asyncio.Event()
    client = await Client.connect("127.0.0.1", proc.ports["core"])

    async def produce(worker: int) -> None:
        for i in range(100_000):
            body = f"{worker}-{i}".encode()
            try:
                await client.publish(queue, [Message(body, persistent=True)])
            except (PolymqError, ConnectionClosed):
                return
            receipted.append(body)
            if len(receipted) == 500:
                enough.set()

    producers = [asyncio.create_task(produce(w)) for w in range(8)]
    await asyncio.wait_for(enough.wait(), 30)
    assert proc.proc is not None
    proc.proc.terminate()  # SIGTERM while eight producers keep publishing
    code = await asyncio.to_thread(proc.proc.wait, 30)
    await asyncio.gather(*producers)
    await client.close()
    assert code == 0, proc.log()
    assert "shutting down" in proc.log()

    proc.start()  # same data dir
    try:
        async with await Client.connect("127.0.0.1", proc.ports["core"]) as c:
            got: set[bytes] = set()
            leases = True
            while leases:
                leases = await c.pull(queue, 1000)
                got.update(lease.message.body for lease in leases)
        missing = set(receipted) - got
        assert not missing, f"{len(missing)} receipted messages lost, e.g. {sorted(missing)[:3]}"
        # Graceful: every publish the core read was answered before the goodbye, so nothing
        # is stored that its producer was not told about.
        unanswered = got - set(receipted)
        assert not unanswered, f"{len(unanswered)} stored publishes were never answered"
    finally:
        proc.kill()


def test_ports_file_lists_every_listener_of_run(run_proc: PolymqProcess) -> None:
    assert set(run_proc.ports) >= {"core", "admin", "http"}
    for port in run_proc.ports.values():
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # listening
    assert "anonymous mode" in run_proc.log()  # `polymq run` says it runs without logins


def test_a_taken_default_port_is_replaced_by_a_free_one(tmp_path: Path) -> None:
    blocker = socket.socket()
    with contextlib.suppress(OSError):  # if 7400 is taken already, it is taken either way
        blocker.bind(("127.0.0.1", 7400))
        blocker.listen()
    ports_file = tmp_path / "ports.json"
    p = subprocess.Popen(
        [sys.executable, "-m", "polymq_cli", "core", "--data-dir", str(tmp_path / "d"),
         "--ports-file", str(ports_file), "--admin-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not ports_file.exists():
            assert p.poll() is None, p.stdout.read() if p.stdout else ""
            assert time.monotonic() < deadline, "did not start"
            time.sleep(0.05)
        ports = json.loads(ports_file.read_text())
        assert ports["core"] != 7400
        with socket.create_connection(("127.0.0.1", ports["core"]), timeout=2):
            pass
    finally:
        p.terminate()
        out, _ = p.communicate(timeout=20)
        blocker.close()
    assert "port 7400 (core) is taken" in out
    assert p.returncode == 0


def test_an_explicit_port_that_is_taken_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _polymq(
            "core", "--core-port", str(port), "--admin-port", "0", "--data-dir", str(tmp_path)
        )
    assert r.returncode == 1
    assert "cannot start" in r.stderr and "address already in use" in r.stderr.lower()


def test_malformed_setting_is_named(tmp_path: Path) -> None:
    r = _polymq(
        "core", "--core-port", "0", "--data-dir", str(tmp_path), env={"POLYMQ_SHARDS": "many"}
    )
    assert r.returncode == 2
    assert "POLYMQ_SHARDS" in r.stderr


def test_malformed_auth_file_is_named(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text("{not json")
    r = _polymq("core", "--core-port", "0", "--admin-port", "0", "--data-dir", str(tmp_path),
                "--auth", f"file:{users}")  # fmt: skip
    assert r.returncode == 2
    assert str(users) in r.stderr
