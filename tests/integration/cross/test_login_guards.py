"""What the HTTP listeners check before they read a request's body, and how failed logins
are held back, against one ``polymq run --auth``: the core's admin API takes only JSON
writes (415) and no browser's cross-site write (403), while the CLI and a same-origin page
still work; a login is refused before a large body is read, the connection closed; a flood
of bad logins from one address neither slows a good login from another nor gets past its
block (429 with ``Retry-After``); new password hashes cost OWASP's N=2^17, and an old
N=2^14 hash still logs in; JSON nested too deeply is a 400 on the admin API."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import stomp
from stomp.exception import ConnectFailedException

from ...procs import PolymqProcess, serving
from ..webapi import assert_problem

ADMIN = ("admin", "admin-secret")
OLD = ("old", "old-secret")  # a hash made before the cost went up (N=2^14)
GOOD = [("good1", "good1-secret"), ("good2", "good2-secret")]  # fresh logins, not remembered
VICTIM = ("victim", "victim-secret")
EVERYTHING = [{"pattern": "queue/*", "permissions": ["read", "write", "configure"]}]
BAD_SOURCE = "127.0.0.2"  # the flood's address (loopback: any 127.x answers)
FLOOD = 32  # bad logins sent at once
WAIT = 30.0


def scrypt_hash(password: str, n: int) -> str:
    """A users file's ``scrypt$n$8$1$salt$hash``, made here at the cost ``n``."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=8, p=1, maxmem=128 * 8 * (n + 3) + 2**20, dklen=32
    )
    b64 = base64.b64encode
    return f"scrypt${n}$8$1${b64(salt).decode()}${b64(digest).decode()}"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir = tmp_path_factory.mktemp("login-guards")
    users: dict[str, Any] = {
        ADMIN[0]: {
            "password_hash": scrypt_hash(ADMIN[1], 2**14),
            "grants": EVERYTHING,
            "tags": ["administrator"],
        },
        OLD[0]: {"password_hash": scrypt_hash(OLD[1], 2**14), "grants": EVERYTHING},
    }
    for name, password in [*GOOD, VICTIM]:
        users[name] = {"password_hash": scrypt_hash(password, 2**17), "grants": EVERYTHING}
    users_file = Path(workdir) / "users.json"
    users_file.write_text(json.dumps({"users": users}))
    with serving("run", workdir, "--auth", f"file:{users_file}") as proc:
        yield proc


def queue() -> str:
    return f"guards-{secrets.token_hex(4)}"


# ---- the admin API: JSON writes only, none from another site ---------------------------------
def test_admin_writes_must_be_json(run: PolymqProcess) -> None:
    url = f"{run.url('admin')}/api/destinations/queue/{queue()}/messages"
    body = json.dumps({"body": "hello"})
    for headers in ({"Content-Type": "text/plain"}, {}):  # a form's type, or none at all
        r = requests.post(url, data=body, headers=headers, auth=ADMIN, timeout=WAIT)
        assert_problem(r, 415)
        assert "application/json" in r.json()["detail"]
    r = requests.post(url, data=body, auth=ADMIN, timeout=WAIT, headers=_json())
    assert r.status_code == 201, r.text


def _json(**more: str) -> dict[str, str]:
    return {"Content-Type": "application/json", **more}


