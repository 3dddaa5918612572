"""``polymq check``: one message through each frontend of a real ``polymq run`` and back, one
line per frontend, exit 0; a frontend that is not there, or answers nothing, is a FAILED line
with the reason and exit 1, within the timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ...procs import PolymqProcess, serving


def _check(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymq_cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "POLYMQ_LOG_LEVEL": "WARNING"},
    )


def _lines(out: str) -> dict[str, str]:
    """kind -> the rest of its line."""
    return {line.split()[0]: line for line in out.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    with serving("run", tmp_path_factory.mktemp("check-run")) as proc:
        yield proc


def _every_frontend(proc: PolymqProcess) -> list[str]:
    p = proc.ports
    return [
        "--http", f"http://127.0.0.1:{p['http']}",
        "--longpoll", f"http://127.0.0.1:{p['longpoll']}",
        "--avro", f"http://127.0.0.1:{p['avro']}",
        "--stomp", f"127.0.0.1:{p['stomp']}",
        "--amqp", f"amqp://guest:guest@127.0.0.1:{p['amqp']}/",
        "--core", f"127.0.0.1:{p['core']}",
    ]  # fmt: skip


def test_every_frontend_passes(server: PolymqProcess) -> None:
    done = _check(*_every_frontend(server), "--timeout", "20")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = _lines(done.stdout)
    assert list(lines) == ["http", "longpoll", "avro", "stomp", "amqp", "core"], done.stdout
    for line in lines.values():
        assert " ok (" in line, line
    assert "guest:***@" in lines["amqp"] and "guest:guest" not in done.stdout


def test_one_frontend_alone(server: PolymqProcess) -> None:
    done = _check("--stomp", f"127.0.0.1:{server.ports['stomp']}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(_lines(done.stdout)) == ["stomp"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_frontend_that_is_not_there_fails_clearly_and_at_once(server: PolymqProcess) -> None:
    port = _closed_port()
    started = time.monotonic()
    done = _check(
        "--http", f"http://127.0.0.1:{server.ports['http']}",
        "--stomp", f"127.0.0.1:{port}",
        "--amqp", f"amqp://127.0.0.1:{port}/",
        "--avro", f"http://127.0.0.1:{port}",
        "--timeout", "20",
    )  # fmt: skip
    assert time.monotonic() - started < 15, "a refused connection is not waited out"
    assert done.returncode == 1, done.stdout + done.stderr
    lines = _lines(done.stdout)
    assert " ok (" in lines["http"], lines  # the one that is there still passes
    for kind in ("stomp", "amqp", "avro"):
        assert f"127.0.0.1:{port}" in lines[kind] and "FAILED (" in lines[kind], lines[kind]
        assert "cannot connect" in lines[kind] or "Connect call failed" in lines[kind], lines
    assert "Traceback" not in done.stderr, done.stderr


def test_a_listener_that_never_answers_times_out(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts (the kernel's backlog) and says nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        done = _check(
            "--stomp", f"127.0.0.1:{port}",
            "--http", f"http://127.0.0.1:{port}",
            "--amqp", f"amqp://127.0.0.1:{port}/",
            "--timeout", "2",
        )  # fmt: skip
        took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert took < 12, f"took {took:.1f} s with --timeout 2"
    lines = _lines(done.stdout)
    assert set(lines) == {"stomp", "http", "amqp"}, done.stdout
    for line in lines.values():
        assert "FAILED (" in line and "timed out" in line, line


def test_nothing_to_check_is_a_usage_error() -> None:
    done = _check()
    assert done.returncode == 2
    assert "give at least one of --http" in done.stderr
