"""A users reload reaches open sessions (issue 27): on one ``polymq run --auth
file:users.json``, the administrator rewrites the users file and posts a reload to the
admin API, and within seconds the sessions of a removed user (or one whose password
changed) are closed with their protocol's error, and those of a user whose grant was
withdrawn lose what it allowed: STOMP over TCP and WebSocket (stomp.py), AMQP (pika), the
native client (polymq.Client), Server-Sent Events and long polls."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import requests

from polymq import Client
from polymq.errors import ConnectionClosed, Forbidden
from polymq_server.auth.provider import hash_password

from ...procs import WAIT, PolymqProcess
from ..longpoll.conftest import ENV, Longpoll
from ..stomp.helpers import StompClient
from ..webapi import assert_problem, metric

REACH = 5.0  # seconds a reload may take to reach an open session ("within seconds")
ADMIN = ("root", "root-password")
PASSWORD = "user-password"
EVERYTHING = ["read", "write", "configure"]


def unique(prefix: str = "rv") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Users:
    """The users file of the node, and the administrator's reload of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._hash = hash_password(PASSWORD)
        self.users: dict[str, dict[str, Any]] = {
            ADMIN[0]: {"password_hash": hash_password(ADMIN[1]), "tags": ["administrator"]}
        }
        self.write()

    def write(self) -> None:
        self.path.write_text(json.dumps({"users": self.users}))

    def add(self, name: str, *grants: tuple[str, list[str]], password_hash: str = "") -> None:
        self.users[name] = {
            "password_hash": password_hash or self._hash,
            "grants": [{"pattern": p, "permissions": perms} for p, perms in grants],
        }

    def fresh(self, proc: PolymqProcess, *kinds: str) -> tuple[str, list[str]]:
        """New users (one per kind, which starts its name), each with every permission on
        the queues that start with a new prefix, reloaded: the prefix and their names."""
        p, names = unique(), [unique(kind) for kind in kinds]
        for name in names:
            self.add(name, (f"queue/{p}*", EVERYTHING))
        self.reload(proc)
        return p, names

    def reload(self, proc: PolymqProcess) -> None:
        """Write the file and have the node (and its frontends) read it again."""
        self.write()
        r = requests.post(
            f"{proc.url('admin')}/api/config/reload",
            json={"users": True},
            auth=ADMIN,
            timeout=WAIT,
        )
        assert r.status_code == 200, r.text
        assert r.json()["applied_here"], r.text


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PolymqProcess, Users]]:
    workdir = tmp_path_factory.mktemp("revocation")
    users = Users(workdir / "users.json")
    with PolymqProcess("run", workdir / "run", "--auth", f"file:{users.path}", env=ENV) as proc:
        yield proc, users


def eventually(check: Callable[[], bool], within: float = REACH) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"{check} did not hold within {within} s"
        time.sleep(0.05)


# ---- STOMP ------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_a_removed_users_stomp_session_gets_an_error_and_is_closed(
    node: tuple[PolymqProcess, Users], transport: str
) -> None:
    proc, users = node
    p, (gone, stays) = users.fresh(proc, "gone", "stays")
    clients = [StompClient(proc, transport) for _ in range(2)]
    try:
        leaving, staying = clients
        leaving.connect(username=gone, passcode=PASSWORD)
        staying.connect(username=stays, passcode=PASSWORD)
        leaving.subscribe(f"/queue/{p}.in")
        del users.users[gone]
        users.reload(proc)
        error = leaving.listener.wait_error(REACH)
        assert error.headers["message"] == "access_refused"
        assert f"user '{gone}' was removed" in error.body
        assert leaving.listener.disconnected.wait(REACH), "the connection stayed open"
        # the other user's session goes on
        staying.send_receipted(f"/queue/{p}.in", "still here")
        assert not staying.listener.errors
    finally:
        for client in clients:
            client.close()


