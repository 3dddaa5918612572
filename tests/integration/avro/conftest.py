"""Fixtures for the Avro frontend's integration tests: one ``polymq run`` per module (core
and every frontend on 127.0.0.1, ephemeral ports), reached with ``requests`` and fastavro;
the core's stats are read through the JSON over HTTP frontend."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
import requests

from ...procs import PolymqProcess, serving
from ..webapi import TIMEOUT, WebApi
from ..webapi import assert_problem as assert_problem

USER = {
    "type": "record",
    "name": "User",
    "namespace": "test.polymq",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "score", "type": "double"},
        {"name": "avatar", "type": "bytes"},
    ],
}


def unique(prefix: str = "av") -> str:
    """A destination or subject name no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def users(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "name": f"user {i}",
            "email": None if i % 4 == 0 else f"u{i}@example.com",
            "score": i * 0.25,
            "avatar": i.to_bytes(4, "big"),
        }
        for i in range(start, start + n)
    ]


def container(
    records: list[dict[str, Any]], schema: Any = None, codec: str = "deflate", **kw: Any
) -> bytes:
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema or USER), records, codec=codec, **kw)
    return out.getvalue()


def read_container(data: bytes) -> tuple[list[Any], dict[str, str]]:
    reader = fastavro.reader(io.BytesIO(data))
    return list(reader), dict(reader.metadata)


class Avro(WebApi):
    """A ``requests`` session bound to one Avro frontend (and its HTTP neighbour for stats)."""

    def __init__(self, proc: PolymqProcess) -> None:
        super().__init__(proc.url("avro"))
        self.proc = proc
        self.http = proc.url("http") if "http" in proc.ports else None

    def fresh(self) -> Avro:
        """Another client of the same frontend (its own connections)."""
        return Avro(self.proc)

    # ---- the common moves ------------------------------------------------------------------
    def publish(
        self,
        dest: str,
        body: bytes,
        content_type: str = "application/avro",
        headers: dict[str, str] | None = None,
        **params: Any,
    ) -> requests.Response:
        return self.post(
            f"/v1/{dest}/records",
            data=body,
            params=params,
            headers={"Content-Type": content_type, **(headers or {})},
        )

    def published(self, dest: str, body: bytes, **kw: Any) -> dict[str, Any]:
        r = self.publish(dest, body, **kw)
        assert r.status_code == 200, r.text[:500]
        out: dict[str, Any] = r.json()
        return out

    def register(self, subject: str, schema: Any) -> requests.Response:
        return self.post(f"/v1/schemas/subjects/{subject}/versions", json={"schema": schema})

    def ack(self, receipts: list[str]) -> None:
        for i in range(0, len(receipts), 1000):
            r = self.post("/v1/ack", json={"receipts": receipts[i : i + 1000]})
            assert r.status_code == 200, r.text
            assert r.json()["settled"] == len(receipts[i : i + 1000])

    def declare(self, dest: str, **options: Any) -> None:
        assert self.http is not None
        r = requests.put(f"{self.http}/v1/{dest}", json=options, timeout=TIMEOUT)
        assert r.status_code == 200, r.text

    def stats(self, dest: str) -> dict[str, Any]:
        """The core's stats of ``dest`` (through the HTTP frontend)."""
        assert self.http is not None
        r = requests.get(f"{self.http}/v1/{dest}", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def depth(self, dest: str) -> int:
        """Messages held in ``dest``; 0 once the core forgot it (an idle queue with default
        options leaves memory when it is empty and unused, and stats then answer 404)."""
        assert self.http is not None
        r = requests.get(f"{self.http}/v1/{dest}", timeout=TIMEOUT)
        if r.status_code == 404 and r.json().get("code") == "not-found":
            return 0
        assert r.status_code == 200, r.text
        return int(r.json()["messages"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """One ``polymq run`` shared by a module's tests; each test uses its own destinations
    and subjects. It must still be alive at the end, and stop cleanly."""
    with serving("run", tmp_path_factory.mktemp("avro-run")) as proc:
        yield proc


@pytest.fixture
def api(server: PolymqProcess) -> Avro:
    return Avro(server)
