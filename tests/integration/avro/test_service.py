"""The service around the API: health and readiness, metrics, the OpenAPI document, a core
that is away, logins and permissions (listing subjects included), and a graceful stop that
answers waiting reads."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from polymq_server.auth.provider import hash_password

from ...procs import PolymqProcess, serving
from ..webapi import metric
from .conftest import Avro, assert_problem, container, unique, users


def test_health_readiness_and_openapi(api: Avro) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    doc = api.get("/openapi.json").json()
    assert doc["openapi"] == "3.1.0"
    assert "/v1/{kind}/{name}/records" in doc["paths"]
    assert "/v1/schemas/subjects/{subject}/versions" in doc["paths"]


def test_metrics_count_records_batches_and_registry_operations(api: Avro) -> None:
    def scrape() -> str:
        return api.get("/metrics").text

    before = scrape()
    queue = f"queue/{unique('m')}"
    key = {"Idempotency-Key": unique("k")}
    api.published(queue, container(users(7)), headers=key)
    api.published(queue, container(users(7)), headers=key)
    api.publish(queue, b"garbage")
    api.get(f"/v1/{queue}/records", params={"max": 5})
    api.register(unique("m"), {"type": "record", "name": "M", "fields": []})
    after = scrape()

    def grew(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("polymq_avro_records_total", direction="in") == 7
    assert grew("polymq_avro_records_total", direction="out") == 5
    assert grew("polymq_avro_batches_total", outcome="published") == 1
    assert grew("polymq_avro_batches_total", outcome="duplicate") == 1
    assert grew("polymq_avro_batches_total", outcome="rejected") == 1
    assert grew("polymq_avro_duplicate_records_suppressed_total") == 7
    assert grew("polymq_avro_schema_operations_total", op="register", outcome="ok") == 1
    assert grew("polymq_avro_bytes_total", direction="in") > 0
    route = "/v1/{kind}/{name}/records"
    assert grew("polymq_avro_requests_total", method="POST", route=route, status="422") == 1
    assert metric(after, "polymq_avro_core_connected") == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_core_that_is_away(tmp_path: Path) -> None:
    """Not ready, requests answer 503 at once, and it stops cleanly."""
    with serving("avro", tmp_path, "--core", f"127.0.0.1:{free_port()}") as proc:
        api = Avro(proc)
        assert api.get("/healthz").status_code == 200
        assert_problem(api.get("/readyz"), 503, "unavailable")
        started = time.monotonic()
        r = api.publish(f"queue/{unique()}", container(users(2)))
        assert_problem(r, 503, "unavailable")
        assert_problem(api.get("/v1/schemas/subjects"), 503)
        assert time.monotonic() - started < 5


def test_sigterm_answers_a_waiting_read_and_exits_0(tmp_path: Path) -> None:
    proc = PolymqProcess("run", tmp_path).start()
    try:
        api = Avro(proc)
        queue = unique("term")
        api.declare(f"queue/{queue}")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reading = pool.submit(api.get, f"/v1/queue/{queue}/records", params={"wait": 25})
            time.sleep(0.5)
            started = time.monotonic()
            assert proc.proc is not None
            proc.proc.terminate()
            r = reading.result(timeout=15)
        assert r.status_code == 204 and time.monotonic() - started < 10
        assert proc.proc.wait(15) == 0, proc.log()
    finally:
        proc.kill()


# ---- logins and permissions ----------------------------------------------------------------
WRITER, READER, ADMIN = "writer-pw", "reader-pw", "admin-pw"
REGISTRY_READER, ODD_READER = "registry-reader-pw", "odd-reader-pw"


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir = tmp_path_factory.mktemp("avro-auth")
    users_file = workdir / "users.json"
    users_file.write_text(
        json.dumps(
            {
                "users": {
                    "writer": {
                        "password_hash": hash_password(WRITER),
                        "grants": [{"pattern": "queue/in-*", "permissions": ["write"]}],
                    },
                    "reader": {
                        "password_hash": hash_password(READER),
                        "grants": [{"pattern": "queue/*", "permissions": ["read"]}],
                    },
                    "admin": {
                        "password_hash": hash_password(ADMIN),
                        "grants": [{"pattern": "*", "permissions": ["read", "write", "configure"]}],
                    },
                    "registry-reader": {
                        "password_hash": hash_password(REGISTRY_READER),
                        "grants": [{"pattern": "kv/avro/*", "permissions": ["read"]}],
                    },
                    "odd-reader": {  # every subject one by one, yet not "every key under"
                        "password_hash": hash_password(ODD_READER),
                        "grants": [{"pattern": "kv/avro/subjects/?*", "permissions": ["read"]}],
                    },
                }
            }
        )
    )
    with serving("run", workdir, "--auth", f"file:{users_file}") as proc:
        yield proc


def test_logins_and_permissions(secured: PolymqProcess) -> None:
    base = secured.url("avro")
    queue = unique("in")
    body = container(users(3))
    ctype = {"Content-Type": "application/avro"}

    def post(path: str, headers: dict[str, str], **kw: object) -> requests.Response:
        return requests.post(base + path, headers={**ctype, **headers}, timeout=10, **kw)  # type: ignore[arg-type]

    assert_problem(post(f"/v1/queue/{queue}/records", {}, data=body), 401)
    assert "WWW-Authenticate" in post(f"/v1/queue/{queue}/records", {}, data=body).headers
    assert_problem(post(f"/v1/queue/{queue}/records", basic("writer", "wrong"), data=body), 401)
    r = post(f"/v1/queue/{queue}/records", basic("writer", WRITER), data=body)
    assert r.status_code == 200 and r.json()["count"] == 3
    assert_problem(post(f"/v1/queue/other-{queue}/records", basic("writer", WRITER), data=body),
                   403)  # fmt: skip
    # registering schemas needs WRITE on kv/avro/subjects/<subject>: only '*' grants that
    schema = {"schema": {"type": "record", "name": "A", "fields": []}}
    assert_problem(
        requests.post(f"{base}/v1/schemas/subjects/s1/versions", json=schema,
                      headers=basic("writer", WRITER), timeout=10), 403)  # fmt: skip
    r = requests.post(f"{base}/v1/schemas/subjects/{unique()}/versions", json=schema,
                      headers=basic("admin", ADMIN), timeout=10)  # fmt: skip
    assert r.status_code == 200
    # publishing with ?subject= needs the subject's permission too
    assert_problem(
        post(f"/v1/queue/{queue}/records?subject=s1", basic("writer", WRITER), data=body), 403
    )
    # reading needs READ on the queue; settling too
    assert_problem(
        requests.get(f"{base}/v1/queue/{queue}/records", headers=basic("writer", WRITER),
                     timeout=10), 403)  # fmt: skip
    r = requests.get(f"{base}/v1/queue/{queue}/records", params={"max": 10},
                     headers={**basic("reader", READER), "Accept": "application/json"},
                     timeout=10)  # fmt: skip
    assert r.status_code == 200 and len(r.json()["records"]) == 3
    receipts = [rec["receipt"] for rec in r.json()["records"]]
    assert_problem(requests.post(f"{base}/v1/ack", json={"receipts": receipts},
                                 headers=basic("writer", WRITER), timeout=10), 403)  # fmt: skip
    r = requests.post(f"{base}/v1/ack", json={"receipts": receipts},
                      headers=basic("reader", READER), timeout=10)  # fmt: skip
    assert r.status_code == 200 and r.json() == {"settled": 3, "missing": []}


def test_listing_subjects_needs_read_on_every_subject(secured: PolymqProcess) -> None:
    """As the core checks a key/value listing: a grant ending in '*' that matches the prefix
    kv/avro/subjects/ itself. kv/avro/subjects/?* reads each subject, but lists none."""
    base = secured.url("avro")
    subject = unique("listed")
    schema = {"schema": {"type": "record", "name": "L", "fields": []}}

    def get(path: str, user: str, password: str) -> requests.Response:
        return requests.get(base + path, headers=basic(user, password), timeout=10)

    r = requests.post(f"{base}/v1/schemas/subjects/{subject}/versions", json=schema,
                      headers=basic("admin", ADMIN), timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text
    # the odd grant reads the subject itself (so the 403s below are about listing) ...
    r = get(f"/v1/schemas/subjects/{subject}/versions", "odd-reader", ODD_READER)
    assert r.status_code == 200 and r.json() == [1], r.text
    assert get(f"/v1/schemas/subjects/{subject}/versions/1", "odd-reader", ODD_READER).ok
    # ... but not the list of subjects, nor the server's default rule
    body = assert_problem(get("/v1/schemas/subjects", "odd-reader", ODD_READER), 403)
    assert "kv/avro/subjects/*" in body["detail"], body
    assert_problem(get("/v1/schemas/config", "odd-reader", ODD_READER), 403)
    # kv/avro/* and * list them
    for user, password in (("registry-reader", REGISTRY_READER), ("admin", ADMIN)):
        r = get("/v1/schemas/subjects", user, password)
        assert r.status_code == 200 and subject in r.json(), (user, r.text)
        r = get("/v1/schemas/config", user, password)
        assert r.status_code == 200 and "compatibility" in r.json(), (user, r.text)
    # grants on queues alone list no subjects
    assert_problem(get("/v1/schemas/subjects", "reader", READER), 403)