def test_a_withdrawn_grant_ends_a_stomp_subscription_and_refuses_the_next_send(
    node: tuple[PolymqProcess, Users],
) -> None:
    proc, users = node
    p, (name,) = users.fresh(proc, "user")
    reader, writer = StompClient(proc, "tcp"), StompClient(proc, "tcp")
    try:
        reader.connect(username=name, passcode=PASSWORD)
        writer.connect(username=name, passcode=PASSWORD)
        reader.subscribe(f"/queue/{p}.in")
        writer.send_receipted(f"/queue/{p}.out", "allowed")  # (a decision the session keeps)
        users.add(name, (f"queue/{p}.other", ["read"]))
        users.reload(proc)
        error = reader.listener.wait_error(REACH)
        assert error.headers["message"] == "access_refused"
        assert f"/queue/{p}.in" in error.body and "no read permission" in error.body
        assert reader.listener.disconnected.wait(REACH)
        # the writer had no subscription: it is refused at its next SEND
        assert not writer.listener.errors
        writer.conn.send(f"/queue/{p}.out", "refused", headers={"receipt": "r-refused"})
        error = writer.listener.wait_error(REACH)
        assert error.headers["message"] == "access_refused"
        assert "no write permission" in error.body
        assert "r-refused" not in writer.listener.receipts
    finally:
        reader.close()
        writer.close()


# ---- AMQP -------------------------------------------------------------------------------
def amqp(proc: PolymqProcess, user: str) -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, PASSWORD)
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", proc.ports["amqp"], credentials=credentials)
    )


def test_a_removed_users_amqp_connection_is_closed_with_320(
    node: tuple[PolymqProcess, Users],
) -> None:
    proc, users = node
    p, (name,) = users.fresh(proc, "gone")
    conn = amqp(proc, name)
    try:
        channel = conn.channel()
        channel.queue_declare(f"{p}.q")
        channel.basic_consume(f"{p}.q", lambda *args: None)
        del users.users[name]
        users.reload(proc)
        deadline = time.monotonic() + REACH
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.1)
        assert closed.value.reply_code == 320
        assert closed.value.reply_text.startswith("CONNECTION_FORCED - ")
        assert f"user '{name}' was removed" in closed.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


def test_a_withdrawn_grant_closes_the_amqp_channel_of_its_consumer_with_403(
    node: tuple[PolymqProcess, Users],
) -> None:
    proc, users = node
    p, (name,) = users.fresh(proc, "user")
    conn = amqp(proc, name)
    try:
        consuming, other = conn.channel(), conn.channel()
        consuming.queue_declare(f"{p}.q")
        consuming.basic_consume(f"{p}.q", lambda *args: None)
        closed: list[Exception] = []
        consuming._impl.add_on_close_callback(lambda ch, reason: closed.append(reason))
        users.add(name, (f"queue/{p}.other", ["read"]))
        users.reload(proc)
        deadline = time.monotonic() + REACH
        while not closed and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert closed, "the consumer's channel stayed open"
        reason = closed[0]
        assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), reason
        assert reason.reply_code == 403
        assert reason.reply_text.startswith("ACCESS_REFUSED - ")
        assert f"queue '{p}.q'" in reason.reply_text
        # the connection and its other channel go on; what they may do is the new grant
        assert conn.is_open and other.is_open
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            other.queue_declare(f"{p}.q2")
        assert refused.value.reply_code == 403
    finally:
        if conn.is_open:
            conn.close()


