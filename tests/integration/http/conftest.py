"""Fixtures for the HTTP frontend's integration tests: real ``polymq`` processes on
127.0.0.1 with ephemeral ports, reached with ``requests`` and ``aiohttp``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ...procs import PolymqProcess, serving
from ..webapi import WebApi
from ..webapi import assert_problem as assert_problem


class Api(WebApi):
    """A ``requests`` session bound to one HTTP frontend."""

    # ---- the common moves ----------------------------------------------------------------
    def publish(self, dest: str, payload: dict[str, Any]) -> dict[str, Any]:
        r = self.post(f"/v1/{dest}/messages", json=payload)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def pull(self, queue: str, **params: Any) -> list[dict[str, Any]]:
        r = self.post(f"/v1/queue/{queue}/pull", params=params)
        assert r.status_code == 200, r.text
        messages: list[dict[str, Any]] = r.json()["messages"]
        return messages

    def ack(self, *receipts: str) -> dict[str, Any]:
        r = self.post("/v1/ack", json={"receipts": list(receipts)})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


def unique(prefix: str = "t") -> str:
    """A queue name no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def start_run(workdir: Path, *args: str, env: dict[str, str] | None = None) -> PolymqProcess:
    proc = PolymqProcess("run", workdir, *args, env=env).start()
    return proc


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """One ``polymq run`` (what ``make run`` starts) shared by a module's tests; each test
    uses its own queue names. It must still be alive at the end, and stop cleanly."""
    with serving("run", tmp_path_factory.mktemp("http-run")) as proc:
        yield proc


@pytest.fixture
def api(server: PolymqProcess) -> Api:
    return Api(server.url("http"))
