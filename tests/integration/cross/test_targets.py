"""Every target is authorized (issue 27): on one ``polymq run --auth file:users.json`` node
(and a ``polymq core`` + ``polymq http`` pair for a deployed frontend's login),
a dead-letter target needs the declarer's WRITE there, over HTTP, AMQP, STOMP and the native
client, and again when a message is dead-lettered (after a users reload withdrew it); a
passive AMQP queue.declare needs READ; a long-poll subscription id cannot be rewritten to
read another user's subscription, nor used by another user."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import requests
import stomp

from polymq import Client
from polymq.errors import Forbidden
from polymq_server.auth.provider import hash_password

from ...procs import WAIT, PolymqProcess, serving
from ..webapi import WebApi, assert_problem

ALL = ["read", "write", "configure"]
PASSWORD = "team-password"
ADMIN = ("root", "root-password")


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


def users_file(hashed: str, root_hashed: str, *, carol_writes_shared: bool) -> dict[str, Any]:
    carol = [{"pattern": "queue/c.*", "permissions": ALL}]
    if carol_writes_shared:
        carol.append({"pattern": "queue/shared.*", "permissions": ["write"]})
    return {
        "users": {
            "team_a": {
                "password_hash": hashed,
                "grants": [
                    {"pattern": "queue/a.*", "permissions": ALL},
                    {"pattern": "topic/a.*", "permissions": ALL},
                ],
            },
            "team_b": {
                "password_hash": hashed,
                "grants": [{"pattern": "queue/b.*", "permissions": ALL}],
            },
            "carol": {"password_hash": hashed, "grants": carol},
            "maker": {  # makes queues and fills them, reads nothing
                "password_hash": hashed,
                "grants": [{"pattern": "queue/m.*", "permissions": ["configure", "write"]}],
            },
            "watcher": {
                "password_hash": hashed,
                "grants": [{"pattern": "queue/*", "permissions": ["read"]}],
            },
            ADMIN[0]: {"password_hash": root_hashed, "tags": ["administrator"]},
        },
        "anonymous": {"grants": [{"pattern": "queue/pub.*", "permissions": ["read", "write"]}]},
    }


class Node:
    def __init__(self, proc: PolymqProcess, users: Path, hashed: str, root_hashed: str) -> None:
        self.proc = proc
        self.users = users
        self.hashed = hashed
        self.root_hashed = root_hashed

    def http(self, user: str | None) -> WebApi:
        if user is None:
            return WebApi(self.proc.url("http"))
        token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
        return WebApi(self.proc.url("http"), Authorization=f"Basic {token}")

    def longpoll(self, user: str | None) -> WebApi:
        api = self.http(user)
        api.base = self.proc.url("longpoll")
        return api

    def amqp(self, user: str) -> pika.BlockingConnection:
        params = pika.ConnectionParameters(
            "127.0.0.1",
            self.proc.ports["amqp"],
            credentials=pika.PlainCredentials(user, PASSWORD),
        )
        return pika.BlockingConnection(params)

    def reload_users(self, *, carol_writes_shared: bool) -> None:
        self.users.write_text(
            json.dumps(
                users_file(self.hashed, self.root_hashed, carol_writes_shared=carol_writes_shared)
            )
        )
        r = requests.post(
            f"{self.proc.url('admin')}/api/config/reload",
            json={"users": True},
            auth=ADMIN,
            timeout=WAIT,
        )
        assert r.status_code == 200 and r.json()["applied_here"], r.text


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = Path(tmp_path_factory.mktemp("targets"))
    hashed, root_hashed = hash_password(PASSWORD), hash_password(ADMIN[1])
    users = workdir / "users.json"
    users.write_text(json.dumps(users_file(hashed, root_hashed, carol_writes_shared=True)))
    with serving("run", workdir, "--auth", f"file:{users}") as proc:
        yield Node(proc, users, hashed, root_hashed)


# ---- helpers ----------------------------------------------------------------------------------
def declare(api: WebApi, queue: str, **options: Any) -> requests.Response:
    return api.put(f"/v1/queue/{queue}", json=options)


def publish(api: WebApi, queue: str, body: str) -> None:
    r = api.post(f"/v1/queue/{queue}/messages", json={"body": body})
    assert r.status_code == 200, r.text


def pull(api: WebApi, queue: str, wait: float = 0.0) -> list[dict[str, Any]]:
    r = api.post(f"/v1/queue/{queue}/pull", params={"wait": wait})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def reject(api: WebApi, queue: str, body: str) -> None:
    """Publish ``body`` to ``queue``, pull it and nack it without requeue: dead-lettered."""
    publish(api, queue, body)
    [msg] = pull(api, queue, wait=5)
    assert msg["body"] == body
    r = api.post("/v1/nack", json={"receipts": [msg["receipt"]], "requeue": False})
    assert r.status_code == 200 and r.json()["settled"] == 1, r.text


def bodies_in(api: WebApi, queue: str, wait: float) -> list[str]:
    """What ``queue`` holds (settled: pulled and acked), waiting up to ``wait`` for one."""
    got = pull(api, queue, wait=wait)
    if got:
        r = api.post("/v1/ack", json={"receipts": [m["receipt"] for m in got]})
        assert r.status_code == 200, r.text
    return [m["body"] for m in got]


# ---- dead-letter targets at declare ----------------------------------------------------------
def test_http_declare_refuses_a_dead_letter_target_the_user_may_not_write(node: Node) -> None:
    a, b = node.http("team_a"), node.http("team_b")
    victim = unique("b.inbox")
    assert declare(b, victim).status_code == 200
    for target in (f"queue/{victim}", "topic/system.peers", "topic/system.config"):
        body = assert_problem(declare(a, unique("a.q"), dead_letter=target), 403)
        assert "write" in body["detail"], body
    # nothing reached the other team's queue, and a target of its own is fine
    assert bodies_in(b, victim, 0) == []
    own, dead = unique("a.q"), unique("a.dead")
    assert declare(a, own, dead_letter=f"queue/{dead}").status_code == 200
    reject(a, own, "rejected")
    assert bodies_in(a, dead, 5) == ["rejected"]
    # a client cannot name someone else as the declarer
    r = declare(a, unique("a.q"), dead_letter=f"queue/{dead}", dead_letter_by="team_b")
    assert_problem(r, 400)


def test_amqp_declare_refuses_a_dead_letter_target_the_user_may_not_write(node: Node) -> None:
    b = node.http("team_b")
    victim = unique("b.inbox")
    assert declare(b, victim).status_code == 200
    conn = node.amqp("team_a")
    try:
        for args in (
            {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": victim},
            {"x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "system.x"},
        ):
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                ch.queue_declare(unique("a.amqp"), arguments=args)
            assert refused.value.reply_code == 403, refused.value
            assert "ACCESS_REFUSED" in refused.value.reply_text
        # its own dead-letter queue: declared, and a rejected message lands there
        ch = conn.channel()
        q, dead = unique("a.amqp"), unique("a.amqpdead")
        ch.queue_declare(dead)
        ch.queue_declare(
            q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
        )
        ch.basic_publish("", q, b"nacked")
        method, _props, _body = ch.basic_get(q)
        assert method is not None
        ch.basic_nack(method.delivery_tag, requeue=False)
        deadline = time.monotonic() + WAIT
        while (got := ch.basic_get(dead, auto_ack=True))[0] is None:
            assert time.monotonic() < deadline, "the dead letter did not arrive"
            time.sleep(0.05)
        assert got[2] == b"nacked"
    finally:
        conn.close()
    assert bodies_in(b, victim, 0) == []


def test_stomp_subscribe_refuses_a_dead_letter_target_the_user_may_not_write(node: Node) -> None:
    victim = unique("b.inbox")
    conn = stomp.Connection12([("127.0.0.1", node.proc.ports["stomp"])], vhost="/")
    errors: list[str] = []

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_error(self, frame: Any) -> None:
            errors.append(f"{frame.headers.get('message')}: {frame.body}")

    conn.set_listener("errors", Listener())
    conn.connect("team_a", PASSWORD, wait=True)
    conn.subscribe(
        f"/queue/{unique('a.st')}",
        id="1",
        ack="client-individual",
        headers={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": victim},
    )
    deadline = time.monotonic() + WAIT
    while not errors:
        assert time.monotonic() < deadline, "no ERROR frame"
        time.sleep(0.05)
    assert "write" in errors[0], errors
    if conn.is_connected():
        conn.disconnect()


def test_native_client_declare_refuses_a_dead_letter_target_it_may_not_write(node: Node) -> None:
    async def run() -> None:
        port = node.proc.ports["core"]
        async with await Client.connect("127.0.0.1", port, user="team_a", password=PASSWORD) as c:
            for target in (f"queue/{unique('b.inbox')}", "topic/system.peers"):
                with pytest.raises(Forbidden):
                    await c.declare(f"queue/{unique('a.n')}", dead_letter=target)
            dead = f"queue/{unique('a.ndead')}"
            # naming another declarer does not help: the core records the login
            declared = await c.declare(
                f"queue/{unique('a.n')}", dead_letter=dead, dead_letter_by="team_b"
            )
            assert declared.options is not None
            assert declared.options.dead_letter_by == "team_a", declared

    asyncio.run(run())


# ---- the re-check when a message is dead-lettered -------------------------------------------
def test_a_withdrawn_grant_stops_dead_letters(node: Node) -> None:
    carol, watcher = node.http("carol"), node.http("watcher")
    q, shared = unique("c.q"), unique("shared.dead")
    assert declare(carol, q, dead_letter=f"queue/{shared}").status_code == 200
    reject(carol, q, "while allowed")
    assert bodies_in(watcher, shared, 5) == ["while allowed"]
    node.reload_users(carol_writes_shared=False)
    try:
        # the grant is gone: the next dead letter is dropped, not sent there
        reject(carol, q, "after the grant was withdrawn")
        assert bodies_in(watcher, shared, 1.0) == []
        assert pull(carol, q) == []  # (it left the queue all the same)
        assert "may no longer write to queue/" + shared in node.proc.log()
    finally:
        node.reload_users(carol_writes_shared=True)
    reject(carol, q, "allowed again")
    assert bodies_in(watcher, shared, 5) == ["allowed again"]


# ---- passive declares --------------------------------------------------------------------------
def test_amqp_passive_declare_needs_read(node: Node) -> None:
    b = node.http("team_b")
    private = unique("b.private")
    assert declare(b, private).status_code == 200
    publish(b, private, "secret")
    owner = node.amqp("team_b")
    try:
        ok = owner.channel().queue_declare(private, passive=True).method
        assert ok.message_count == 1
    finally:
        owner.close()
    maker = node.amqp("maker")
    try:  # configure alone declares, and tells no counts
        ch = maker.channel()
        made = unique("m.q")
        ch.queue_declare(made)
        ch.basic_publish("", made, b"one")
        assert ch.queue_declare(made).method.message_count == 0
        assert bodies_in(node.http("watcher"), made, 5) == ["one"]  # (it was there)
    finally:
        maker.close()
    conn = node.amqp("team_a")
    try:
        for name in (private, unique("b.absent")):  # the same answer: existence is not told
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                conn.channel().queue_declare(name, passive=True)
            assert refused.value.reply_code == 403, refused.value
            assert "read" in refused.value.reply_text
    finally:
        conn.close()


# ---- long-poll subscription ids ----------------------------------------------------------------
def rewritten(sub_id: str, destination: str) -> str:
    """``sub_id`` with the destination inside it replaced (its signature, if any, kept)."""
    text, dot, mac = sub_id.partition(".")
    raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    raw[2] = destination
    text = base64.urlsafe_b64encode(json.dumps(raw, separators=(",", ":")).encode())
    return text.rstrip(b"=").decode() + dot + mac


def open_sub(lp: WebApi, destination: str) -> str:
    r = lp.post("/v1/subscriptions", json={"destination": destination})
    assert r.status_code == 201, r.text
    sub_id: str = r.json()["id"]
    return sub_id


def test_a_rewritten_longpoll_id_reads_nothing(node: Node) -> None:
    a, b = node.longpoll("team_a"), node.longpoll("team_b")
    own, private = unique("a.lp"), unique("b.lp")
    mine = open_sub(a, f"queue/{own}")
    theirs = open_sub(b, f"queue/{private}")
    publish(node.http("team_b"), private, "for team b only")
    # team b's id, rewritten to name a queue team a may read: not an id this service gave
    forged = rewritten(theirs, f"queue/{own}")
    assert_problem(a.get(f"/v1/subscriptions/{forged}/poll"), 404)
    # as it was given, but to another user: refused
    assert_problem(a.get(f"/v1/subscriptions/{theirs}/poll"), 403)
    # the originals still work for their owners
    r = b.get(f"/v1/subscriptions/{theirs}/poll", params={"wait": 5})
    assert r.status_code == 200 and [m["body"] for m in r.json()["messages"]] == [
        "for team b only"
    ], r.text
    assert a.get(f"/v1/subscriptions/{mine}/poll").status_code == 200


def test_an_anonymous_longpoll_id_cannot_be_rewritten(node: Node) -> None:
    anon = node.longpoll(None)
    first, second = unique("pub.one"), unique("pub.two")
    sub_first = open_sub(anon, f"queue/{first}")
    sub_second = open_sub(anon, f"queue/{second}")
    publish(node.http(None), second, "for the second")
    forged = rewritten(sub_second, f"queue/{first}")
    assert_problem(anon.get(f"/v1/subscriptions/{forged}/poll"), 404)
    r = anon.get(f"/v1/subscriptions/{sub_second}/poll", params={"wait": 5})
    assert r.status_code == 200 and [m["body"] for m in r.json()["messages"]] == ["for the second"]
    assert anon.get(f"/v1/subscriptions/{sub_first}/poll").json()["messages"] == []
    # a logged-in user may not use the anonymous client's id either
    assert_problem(node.longpoll("watcher").get(f"/v1/subscriptions/{sub_first}/poll"), 403)


def test_a_deployed_frontend_declares_for_its_user(tmp_path: Path) -> None:
    """``polymq core`` and ``polymq http`` apart, the frontend logged in to the core as a
    user granted everything (the chart's ``auth.frontendLogin``): the queue records the HTTP
    user, whose grant each dead letter is then checked against, not the frontend's."""
    hashed = hash_password(PASSWORD)
    users = tmp_path / "users.json"
    grants = {"frontend": [{"pattern": "*", "permissions": ALL}]}
    grants["carol"] = [{"pattern": "queue/c.*", "permissions": ALL}]
    users.write_text(
        json.dumps(
            {"users": {name: {"password_hash": hashed, "grants": g} for name, g in grants.items()}}
        )
    )
    auth = ("--auth", f"file:{users}")
    with PolymqProcess("core", tmp_path / "core", *auth) as core:
        env = {
            "POLYMQ_CORE_PORT": str(core.ports["core"]),
            "POLYMQ_CORE_USER": "frontend",
            "POLYMQ_CORE_PASSWORD": PASSWORD,
        }
        with PolymqProcess("http", tmp_path / "http", *auth, env=env) as http:
            carol = WebApi(http.url("http"))
            carol.session.auth = ("carol", PASSWORD)
            dead = unique("c.dead")
            r = declare(carol, unique("c.q"), dead_letter=f"queue/{dead}")
            assert r.status_code == 200, r.text
            assert r.json()["options"]["dead_letter_by"] == "carol", r.text
            assert_problem(declare(carol, unique("c.q"), dead_letter="queue/other"), 403)