# ---- the native client ---------------------------------------------------------------------
def test_native_sessions_lose_a_removed_login_and_a_withdrawn_grant(
    node: tuple[PolymqProcess, Users],
) -> None:
    proc, users = node
    p, (gone, changed, limited) = users.fresh(proc, "gone", "pw", "limited")

    async def run() -> None:
        port = proc.ports["core"]
        clients = {
            name: await Client.connect("127.0.0.1", port, user=name, password=PASSWORD)
            for name in (gone, changed, limited)
        }
        subs = {name: await c.subscribe(f"queue/{p}.{name}") for name, c in clients.items()}
        kept = await clients[limited].subscribe(f"queue/{p}.kept")
        await clients[limited].publish(f"queue/{p}.out", b"allowed")  # (a kept decision)
        del users.users[gone]
        users.add(changed, (f"queue/{p}*", EVERYTHING), password_hash=hash_password("new"))
        users.add(limited, (f"queue/{p}.kept", ["read", "write"]))
        await asyncio.to_thread(users.reload, proc)
        for name in (gone, changed):  # the login is gone: Goodbye, the connection closes
            with pytest.raises(ConnectionClosed) as closed:
                await subs[name].get(REACH)
            assert "(unauthorized)" in str(closed.value)
            assert f"user '{name}' was removed, or the password" in str(closed.value)
            assert clients[name].closed
        # the grant is withdrawn: the subscription it no longer allows ends, the rest goes on
        with pytest.raises(Forbidden) as ended:
            await subs[limited].get(REACH)
        assert "withdrawn by a users reload" in str(ended.value)
        with pytest.raises(Forbidden):
            await clients[limited].publish(f"queue/{p}.out", b"refused")
        await clients[limited].publish(f"queue/{p}.kept", b"still allowed")
        assert (await kept.get(REACH)).message.body == b"still allowed"
        for client in clients.values():
            await client.close()

    asyncio.run(run())


# ---- long polling and Server-Sent Events ---------------------------------------------------
def longpoll(proc: PolymqProcess, user: str) -> Longpoll:
    basic = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
    return Longpoll(proc.url("longpoll"), Authorization=f"Basic {basic}")


def test_a_removed_users_sse_stream_ends_with_a_problem_event(
    node: tuple[PolymqProcess, Users],
) -> None:
    proc, users = node
    p, (name,) = users.fresh(proc, "gone")
    lp = longpoll(proc, name)
    sub = lp.open(f"queue/{p}.q")
    lp.publish(f"queue/{p}.q", "before")
    with lp.events(sub["id"]) as stream:
        assert [e.data["body"] for e in stream.read(1)] == ["before"]
        del users.users[name]
        users.reload(proc)
        stream.read_for(REACH)
        assert stream.ended, "the stream is still open"
        problems = [e for e in stream.events if e.event == "problem"]
        assert len(problems) == 1, stream.events
        assert problems[0].data["status"] == 401
        assert f"user '{name}' was removed" in problems[0].data["detail"]


def test_long_polls_held_open_end_with_401_or_403(node: tuple[PolymqProcess, Users]) -> None:
    proc, users = node
    p, (gone, limited) = users.fresh(proc, "gone", "limited")
    clients = {name: longpoll(proc, name) for name in (gone, limited)}
    subs = {name: lp.open(f"queue/{p}.{name}") for name, lp in clients.items()}

    def polls_open() -> float:
        text = requests.get(f"{proc.url('admin')}/metrics", timeout=WAIT).text
        return metric(text, "polymq_longpoll_polls_open")

    before = polls_open()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        polls = {
            name: pool.submit(
                lp.get, f"/v1/subscriptions/{subs[name]['id']}/poll", params={"wait": 25}
            )
            for name, lp in clients.items()
        }
        eventually(lambda: polls_open() >= before + 2, WAIT)
        del users.users[gone]
        users.add(limited, (f"queue/{p}.other", ["read"]))
        users.reload(proc)
        started = time.monotonic()
        answers = {name: poll.result(WAIT + REACH) for name, poll in polls.items()}
    assert time.monotonic() - started < REACH, "the polls waited on"
    body = assert_problem(answers[gone], 401)
    assert f"user '{gone}' was removed" in body["detail"]
    body = assert_problem(answers[limited], 403)
    assert "withdrawn by a users reload" in body["detail"]
    # and the next poll is refused too
    r = clients[limited].get(f"/v1/subscriptions/{subs[limited]['id']}/poll", params={"wait": 0})
    assert_problem(r, 403)
    r = clients[gone].get(f"/v1/subscriptions/{subs[gone]['id']}/poll", params={"wait": 0})
    assert_problem(r, 401)
