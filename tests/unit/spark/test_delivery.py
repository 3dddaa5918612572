"""Posting a batch (polymq_spark.delivery) through a scripted transport: the headers, what is
retried (always under the same Idempotency-Key), what fails at once, and the answer check."""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from polymq_spark.delivery import MAX_BACKOFF, Answer, Poster
from polymq_spark.errors import DeliveryError
from polymq_spark.options import parse_options

BASE = {"url": "http://127.0.0.1:1", "destination": "stream/s", "retryBackoff": "0.5"}


def ok(count: int, duplicate: bool = False) -> Answer:
    doc = {"count": count, "schema_id": 7, "ids": [], "seqs": [], "duplicate": duplicate}
    return Answer(200, {"content-type": "application/json"}, json.dumps(doc).encode())


def problem(status: int, title: str, headers: Mapping[str, str] | None = None) -> Answer:
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": "why"})
    return Answer(
        status, {"content-type": "application/problem+json", **(headers or {})}, body.encode()
    )


@dataclass
class Scripted:
    """Answers (or raises) from a script, recording every request."""

    script: list[Answer | BaseException]
    requests: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)
    closed: int = 0

    def post(self, target: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        self.requests.append((target, body, dict(headers)))
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    def close(self) -> None:
        self.closed += 1


def poster(
    script: list[Answer | BaseException], **options: str
) -> tuple[Poster, Scripted, list[float]]:
    t = Scripted(script)
    slept: list[float] = []
    p = Poster(parse_options({**BASE, **options}), t, sleep=slept.append, jitter=lambda: 1.0)
    return p, t, slept


def test_a_batch_is_posted_once_with_its_key_and_headers() -> None:
    p, t, slept = poster([ok(3)], persistent="true")
    r = p.post("w-0-0", b"OBJ", 3)
    assert (r.count, r.duplicate, r.tries, r.schema_id) == (3, False, 1, 7)
    [(target, body, headers)] = t.requests
    assert target == "/v1/stream/s/records?persistent=true" and body == b"OBJ"
    assert headers["Idempotency-Key"] == "w-0-0"
    assert headers["Content-Type"] == "avro/binary"
    assert "Authorization" not in headers and slept == [] and p.retried == 0


def test_auth_headers() -> None:
    p, t, _ = poster([ok(1)], token="s3cret")
    p.post("b", b"", 1)
    assert t.requests[0][2]["Authorization"] == "Bearer s3cret"
    p, t, _ = poster([ok(1)], user="ann", password="pw:x")
    p.post("b", b"", 1)
    assert t.requests[0][2]["Authorization"] == "Basic " + base64.b64encode(b"ann:pw:x").decode()


def test_a_duplicate_answer_is_reported() -> None:
    p, _, _ = poster([ok(2, duplicate=True)])
    assert p.post("b", b"", 2).duplicate is True


@pytest.mark.parametrize(
    "failure",
    [
        problem(503, "Unavailable"),
        problem(500, "Internal"),
        problem(429, "Too many"),
        problem(408, "Timeout"),
        ConnectionResetError("reset by peer"),
        TimeoutError("timed out"),
        http.client.RemoteDisconnected("closed"),
    ],
)
def test_transient_failures_are_retried_with_the_same_key(failure: Answer | BaseException) -> None:
    p, t, slept = poster([failure, failure, ok(4)])
    r = p.post("w-3-9", b"BODY", 4)
    assert r.tries == 3 and p.retried == 2
    assert [h["Idempotency-Key"] for _, _, h in t.requests] == ["w-3-9"] * 3
    assert [b for _, b, _ in t.requests] == [b"BODY"] * 3
    assert slept == [0.5, 1.0]  # doubling from retryBackoff


def test_retry_after_is_honoured() -> None:
    p, _, slept = poster([problem(503, "busy", {"retry-after": "2"}), ok(1)])
    p.post("b", b"", 1)
    assert slept == [2.0]


def test_backoff_is_capped() -> None:
    p, _, _ = poster([])
    assert p.backoff(0) == 0.5 and p.backoff(3) == 4.0 and p.backoff(20) == MAX_BACKOFF


def test_giving_up_says_what_happened_last() -> None:
    p, t, slept = poster([problem(502, "Bad gateway")] * 3, retries="2")
    with pytest.raises(
        DeliveryError, match=r"failed 3 time\(s\), last: HTTP 502: Bad gateway: why"
    ) as err:
        p.post("b-1", b"", 1)
    assert err.value.batch_id == "b-1" and len(t.requests) == 3 and len(slept) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 415, 422])
def test_a_client_error_fails_at_once_with_the_servers_problem(status: int) -> None:
    p, t, slept = poster([problem(status, "Nope")])
    with pytest.raises(DeliveryError, match=f"refused: HTTP {status}: Nope: why") as err:
        p.post("b", b"", 1)
    assert err.value.status == status and len(t.requests) == 1 and slept == []


def test_a_non_json_error_body_is_quoted() -> None:
    p, _, _ = poster([Answer(400, {}, b"plain words")])
    with pytest.raises(DeliveryError, match="plain words"):
        p.post("b", b"", 1)


def test_a_short_count_is_an_error_not_a_silent_loss() -> None:
    p, _, _ = poster([ok(4)])
    with pytest.raises(DeliveryError, match="sent 5 records, the frontend accepted 4"):
        p.post("b", b"", 5)


def test_a_success_that_is_not_json_is_an_error() -> None:
    p, _, _ = poster([Answer(200, {}, b"<html>")])
    with pytest.raises(DeliveryError, match="not JSON"):
        p.post("b", b"", 1)


def test_close_closes_the_transport() -> None:
    p, t, _ = poster([])
    p.close()
    assert t.closed == 1
