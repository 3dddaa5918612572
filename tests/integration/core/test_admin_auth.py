"""Who may use the core's admin HTTP when it runs with ``--auth``: a login (Basic or a
bearer token) with a management tag, ``monitoring`` to read and ``administrator`` to change;
the probes and the metrics stay open. Against a core and a STOMP frontend run apart (the
frontend logs in to the core as its own user, and still answers the connection list)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import stomp

from polymq_server.auth.provider import hash_password, hash_token

from ...procs import PolymqProcess
from ..webapi import assert_problem
from .helpers import uid

ADMIN, WATCHER, PLAIN = ("admin", "a-pw"), ("watcher", "w-pw"), ("plain", "p-pw")
TOKEN = "admin-token-0123456789abcdef"
EVERYTHING = [{"pattern": "*", "permissions": ["read", "write", "configure"]}]


@pytest.fixture(scope="module")
def nodes(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PolymqProcess, PolymqProcess]]:
    tmp = tmp_path_factory.mktemp("admin-auth")
    users = tmp / "users.json"
    users.write_text(
        json.dumps(
            {
                "users": {
                    "admin": {
                        "password_hash": hash_password(ADMIN[1]),
                        "grants": EVERYTHING,
                        "tags": ["administrator"],
                    },
                    "watcher": {"password_hash": hash_password(WATCHER[1]), "tags": ["monitoring"]},
                    "plain": {"password_hash": hash_password(PLAIN[1]), "grants": EVERYTHING},
                    "frontend": {  # (system.* topics are polymq's own and administrators')
                        "password_hash": hash_password("fe-pw"),
                        "grants": EVERYTHING,
                        "tags": ["administrator"],
                    },
                },
                "tokens": {hash_token(TOKEN): {"user": "admin"}},
                "anonymous": {"grants": [{"pattern": "topic/public.*", "permissions": ["read"]}]},
            }
        )
    )
    auth = ["--auth", f"file:{users}"]
    env = {"POLYMQ_CORE_USER": "frontend", "POLYMQ_CORE_PASSWORD": "fe-pw"}
    with PolymqProcess("core", tmp / "core", *auth) as core:
        addr = f"127.0.0.1:{core.ports['core']}"
        with PolymqProcess("stomp", tmp / "stomp", "--core", addr, *auth, env=env) as fe:
            yield core, fe


def call(core: PolymqProcess, method: str, path: str, **kw: Any) -> requests.Response:
    kw.setdefault("timeout", 30)
    return requests.request(method, core.url("admin") + path, **kw)


def test_probes_and_metrics_stay_open(nodes: tuple[PolymqProcess, PolymqProcess]) -> None:
    core, _ = nodes
    for path in ("/healthz", "/readyz", "/metrics"):
        assert call(core, "GET", path).status_code == 200, path


@pytest.mark.parametrize(
    "path", ["/", "/api/", "/api/connections", "/api/destinations", "/api/cluster", "/reload"]
)
def test_the_console_and_the_api_need_a_login(
    nodes: tuple[PolymqProcess, PolymqProcess], path: str
) -> None:
    core, _ = nodes
    r = call(core, "GET", path)
    assert_problem(r, 401)
    assert r.headers["WWW-Authenticate"] == 'Basic realm="polymq"'
    assert_problem(call(core, "GET", path, auth=("admin", "wrong")), 401)
    assert_problem(call(core, "GET", path, headers={"Authorization": "Bearer nope"}), 401)
    # logged in, but with no management tag (the user may publish through the wire all it likes)
    body = assert_problem(call(core, "GET", path, auth=PLAIN), 403)
    assert "has no admin tag" in body["detail"]
    assert call(core, "GET", path, auth=WATCHER).status_code == 200
    assert call(core, "GET", path, auth=ADMIN).status_code == 200
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert call(core, "GET", path, headers=bearer).status_code == 200


def test_monitoring_reads_and_the_administrator_changes(
    nodes: tuple[PolymqProcess, PolymqProcess],
) -> None:
    core, _ = nodes
    path = f"/api/destinations/queue/{uid('auth')}"
    message = {"body": "hello"}
    body = assert_problem(call(core, "POST", f"{path}/messages", json=message, auth=WATCHER), 403)
    assert "may only read" in body["detail"]
    assert_problem(call(core, "POST", f"{path}/messages", json=message, auth=PLAIN), 403)
    assert call(core, "POST", f"{path}/messages", json=message, auth=ADMIN).status_code == 201
    shown = call(core, "GET", f"{path}/messages", auth=WATCHER).json()["messages"]
    assert [m["body"] for m in shown] == ["hello"]
    assert_problem(call(core, "DELETE", f"{path}/contents", auth=WATCHER), 403)
    assert_problem(call(core, "DELETE", path, auth=WATCHER), 403)
    assert call(core, "GET", path, auth=WATCHER).json()["ready"] == 1  # nothing happened
    assert call(core, "DELETE", f"{path}/contents", auth=ADMIN).json() == {"purged": 1}
    # a queue nobody declared is forgotten once empty (the next sweep, within 0.5 s: a
    # DELETE behind it found nothing, 404, once in CI); holding a message it stays
    assert call(core, "POST", f"{path}/messages", json=message, auth=ADMIN).status_code == 201
    assert (
        call(core, "DELETE", path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 204
    )


def test_a_frontend_run_apart_lists_and_closes_its_connections(
    nodes: tuple[PolymqProcess, PolymqProcess],
) -> None:
    core, fe = nodes
    conn = stomp.Connection([("127.0.0.1", fe.ports["stomp"])])
    conn.connect("plain", PLAIN[1], wait=True)
    try:
        rows = call(core, "GET", "/api/connections", auth=WATCHER).json()["connections"]
        mine = [c for c in rows if c["protocol"] == "stomp" and c["user"] == "plain"]
        assert len(mine) == 1, rows
        assert mine[0]["frontend"].startswith("stomp-")
        # the frontend's own link to the core is one of the core's wire clients
        assert any(c["protocol"] == "native" and c["user"] == "frontend" for c in rows), rows
        url = f"/api/connections/{mine[0]['id']}"
        assert_problem(call(core, "DELETE", url, auth=WATCHER), 403)
        assert conn.is_connected()
        assert call(core, "DELETE", url, auth=ADMIN).status_code == 204
    finally:
        if conn.is_connected():
            conn.disconnect()
