"""Errors become RFC 9457 problem details (no sockets)."""

from __future__ import annotations

import json

from aiohttp import web

from polymq.errors import BadRequest, ConnectionClosed, QueueFull, RequestError, Unauthorized
from polymq_server.web.problems import Problem, from_exception


def body(response: web.Response | None) -> dict[str, object]:
    assert response is not None and response.content_type == "application/problem+json"
    assert isinstance(response.body, bytes)
    out: dict[str, object] = json.loads(response.body)
    assert out["status"] == response.status and out["type"] == "about:blank"
    return out


def test_polymq_errors_map_through_their_status() -> None:
    assert body(from_exception(BadRequest("nope")))["detail"] == "nope"
    full = from_exception(QueueFull("full"))
    assert full is not None and full.status == 429 and body(full)["code"] == "queue-full"
    denied = from_exception(Unauthorized("who?"))
    assert denied is not None and denied.status == 401
    assert denied.headers["WWW-Authenticate"] == 'Basic realm="polymq", Bearer'


def test_core_trouble_is_503_or_502() -> None:
    gone = from_exception(ConnectionClosed("lost"))
    assert gone is not None and gone.status == 503 and gone.headers["Retry-After"]
    odd = RequestError("weird")
    odd.code = "weird"
    strange = from_exception(odd)
    assert strange is not None and strange.status == 502


def test_http_errors_keep_their_headers() -> None:
    r = from_exception(web.HTTPMethodNotAllowed("PATCH", ["GET", "PUT"]))
    assert r is not None and r.status == 405 and "PUT" in r.headers["Allow"]
    assert body(r)["title"] == "Method Not Allowed"
    too_big = from_exception(Problem(413, "big"))
    assert too_big is not None and body(too_big)["code"] == "too-large"


def test_other_exceptions_are_not_translated() -> None:
    assert from_exception(ValueError("bug")) is None
