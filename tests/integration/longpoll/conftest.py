"""Fixtures for the long-polling frontend's integration tests: real ``polymq`` processes on
127.0.0.1 with ephemeral ports, reached with ``requests`` (and ``aiohttp`` where many
requests run at once). :class:`EventStream` reads Server-Sent Events the way a browser's
EventSource does: every event that reaches the socket is taken."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from ...procs import PolymqProcess, serving
from ..webapi import WebApi
from ..webapi import assert_problem as assert_problem
from ..webapi import metric as metric

# a short keep-alive so that an idle event stream wakes its reader every second; the key of
# the subscription ids (the same for every process, as for replicas), so that a test can
# sign one itself
SECRET = "longpoll-tests-secret-0123456789abcdef"
ENV = {"POLYMQ_LONGPOLL_KEEPALIVE": "1", "POLYMQ_LONGPOLL_SECRET": SECRET}


def unique(prefix: str = "lp") -> str:
    """A destination name no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Event:
    id: str | None
    event: str
    data: dict[str, Any]


class EventStream:
    """One ``GET .../events`` response, parsed as it arrives."""

    def __init__(self, response: requests.Response) -> None:
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"].startswith("text/event-stream")
        self.response = response
        self._chunks = response.iter_content(chunk_size=None)
        self._buffer = ""
        self._fields: dict[str, list[str]] = {}
        self.events: list[Event] = []  # every event received so far
        self.comments = 0
        self.retry: int | None = None
        self.ended = False

    def _feed(self, text: str) -> None:
        self._buffer += text
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            if not line:
                if "data" in self._fields:
                    ids = self._fields.get("id")
                    self.events.append(
                        Event(
                            ids[-1] if ids else None,
                            (self._fields.get("event") or ["message"])[-1],
                            json.loads("\n".join(self._fields["data"])),
                        )
                    )
                self._fields = {}
            elif line.startswith(":"):
                self.comments += 1
            else:
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "retry":
                    self.retry = int(value)
                else:
                    self._fields.setdefault(name, []).append(value)

    def read(self, n: int, timeout: float = 10.0) -> list[Event]:
        """Read until at least ``n`` events in all (or the deadline, or the end); everything
        that arrived is kept, as EventSource would dispatch it."""
        deadline = time.monotonic() + timeout
        while len(self.events) < n and time.monotonic() < deadline and not self.ended:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self.ended = True
                break
            self._feed(chunk.decode("utf-8"))
        return self.events

    def read_for(self, seconds: float) -> list[Event]:
        """Read whatever comes within ``seconds`` (keep-alives wake the reader)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.ended:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self.ended = True
                break
            self._feed(chunk.decode("utf-8"))
        return self.events

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Longpoll(WebApi):
    """A ``requests`` session bound to one longpoll frontend, with the common moves."""

    def open(self, destination: str, **options: Any) -> dict[str, Any]:
        r = self.post("/v1/subscriptions", json={"destination": destination, **options})
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        return out

    def poll(self, sub: str, cursor: str | None = None, **params: Any) -> dict[str, Any]:
        if cursor is not None:
            params["cursor"] = cursor
        r = self.get(f"/v1/subscriptions/{sub}/poll", params=params)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def publish(self, destination: str, body: str, **fields: Any) -> dict[str, Any]:
        r = self.post(f"/v1/{destination}/messages", json={"body": body, **fields})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def settle(self, action: str, *receipts: str) -> dict[str, Any]:
        r = self.post(f"/v1/{action}", json={"receipts": list(receipts)})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def events(self, sub: str, last_event_id: str | None = None, **params: Any) -> EventStream:
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        # a fresh connection each time, as a browser reconnecting
        response = requests.get(
            f"{self.base}/v1/subscriptions/{sub}/events",
            params=params,
            headers={**self.headers, **headers},
            stream=True,
            timeout=(5, 10),
        )
        return EventStream(response)

    def fresh(self) -> Longpoll:
        """Another client of the same frontend (its own connections)."""
        return Longpoll(self.base, **self.headers)


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """One ``polymq run`` (core and every frontend) shared by a module's tests; each test
    uses its own destinations. It must still be alive at the end, and stop cleanly."""
    with serving("run", tmp_path_factory.mktemp("longpoll-run"), env=ENV) as proc:
        yield proc


@pytest.fixture
def lp(server: PolymqProcess) -> Longpoll:
    return Longpoll(server.url("longpoll"))


def start(command: str, workdir: Path, *args: str) -> PolymqProcess:
    return PolymqProcess(command, workdir, *args, env=ENV).start()
