"""``polymq run --auth file:users.json``: Basic and Bearer credentials, 401 and 403."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from polymq_server.auth.provider import hash_password, hash_token

from ...procs import PolymqProcess, serving
from .conftest import Api, assert_problem, unique

FRONTEND_PASSWORD = "frontend-secret"
ALICE_PASSWORD = "alice-secret"
READER_PASSWORD = "reader-secret"
BOT_TOKEN = "bot-token-0123456789abcdef"
ALL = ["read", "write", "configure"]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir = tmp_path_factory.mktemp("http-auth")
    users = {
        "users": {
            # the HTTP frontend's own login at the core, which checks every request again
            "frontend": {
                "password_hash": hash_password(FRONTEND_PASSWORD),
                "grants": [{"pattern": "*", "permissions": ALL}],
            },
            "alice": {
                "password_hash": hash_password(ALICE_PASSWORD),
                "grants": [{"pattern": "queue/*", "permissions": ALL}],
            },
            "reader": {
                "password_hash": hash_password(READER_PASSWORD),
                "grants": [{"pattern": "queue/*", "permissions": ["read"]}],
            },
            "bot": {"grants": [{"pattern": "queue/bot-*", "permissions": ["read", "write"]}]},
        },
        "tokens": {hash_token(BOT_TOKEN): {"user": "bot"}},
    }
    users_file = Path(workdir) / "users.json"
    users_file.write_text(json.dumps(users))
    # `polymq run` needs no credentials for its own frontend: it logs in with a one-off token.
    with serving("run", workdir, "--auth", f"file:{users_file}") as proc:
        yield proc


def test_ready_without_configuring_the_frontends_login(api: Api) -> None:
    assert api.get("/readyz").status_code == 200


def test_no_credentials(api: Api) -> None:
    r = api.post(f"/v1/queue/{unique()}/messages", json={"body": "x"})
    assert_problem(r, 401)
    challenge = r.headers["WWW-Authenticate"]
    assert 'Basic realm="polymq"' in challenge and "Bearer" in challenge


def test_wrong_password(api: Api) -> None:
    headers = {"Authorization": basic("alice", "wrong")}
    r = api.post(f"/v1/queue/{unique()}/messages", json={"body": "x"}, headers=headers)
    assert_problem(r, 401)
    assert "Basic" in r.headers["WWW-Authenticate"]


def test_unknown_token_and_malformed_header(api: Api) -> None:
    for header in ("Bearer not-a-token", "Digest abc", "Basic !!!"):
        r = api.get(f"/v1/queue/{unique()}", headers={"Authorization": header})
        assert_problem(r, 401)


def test_alice_can_do_everything_on_queues(server: PolymqProcess) -> None:
    alice, q = Api(server.url("http"), Authorization=basic("alice", ALICE_PASSWORD)), unique()
    assert alice.put(f"/v1/queue/{q}").status_code == 200
    alice.publish(f"queue/{q}", {"body": "hi"})
    [msg] = alice.pull(q)
    assert alice.ack(msg["receipt"])["settled"] == 1
    assert alice.delete(f"/v1/queue/{q}").status_code == 200
    # but nothing outside queue/*
    assert_problem(alice.post(f"/v1/topic/{q}/messages", json={"body": "x"}), 403)


def test_bearer_token_works(server: PolymqProcess) -> None:
    bot, q = Api(server.url("http"), Authorization=f"Bearer {BOT_TOKEN}"), unique("bot")
    assert bot.publish(f"queue/{q}", {"body": "beep"})["count"] == 1
    [msg] = bot.pull(q)
    assert msg["body"] == "beep"
    assert bot.ack(msg["receipt"])["settled"] == 1
    assert_problem(bot.post(f"/v1/queue/{q}/purge"), 403)  # no configure


def test_user_without_write_gets_403(server: PolymqProcess) -> None:
    reader = Api(server.url("http"), Authorization=basic("reader", READER_PASSWORD))
    q = unique()
    body = assert_problem(reader.post(f"/v1/queue/{q}/messages", json={"body": "x"}), 403)
    assert "write" in body["detail"]
    assert reader.pull(q) == []  # read is granted


def test_acking_another_users_receipt_is_forbidden(server: PolymqProcess) -> None:
    alice = Api(server.url("http"), Authorization=basic("alice", ALICE_PASSWORD))
    bot = Api(server.url("http"), Authorization=f"Bearer {BOT_TOKEN}")
    q = unique()  # not queue/bot-*: the bot may not read it
    alice.publish(f"queue/{q}", {"body": "private"})
    [msg] = alice.pull(q)
    assert_problem(bot.post("/v1/ack", json={"receipts": [msg["receipt"]]}), 403)
    assert alice.ack(msg["receipt"])["settled"] == 1


def test_operations_endpoints_need_no_login(api: Api) -> None:
    assert api.get("/healthz").status_code == 200
    assert api.get("/openapi.json").status_code == 200
    assert api.get("/metrics").status_code == 200
