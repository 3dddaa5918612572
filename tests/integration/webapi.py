"""What the integration tests of the aiohttp frontends (HTTP, long polling, Avro) share: a
``requests`` session bound to one frontend, the check of an RFC 9457 problem answer, and one
sample of a Prometheus text exposition."""

from __future__ import annotations

from typing import Any

import requests

TIMEOUT = 40.0  # seconds for one HTTP call (a long poll waits at most 30)


class WebApi:
    """A ``requests`` session bound to the frontend at ``base``, sending ``headers``."""

    def __init__(self, base: str, **headers: str) -> None:
        self.base = base
        self.headers = headers
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


def assert_problem(r: requests.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """``r`` is an RFC 9457 problem with ``status`` (and ``code``); returns its body."""
    assert r.status_code == status, f"{r.status_code}: {r.text[:500]}"
    assert r.headers["Content-Type"].split(";")[0] == "application/problem+json", r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["code"], str) and body["code"]
    if code is not None:
        assert body["code"] == code, body
    return body


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text exposition (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0
