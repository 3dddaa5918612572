"""Delivering one batch: POST an Avro container to the Avro frontend, retrying what may be
retried with the same ``Idempotency-Key`` so that a retry never makes a second copy.

:class:`Poster` holds the policy (headers, retries, backoff, checking the answer) and talks
through a :class:`Transport`; :class:`HttpTransport` is the real one (``http.client``, one
keep-alive connection per task), and tests give a fake one instead. Retried: connection errors,
timeouts, 408, 429 and every 5xx (after ``Retry-After`` when the server sends one, else
``retryBackoff`` doubling up to 30 s). Any other 4xx fails the task at once with the problem
the server described.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import random
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from .errors import DeliveryError
from .options import WriteOptions

__all__ = ["MAX_BACKOFF", "Answer", "HttpTransport", "Poster", "Receipt", "Transport"]

log = logging.getLogger(__name__)

MAX_BACKOFF = 30.0
RETRYABLE = frozenset({408, 425, 429})
USER_AGENT = "polymq-spark/0.1"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclass(frozen=True)
class Receipt:
    """What the frontend said about one delivered batch."""

    count: int
    duplicate: bool  # the batch id had been seen: this POST was a no-op (a retry)
    tries: int  # POSTs it took (1: no retry)
    schema_id: Any = None


class Transport(Protocol):
    def post(self, target: str, body: bytes, headers: Mapping[str, str]) -> Answer: ...

    def close(self) -> None: ...


class HttpTransport:
    """One keep-alive HTTP/1.1 connection to the frontend, reopened after any failure."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.https:
            ctx = ssl.create_default_context()
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=ctx
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def post(self, target: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        if self._conn is None:
            self._conn = self._connect()
        conn = self._conn
        try:
            conn.request("POST", target, body=body, headers=dict(headers))
            resp = conn.getresponse()
            data = resp.read()
        except BaseException:
            self.close()
            raise
        answer = Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        if resp.will_close:
            self.close()
        return answer

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Poster:
    """Posts batches for one task; ``sleep`` and ``jitter`` are injectable for tests."""

    def __init__(
        self,
        options: WriteOptions,
        transport: Transport,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.options = options
        self.transport = transport
        self.sleep = sleep
        self.jitter = jitter
        self.target = options.records_path
        self.headers = {
            "Content-Type": "avro/binary",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        if options.token is not None:
            self.headers["Authorization"] = f"Bearer {options.token}"
        elif options.user is not None and options.password is not None:
            pair = f"{options.user}:{options.password}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        self.retried = 0  # POSTs repeated, over every batch

    def close(self) -> None:
        self.transport.close()

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (0-based): doubling, capped, with up to
        25% of jitter so that the tasks of one stage do not come back all at once."""
        base: float = min(MAX_BACKOFF, self.options.retry_backoff * 2.0**attempt)
        return base * (0.75 + 0.25 * self.jitter())

    def post(self, batch_id: str, body: bytes, count: int) -> Receipt:
        """Deliver one container of ``count`` records under ``batch_id`` (the idempotency key)."""
        headers = {**self.headers, "Idempotency-Key": batch_id}
        tries = self.options.retries + 1
        for attempt in range(tries):
            retry_after: float | None = None
            try:
                answer = self.transport.post(self.target, body, headers)
            except (OSError, http.client.HTTPException) as exc:
                why = f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= answer.status < 300:
                    return self._receipt(batch_id, answer, count, attempt + 1)
                why = f"HTTP {answer.status}: {_problem(answer)}"
                if answer.status < 500 and answer.status not in RETRYABLE:
                    raise DeliveryError(
                        f"POST {self.options.destination} batch {batch_id} refused: {why}",
                        status=answer.status,
                        batch_id=batch_id,
                    )
                retry_after = _retry_after(answer)
            if attempt + 1 == tries:
                raise DeliveryError(
                    f"POST {self.options.destination} batch {batch_id} failed {tries} time(s), "
                    f"last: {why}",
                    batch_id=batch_id,
                )
            delay = retry_after if retry_after is not None else self.backoff(attempt)
            log.warning(
                "polymq: batch %s to %s: %s; retry %d of %d in %.2fs",
                batch_id,
                self.options.destination,
                why,
                attempt + 1,
                tries - 1,
                delay,
            )
            self.retried += 1
            self.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _receipt(self, batch_id: str, answer: Answer, count: int, tries: int) -> Receipt:
        try:
            doc = json.loads(answer.body)
        except ValueError:
            raise DeliveryError(
                f"batch {batch_id}: the answer is not JSON: {answer.body[:200]!r}",
                status=answer.status,
                batch_id=batch_id,
            ) from None
        got = doc.get("count") if isinstance(doc, dict) else None
        if got != count:
            raise DeliveryError(
                f"batch {batch_id}: sent {count} records, the frontend accepted {got!r}",
                status=answer.status,
                batch_id=batch_id,
            )
        return Receipt(
            count=count,
            duplicate=bool(doc.get("duplicate", False)),
            tries=tries,
            schema_id=doc.get("schema_id"),
        )


def _problem(answer: Answer) -> str:
    """The server's own account of an error (problem+json ``title: detail``), or its text."""
    try:
        doc = json.loads(answer.body)
    except ValueError:
        return answer.body[:300].decode("utf-8", "replace") or "(empty body)"
    if isinstance(doc, dict):
        parts = [str(doc[k]) for k in ("title", "detail") if doc.get(k)]
        if parts:
            return ": ".join(parts)
    return json.dumps(doc)[:300]


def _retry_after(answer: Answer) -> float | None:
    raw = answer.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return min(MAX_BACKOFF, max(0.0, float(raw)))
    except ValueError:
        return None  # an HTTP date: use our own backoff
