"""connection.update-secret as RabbitMQ answers it (issue 30 point 5), with pika, against
polymq with a users file and against a private RabbitMQ node with its internal and OAuth 2
backends (``auth_backends``: internal, then oauth2; JWTs signed with a shared HS256 key).

A password login never expires (RabbitMQ's internal backend: ``state_can_expire`` false), so
any new secret is taken and the connection goes on. A token login (polymq: a token of the
users file; RabbitMQ: a JWT, each given as the password with no login name) takes a new
secret only if it is a valid token, else ``connection.close`` 530 ``NOT_ALLOWED - New
secret was refused by one of the backends`` (``rabbit_reader``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pika
import pytest

from polymq_server.auth.provider import hash_password, hash_token

from ...procs import serving
from ...rabbit import find_server, has_plugin, rabbit_node
from .helpers import WAIT, unique

pytestmark = pytest.mark.timeout(120)

REFUSED = "NOT_ALLOWED - New secret was refused by one of the backends"
KEY = "polymq-test-signing-key-0123456789"  # RabbitMQ's HS256 key for the tests' JWTs
ADVANCED = f"""[
 {{rabbit, [{{auth_backends, [rabbit_auth_backend_internal, rabbit_auth_backend_oauth2]}}]}},
 {{rabbitmq_auth_backend_oauth2, [
   {{resource_server_id, <<"rabbitmq">>}},
   {{key_config, [
     {{default_key, <<"test">>}},
     {{signing_keys, #{{<<"test">> => {{map, #{{<<"kty">> => <<"MAC">>,
                                              <<"alg">> => <<"HS256">>,
                                              <<"value">> => <<"{KEY}">>}}}}}}}}]}}]}}
].
"""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(user: str) -> str:
    """A JWT RabbitMQ's OAuth 2 backend takes: ``user``, every permission, an hour."""
    head = {"alg": "HS256", "typ": "JWT"}
    claims = {
        "sub": user,
        "aud": ["rabbitmq"],
        "scope": ["rabbitmq.read:*/*", "rabbitmq.write:*/*", "rabbitmq.configure:*/*"],
        "exp": int(time.time()) + 3600,
        "jti": unique(),
    }
    signing = f"{_b64(json.dumps(head).encode())}.{_b64(json.dumps(claims).encode())}"
    mac = hmac.new(KEY.encode(), signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{_b64(mac)}"


@dataclass
class Secured:
    """A broker with password and token logins: ``token(user)`` makes a valid token."""

    name: str
    port: int
    token: Callable[[str], str]

    def connect(self, user: str, password: str) -> pika.BlockingConnection:
        params = pika.ConnectionParameters(
            "127.0.0.1",
            self.port,
            credentials=pika.PlainCredentials(user, password),
            blocked_connection_timeout=WAIT,
            socket_timeout=WAIT,
        )
        return pika.BlockingConnection(params)


@pytest.fixture(scope="module")
def polymq_secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    workdir = tmp_path_factory.mktemp("secured")
    tokens = {f"{user}-token-{n}-{unique()}": user for user in ("guest", "bob") for n in (1, 2)}
    everything = [{"pattern": "*", "permissions": ["read", "write", "configure"]}]
    users = {
        user: {"password_hash": hash_password(user), "grants": everything}
        for user in ("guest", "bob")
    }
    doc = {"users": users, "tokens": {hash_token(t): {"user": u} for t, u in tokens.items()}}
    (workdir / "users.json").write_text(json.dumps(doc))
    turns = {user: itertools.cycle([t for t, u in tokens.items() if u == user]) for user in users}

    def token(user: str) -> str:  # each user's tokens in turn: a refresh gets another one
        return next(turns[user])

    with serving("run", workdir / "run", "--auth", f"file:{workdir / 'users.json'}") as run:
        yield Secured("polymq", run.ports["amqp"], token)


@pytest.fixture(scope="module")
def rabbitmq_secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    if find_server() is None or not has_plugin("rabbitmq_auth_backend_oauth2"):
        pytest.skip("rabbitmq-server with rabbitmq_auth_backend_oauth2 is not installed")
    workdir = tmp_path_factory.mktemp("rabbit-oauth2")
    plugins = ("rabbitmq_auth_backend_oauth2",)
    with rabbit_node(workdir, plugins=plugins, advanced=ADVANCED) as node:
        yield Secured("rabbitmq", node.port, jwt)


@pytest.fixture(params=["polymq", "rabbitmq"])
def secured(request: pytest.FixtureRequest) -> Secured:
    found: Secured = request.getfixturevalue(f"{request.param}_secured")
    return found


def works(conn: pika.BlockingConnection) -> None:
    """The connection goes on: a queue declared, a message through it."""
    ch = conn.channel()
    q = unique("secret")
    ch.queue_declare(q, auto_delete=True)
    ch.basic_publish("", q, b"after")
    assert ch.basic_get(q, auto_ack=True)[2] == b"after"


def test_a_password_login_takes_any_new_secret(secured: Secured) -> None:
    conn = secured.connect("guest", "guest")
    try:
        conn.update_secret("not the password", "rotation")
        conn.update_secret("", "rotation")
        works(conn)
    finally:
        conn.close()


def test_a_token_login_takes_a_new_valid_token(secured: Secured) -> None:
    conn = secured.connect("", secured.token("guest"))
    try:
        works(conn)
        conn.update_secret(secured.token("guest"), "token refresh")
        works(conn)
    finally:
        conn.close()


def test_a_token_login_refuses_a_secret_that_is_no_token(secured: Secured) -> None:
    conn = secured.connect("", secured.token("guest"))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.update_secret("guest", "token refresh")  # guest's password, not a token
    assert (info.value.reply_code, info.value.reply_text) == (530, REFUSED)


def test_a_token_login_refuses_a_token_of_another_user(polymq_secured: Secured) -> None:
    """A new token must be the same user's (RabbitMQ 3.10's OAuth 2 backend does not look;
    newer ones refuse it too: ``rabbit_auth_backend_oauth2:update_state``,
    "Not allowed to change username on refreshed token", answered with the same 530)."""
    secured = polymq_secured
    conn = secured.connect("", secured.token("guest"))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.update_secret(secured.token("bob"), "token refresh")
    assert (info.value.reply_code, info.value.reply_text) == (530, REFUSED)