def test_admin_refuses_a_browsers_cross_site_write(run: PolymqProcess) -> None:
    admin = run.url("admin")
    name = queue()
    url = f"{admin}/api/destinations/queue/{name}/messages"
    body = json.dumps({"body": "from a page"})
    for foreign in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
    ):
        r = requests.post(url, data=body, headers=_json(**foreign), auth=ADMIN, timeout=WAIT)
        assert_problem(r, 403, "cross-site")
        r = requests.delete(
            f"{admin}/api/destinations/queue/{name}", headers=foreign, auth=ADMIN, timeout=WAIT
        )
        assert_problem(r, 403, "cross-site")
    # the console: a page of the admin's own origin, using fetch
    same = _json(Origin=admin, **{"Sec-Fetch-Site": "same-origin"})
    r = requests.post(url, data=body, headers=same, auth=ADMIN, timeout=WAIT)
    assert r.status_code == 201, r.text
    # a browser that sends Origin only
    r = requests.post(url, data=body, headers=_json(Origin=admin), auth=ADMIN, timeout=WAIT)
    assert r.status_code == 201, r.text
    # reading is not refused (nothing changes; CORS keeps the answer from the page)
    r = requests.get(url, headers={"Sec-Fetch-Site": "cross-site"}, auth=ADMIN, timeout=WAIT)
    assert r.status_code == 200 and len(r.json()["messages"]) == 2
    # the CLI
    cli = [sys.executable, "-m", "polymq_cli"]
    login = ["--admin", admin, "--user", ADMIN[0], "--password", ADMIN[1]]
    done = subprocess.run(
        [*cli, "publish", f"queue/{name}", "from the CLI", *login],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "POLYMQ_ADMIN_URL": ""},
    )
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [*cli, "purge", f"queue/{name}", *login], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "3" in done.stdout


def test_admin_answers_json_nested_too_deeply_400(run: PolymqProcess) -> None:
    admin = run.url("admin")
    deep = "[" * 100_000 + "]" * 100_000
    for path in (f"/api/destinations/queue/{queue()}/messages", "/api/config/reload"):
        r = requests.post(admin + path, data=deep, headers=_json(), auth=ADMIN, timeout=WAIT)
        body = assert_problem(r, 400)
        assert "nested too deeply" in body["detail"]


# ---- a login refused before the body is read -----------------------------------------------
def _refused_before_the_body(port: int, path: str) -> None:
    """POST 16 MiB declared and 64 KiB sent, without a login: the 401 comes at once, and
    the connection is closed rather than the rest of the body read."""
    declared, first = 16 * 1024 * 1024, 64 * 1024
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        )
        sock.sendall(head.encode() + b" " * first)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer: {answer!r}"
            answer += chunk
        status_line = answer.split(b"\r\n", 1)[0]
        assert status_line.split()[1] == b"401", answer[:300]
        assert b"connection: close" in answer.lower()
        # the rest of the body is not wanted: the server stops reading it
        sent, deadline = first, time.monotonic() + WAIT
        sock.settimeout(1.0)
        closed = False
        while sent < declared and time.monotonic() < deadline:
            try:
                sock.sendall(b" " * 65536)
                sent += 65536
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            except TimeoutError:
                continue  # (the server's buffers are full: it reads nothing more)
        assert closed, f"the server took {sent} bytes of a refused body"
        assert sent < declared // 4, f"the server took {sent} bytes of a refused body"
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("listener", "path"),
    [
        ("http", "/v1/queue/{q}/messages"),
        ("avro", "/v1/queue/{q}/records"),
        ("longpoll", "/v1/queue/{q}/messages"),
        ("admin", "/api/destinations/queue/{q}/messages"),
    ],
)
def test_a_login_is_refused_before_the_body_is_read(
    run: PolymqProcess, listener: str, path: str
) -> None:
    _refused_before_the_body(run.ports[listener], path.format(q=queue()))


@pytest.mark.parametrize(
    ("listener", "path", "body", "ctype"),
    [
        ("http", "/v1/queue/{q}/messages", b'{"body": "x"}', "application/json"),
        ("avro", "/v1/queue/{q}/records", b"Obj\x01", "application/octet-stream"),
    ],
)
def test_frontends_without_cors_refuse_a_browsers_cross_site_write(
    run: PolymqProcess, listener: str, path: str, body: bytes, ctype: str
) -> None:
    url = run.url(listener) + path.format(q=queue())
    for foreign in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        headers = {"Content-Type": ctype, **foreign}
        r = requests.post(url, data=body, headers=headers, auth=OLD, timeout=WAIT)
        assert_problem(r, 403, "cross-site")
    # a program (no Origin) gets past the guard to the handler
    r = requests.post(url, data=body, headers={"Content-Type": ctype}, auth=OLD, timeout=WAIT)
    assert r.status_code != 403, r.text


