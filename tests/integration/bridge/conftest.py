"""Fixtures for the RabbitMQ bridge's integration tests.

Everything is real and local: a private RabbitMQ node started by the tests
(:mod:`tests.rabbit`, once for the package: it takes seconds; any RabbitMQ already on
:5672 is left alone), a ``polymq core`` process, and the bridge itself as a subprocess
(``python -m polymq_bridge.main``) with a links file, reached over its metrics port.
Clients are aio-pika on the RabbitMQ side and :class:`polymq.Client` on the polymq side.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ...procs import LoggedProcess, PolymqProcess, serving
from ...rabbit import RabbitNode, find_server, rabbit_node

WAIT = 20.0


def unique(prefix: str = "b") -> str:
    """A destination / queue name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class BridgeProcess(LoggedProcess):
    """``python -m polymq_bridge.main`` with a links file; ``metrics()`` to read it."""

    def __init__(
        self,
        workdir: Path,
        links: list[dict[str, Any]] | None,
        *,
        rabbit_url: str,
        core_port: int,
        env: dict[str, str] | None = None,
        config_text: str | None = None,
    ) -> None:
        super().__init__(
            workdir / "bridge.log",
            {
                # quick reconnects, so that a restart costs the test little time
                "POLYMQ_BRIDGE_BACKOFF_MIN": "0.05",
                "POLYMQ_BRIDGE_BACKOFF_MAX": "0.5",
                "POLYMQ_BRIDGE_STATS_INTERVAL": "0.5",
                **(env or {}),
            },
        )
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "links.json"
        self.config.write_text(
            config_text if config_text is not None else json.dumps({"links": links})
        )
        self.rabbit_url = rabbit_url
        self.core_port = core_port
        self.ports_file = workdir / "bridge-ports.json"
        self.port = 0

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "polymq_bridge.main",
            "--config",
            str(self.config),
            "--rabbitmq-url",
            self.rabbit_url,
            "--core",
            f"127.0.0.1:{self.core_port}",
            "--bridge-port",
            "0",
            "--ports-file",
            str(self.ports_file),
        ]

    def start(self, timeout: float = 20.0) -> BridgeProcess:
        self.port = self.spawn(self.argv(), self.ports_file, "the bridge", timeout)["bridge"]
        return self

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict[str, float]:
        """Every sample as ``name{labels}`` -> value (labels as Prometheus prints them)."""
        status, text = self.get("/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name: str, **labels: str) -> float:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return self.metrics().get(f"{name}{{{inner}}}" if labels else name, 0.0)

    def wait_metric(self, name: str, value: float, timeout: float = WAIT, **labels: str) -> None:
        """Wait until the metric reaches ``value`` (at least)."""
        deadline = time.monotonic() + timeout
        while (got := self.metric(name, **labels)) < value:
            assert time.monotonic() < deadline, f"{name}{labels} = {got}, expected {value}"
            time.sleep(0.05)

    def wait_ready(self, timeout: float = WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.get("/readyz")
            if status == 200:
                doc: dict[str, Any] = json.loads(body)
                return doc
            assert time.monotonic() < deadline, f"not ready: {body}\n{self.log()[-3000:]}"
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (the bridge lets what is in flight be confirmed first); the exit code."""
        return super().stop(timeout)


@pytest.fixture(scope="package")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A private RabbitMQ node for the package's modules (its own node name, ports and data;
    every test uses queues of its own, and the fault test that restarts it leaves it
    running on the same port)."""
    if find_server() is None:
        pytest.skip("rabbitmq-server is not installed")
    with rabbit_node(tmp_path_factory.mktemp("rabbit")) as node:
        yield node


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    with serving("core", tmp_path_factory.mktemp("core")) as proc:
        yield proc


@pytest.fixture
def bridge_factory(tmp_path: Path, rabbit: RabbitNode, core: PolymqProcess) -> Iterator[Any]:
    """Start bridges with a links list; each is killed at the end of the test."""
    started: list[BridgeProcess] = []

    def make(
        links: list[dict[str, Any]], *, core_port: int | None = None, **kw: Any
    ) -> BridgeProcess:
        b = BridgeProcess(
            tmp_path / f"bridge{len(started)}",
            links,
            rabbit_url=rabbit.url,
            core_port=core_port or core.ports["core"],
            **kw,
        )
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.kill()
