"""Fixtures for the HTTP frontend's integration tests: real ``polymq`` processes on
127.0.0.1 with ephemeral ports, reached with ``requests`` and ``aiohttp``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from ...procs import PolymqProcess, serving

TIMEOUT = 40.0  # seconds for one HTTP call (a long poll waits at most 30)


class Api:
    """A ``requests`` session bound to one HTTP frontend."""

    def __init__(self, base: str, **headers: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers.update(headers)

    def request(self, method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", TIMEOUT)
        return self.session.request(method, self.base + path, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.request("POST", path, **kw)

    def put(self, path: str, **kw: Any) -> requests.Response:
        return self.request("PUT", path, **kw)

    def delete(self, path: str, **kw: Any) -> requests.Response:
        return self.request("DELETE", path, **kw)

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


def assert_problem(r: requests.Response, status: int) -> dict[str, Any]:
    """``r`` is an RFC 9457 problem with ``status``; returns its body."""
    assert r.status_code == status, f"{r.status_code}: {r.text}"
    assert r.headers["Content-Type"].split(";")[0] == "application/problem+json", r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


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