# ---- failed logins, per source ----------------------------------------------------------------
def _bad_login(port: int, path: str, ready: threading.Barrier, out: list[Any]) -> None:
    pair = base64.b64encode(f"{VICTIM[0]}:wrong".encode()).decode()
    conn = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=120, source_address=(BAD_SOURCE, 0)
    )
    try:
        ready.wait()
        conn.request(
            "POST",
            path,
            body=b'{"body": "x"}',
            headers={**_json(), "Authorization": f"Basic {pair}"},
        )
        r = conn.getresponse()
        out.append((r.status, r.getheader("Retry-After"), r.read()))
    except OSError as exc:
        out.append((0, None, repr(exc).encode()))
    finally:
        conn.close()


def test_bad_logins_from_one_source_do_not_slow_another(run: PolymqProcess) -> None:
    port, name = run.ports["http"], queue()
    path = f"/v1/queue/{name}/messages"
    url = run.url("http") + path

    def good_login(user: tuple[str, str]) -> float:
        t0 = time.monotonic()
        r = requests.post(url, json={"body": "ok"}, auth=user, timeout=120)
        assert r.status_code == 200, r.text
        return time.monotonic() - t0

    baseline = good_login(GOOD[0])
    answers: list[Any] = []
    ready = threading.Barrier(FLOOD + 1)
    flood = [
        threading.Thread(target=_bad_login, args=(port, path, ready, answers)) for _ in range(FLOOD)
    ]
    for t in flood:
        t.start()
    ready.wait()
    deadline = time.monotonic() + WAIT
    while not answers and time.monotonic() < deadline:  # the flood is being checked
        time.sleep(0.02)
    assert answers, "no bad login was answered"
    during = good_login(GOOD[1])
    for t in flood:
        t.join(120)
    print(f"\ngood login: {baseline:.2f}s alone, {during:.2f}s during {FLOOD} bad ones")
    assert during < 4 * baseline + 1.5, (baseline, during)
    statuses = sorted(a[0] for a in answers)
    assert len(statuses) == FLOOD and set(statuses) <= {401, 429}, answers
    assert 401 in statuses and 429 in statuses, statuses
    for status, retry_after, body in answers:
        if status == 429:
            assert retry_after is not None and int(retry_after) >= 1
            assert json.loads(body)["code"] == "too-many-logins"
    # the source is still held back; the others are not
    r = requests.post(url, json={"body": "ok"}, auth=GOOD[1], timeout=WAIT)
    assert r.status_code == 200


def test_stomp_logins_are_held_back_by_source_too(run: PolymqProcess) -> None:
    """Bad CONNECTs from one address (of a user with a cheap old hash): once past the free
    failures, the ERROR frame says to retry later; another address connects."""
    port = run.ports["stomp"]
    errors: list[str] = []

    class Errors(stomp.ConnectionListener):
        def on_error(self, frame: Any) -> None:
            errors.append(f"{frame.headers.get('message')}: {frame.body}")

    def bad_connect() -> None:
        conn = stomp.Connection([("127.0.0.1", port)], bind_host_port=("127.0.0.3", 0))
        conn.set_listener("errors", Errors())
        try:
            conn.connect(OLD[0], "wrong", wait=True)
        except ConnectFailedException:
            pass
        finally:
            if conn.is_connected():
                conn.disconnect()

    threads = [threading.Thread(target=bad_connect) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(errors) == 16, errors
    refused = f"Bad CONNECT: Access refused for user '{OLD[0]}'\n"  # RabbitMQ's words
    assert refused in errors, errors
    assert any("too many failed logins from 127.0.0.3" in e for e in errors), errors
    good = stomp.Connection([("127.0.0.1", port)])
    good.connect(OLD[0], OLD[1], wait=True)
    assert good.is_connected()
    good.disconnect()


# ---- the cost of a password hash --------------------------------------------------------------
def test_new_hashes_cost_owasps_n_and_old_ones_still_log_in(run: PolymqProcess) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "polymq_server.auth.provider", "hash-password"],
        input="a new password\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("scrypt$131072$8$1$"), made.stdout
    r = requests.post(
        f"{run.url('http')}/v1/queue/{queue()}/messages", json={"body": "x"}, auth=OLD, timeout=WAIT
    )
    assert r.status_code == 200, r.text
