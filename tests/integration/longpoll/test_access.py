"""Who may call: Bearer and Basic credentials through ``polymq_server.auth.provider`` (401, 403),
and which
browser origins may call cross-origin (CORS)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from polymq_server.auth.provider import hash_password, hash_token

from ...procs import PolymqProcess, serving
from .conftest import ENV, Longpoll, assert_problem, unique

BOT_TOKEN = "bot-token-0123456789abcdef"
ALICE_PASSWORD = "alice-secret"
SITE = "https://app.example.com"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir = Path(tmp_path_factory.mktemp("longpoll-auth"))
    users = {
        "users": {
            "alice": {
                "password_hash": hash_password(ALICE_PASSWORD),
                "grants": [{"pattern": "*", "permissions": ["read", "write"]}],
            },
            "bot": {"grants": [{"pattern": "topic/bot.*", "permissions": ["read"]}]},
        },
        "tokens": {hash_token(BOT_TOKEN): {"user": "bot"}},
    }
    (workdir / "users.json").write_text(json.dumps(users))
    env = {**ENV, "POLYMQ_LONGPOLL_CORS_ORIGINS": f"{SITE}, http://127.0.0.1:9999"}
    with serving("run", workdir, "--auth", f"file:{workdir / 'users.json'}", env=env) as proc:
        yield proc


def test_without_credentials_it_is_401(secured: PolymqProcess) -> None:
    lp = Longpoll(secured.url("longpoll"))
    r = lp.post("/v1/subscriptions", json={"destination": "topic/bot.news"})
    assert_problem(r, 401)
    assert "Bearer" in r.headers["WWW-Authenticate"]
    assert_problem(lp.post("/v1/topic/bot.news/messages", json={"body": "x"}), 401)
    r = lp.post(
        "/v1/subscriptions",
        json={"destination": "topic/x"},
        headers={"Authorization": "Bearer nope"},
    )
    assert_problem(r, 401)


def test_a_bearer_token_reads_what_it_is_granted(secured: PolymqProcess) -> None:
    bot = Longpoll(secured.url("longpoll"), Authorization=f"Bearer {BOT_TOKEN}")
    alice = Longpoll(secured.url("longpoll"), Authorization=basic("alice", ALICE_PASSWORD))
    sub = bot.open("topic/bot.*")
    alice.publish("topic/bot.news", "for the bot")
    answer = bot.poll(sub["id"], sub["cursor"], wait=5)
    assert [m["body"] for m in answer["messages"]] == ["for the bot"]
    alice.publish("topic/bot.sport", "more")
    with bot.events(sub["id"], last_event_id=answer["cursor"]) as stream:  # the same header
        assert [e.data["body"] for e in stream.read(1)] == ["more"]
    assert_problem(bot.post("/v1/subscriptions", json={"destination": "topic/other"}), 403)
    assert_problem(bot.post("/v1/topic/bot.news/messages", json={"body": "x"}), 403)


def test_polling_needs_read_on_the_subscriptions_destination(secured: PolymqProcess) -> None:
    alice = Longpoll(secured.url("longpoll"), Authorization=basic("alice", ALICE_PASSWORD))
    bot = Longpoll(secured.url("longpoll"), Authorization=f"Bearer {BOT_TOKEN}")
    private = alice.open(f"queue/{unique()}")
    for method, path in (
        ("GET", f"/v1/subscriptions/{private['id']}/poll"),
        ("GET", f"/v1/subscriptions/{private['id']}/events"),
        ("DELETE", f"/v1/subscriptions/{private['id']}"),
    ):
        assert_problem(bot.request(method, path), 403)
    anonymous = Longpoll(secured.url("longpoll"))
    assert_problem(anonymous.get(f"/v1/subscriptions/{private['id']}/poll"), 401)


def test_cors_allows_only_the_configured_origins(secured: PolymqProcess) -> None:
    base = secured.url("longpoll")
    r = requests.options(
        f"{base}/v1/subscriptions",
        headers={
            "Origin": SITE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=10,
    )
    assert r.status_code == 204
    assert r.headers["Access-Control-Allow-Origin"] == SITE
    assert "authorization" in r.headers["Access-Control-Allow-Headers"].lower()
    assert "Last-Event-ID" in r.headers["Access-Control-Allow-Headers"]
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert "Origin" in r.headers["Vary"]
    assert "Access-Control-Allow-Credentials" not in r.headers
    # an error answer to an allowed origin is readable by its page too
    r = requests.get(f"{base}/v1/subscriptions/nope/poll", headers={"Origin": SITE}, timeout=10)
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == SITE
    # another origin: refused preflight, no allow header
    evil = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    r = requests.options(f"{base}/v1/subscriptions", headers=evil, timeout=10)
    assert r.status_code == 403 and "Access-Control-Allow-Origin" not in r.headers
    r = requests.get(f"{base}/healthz", headers={"Origin": "https://evil.example"}, timeout=10)
    assert "Access-Control-Allow-Origin" not in r.headers


def test_anonymous_mode_allows_any_origin(lp: Longpoll) -> None:
    origin = "http://localhost:3000"
    r = requests.options(
        f"{lp.base}/v1/subscriptions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert r.status_code == 204 and r.headers["Access-Control-Allow-Origin"] == "*"
    sub = lp.open(f"stream/{unique()}")
    with requests.get(
        f"{lp.base}/v1/subscriptions/{sub['id']}/events",
        headers={"Origin": origin},
        stream=True,
        timeout=10,
    ) as r:  # the event stream too
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
    r = requests.get(f"{lp.base}/polymq-longpoll.js", headers={"Origin": origin}, timeout=10)
    assert r.headers["Access-Control-Allow-Origin"] == "*"  # importable from other pages
    assert r.headers["Content-Type"].startswith("text/javascript")
    assert "export class PolymqLongpoll" in r.text
