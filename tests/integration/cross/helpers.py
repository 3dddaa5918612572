"""What the cross-protocol tests share: the HTTP frontend's ``/v1`` API of the process under
test (publish, pull, a pulled message's body), and a body no text protocol would carry."""

from __future__ import annotations

import base64
from typing import Any, Protocol

import requests

from ...procs import WAIT

BINARY = b"\x00\x01\x02\xfe\xff\x00NUL\x00\r\n\x00"


class HasHttp(Protocol):
    """A process under test with an HTTP listener (``PolymqProcess``, the AMQP tests'
    ``Broker``)."""

    def url(self, name: str = "http") -> str: ...


def post(proc: HasHttp, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    r = requests.post(f"{proc.url('http')}/v1/{path}", json=payload, timeout=WAIT)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def pull(proc: HasHttp, name: str, n: int = 10) -> list[dict[str, Any]]:
    r = requests.post(
        f"{proc.url('http')}/v1/queue/{name}/pull", params={"max": n, "wait": 5}, timeout=WAIT
    )
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def body_of(m: dict[str, Any]) -> bytes:
    if m["encoding"] == "base64":
        return base64.b64decode(m["body"])
    return str(m["body"]).encode()
