"""System names are the system's (issue 27 point 2), on one ``polymq run --auth
file:users.json`` node, through every protocol with its real client: a user granted ``*``
or ``topic/*`` cannot subscribe to ``system.*`` (nor hear it, nor AMQP's direct reply-to
replies, through ``#``), cannot publish a control message (``system.connections.close``, a
``system.config`` reload with a forged version: the frontends still apply the
administrator's next reload), and cannot name a ``reply_to`` they may not write."""

from __future__ import annotations

import asyncio
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

from polymq import Client
from polymq.errors import Forbidden
from polymq.types import Message
from polymq_server.auth.provider import hash_password

from ...procs import WAIT, PolymqProcess, serving
from ..stomp.helpers import Clients, clients
from ..webapi import assert_problem

pytestmark = pytest.mark.timeout(120)

ADMIN = ("root", "root-pw")  # tagged administrator
MALLORY = ("mallory", "mallory-pw")  # granted "*"
TOPICS = ("topics", "topics-pw")  # granted "topic/*"
TEAM = ("team", "team-pw")  # granted queue/team.* (and to write replies to reply channels)
ALL = ["read", "write", "configure"]
FORGED = 9 * 10**18  # a reload version no request made
FRONTENDS = ("http", "stomp", "amqp", "longpoll", "avro")


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir = Path(tmp_path_factory.mktemp("reserved"))
    users = {
        ADMIN[0]: {
            "password_hash": hash_password(ADMIN[1]),
            "grants": [{"pattern": "*", "permissions": ALL}],
            "tags": ["administrator"],
        },
        MALLORY[0]: {
            "password_hash": hash_password(MALLORY[1]),
            "grants": [{"pattern": "*", "permissions": ALL}],
        },
        TOPICS[0]: {
            "password_hash": hash_password(TOPICS[1]),
            "grants": [{"pattern": "topic/*", "permissions": ALL}],
        },
        TEAM[0]: {
            "password_hash": hash_password(TEAM[1]),
            "grants": [
                {"pattern": "queue/team.*", "permissions": ALL},
                {"pattern": "topic/amqp-reply.*", "permissions": ["write"]},
            ],
        },
    }
    path = workdir / "users.json"
    path.write_text(json.dumps({"users": users}))
    with serving("run", workdir, "--auth", f"file:{path}") as proc:
        yield proc


@pytest.fixture
def stomp_clients(node: PolymqProcess) -> Iterator[Clients]:
    with clients(node, "tcp") as make:
        yield make


def pika_channel(node: PolymqProcess, who: tuple[str, str]) -> Any:
    params = pika.ConnectionParameters(
        "127.0.0.1",
        node.ports["amqp"],
        credentials=pika.PlainCredentials(*who),
        socket_timeout=WAIT,
        blocked_connection_timeout=WAIT,
    )
    return pika.BlockingConnection(params).channel()


def amqp_publish_refused(
    node: PolymqProcess, who: tuple[str, str], exchange: str, key: str, **properties: Any
) -> None:
    """A publish (confirmed) that the frontend answers with channel.close 403."""
    channel = pika_channel(node, who)
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_publish(exchange, key, b"q", pika.BasicProperties(**properties))
    assert info.value.reply_code == 403, info.value
    channel.connection.close()


def stomp_refused(
    clients: Clients,
    who: tuple[str, str],
    command: str,
    *args: Any,
    headers: dict[str, str] | None = None,
    **kw: Any,
) -> str:
    """``command`` (``send``, ``subscribe``) answered by an ERROR frame; its body."""
    client = clients(username=who[0], passcode=who[1])
    getattr(client.conn, command)(*args, headers={**(headers or {}), "receipt": "r"}, **kw)
    error = client.listener.wait_error()
    assert error.headers["message"] == "access_refused", error.headers
    body: str = error.body
    return body


async def native(node: PolymqProcess, who: tuple[str, str]) -> Client:
    return await Client.connect("127.0.0.1", node.ports["core"], user=who[0], password=who[1])


def reload(node: PolymqProcess, change: dict[str, Any], auth: Any = ADMIN) -> int:
    r = requests.post(
        f"{node.url('admin')}/api/config/reload", json=change, auth=auth, timeout=WAIT
    )
    assert r.status_code == 200, r.text
    version: int = r.json()["version"]
    return version


def system_traffic(node: PolymqProcess) -> None:
    """What the core and the frontends say on system topics: a reload (system.config) and
    a connection listing (system.connections.list, and the frontends' answers)."""
    reload(node, {"log_level": "INFO"})
    r = requests.get(f"{node.url('admin')}/api/connections", auth=ADMIN, timeout=WAIT)
    assert r.status_code == 200, r.text


def refused(detail: str) -> None:
    assert "reserved for polymq's own use" in detail, detail


# ---- subscribing -------------------------------------------------------------------------
@pytest.mark.parametrize("who", [MALLORY, TOPICS])
def test_http_and_longpoll_refuse_system_names(node: PolymqProcess, who: tuple[str, str]) -> None:
    http, longpoll = node.url("http"), node.url("longpoll")
    for destination in ("topic/system.#", "topic/system*", "topic/system.config"):
        r = requests.post(
            f"{longpoll}/v1/subscriptions", json={"destination": destination}, auth=who,
            timeout=WAIT,
        )  # fmt: skip
        refused(assert_problem(r, 403)["detail"])
    refused(
        assert_problem(requests.get(f"{http}/v1/topic/system.config", auth=who, timeout=WAIT), 403)[
            "detail"
        ]
    )
    if who is MALLORY:  # (queues: "*" grants them, "topic/*" does not)
        r = requests.post(f"{http}/v1/queue/system.jobs/pull", auth=who, timeout=WAIT)
        refused(assert_problem(r, 403)["detail"])


@pytest.mark.parametrize("who", [MALLORY, TOPICS])
def test_stomp_refuses_system_subscriptions_with_an_error_frame(
    stomp_clients: Clients, who: tuple[str, str]
) -> None:
    for destination in ("/topic/system.#", "/topic/system.connections.list", "/topic/system*"):
        refused(stomp_refused(stomp_clients, who, "subscribe", destination, id="1"))


def test_amqp_refuses_system_bindings_with_403(node: PolymqProcess) -> None:
    for key in ("system.#", "system.config", "amqp-reply.#"):
        channel = pika_channel(node, MALLORY)
        q = channel.queue_declare("", exclusive=True).method.queue
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_bind(q, "amq.topic", key)
        assert info.value.reply_code == 403, info.value
        refused(info.value.reply_text)
        channel.connection.close()


def test_native_client_refuses_system_subscriptions(node: PolymqProcess) -> None:
    async def run() -> None:
        for who in (MALLORY, TOPICS):
            async with await native(node, who) as client:
                for pattern in ("topic/system.#", "topic/system*", "topic/amqp-reply.#"):
                    with pytest.raises(Forbidden) as info:
                        await client.subscribe(pattern)
                    refused(info.value.message)

    asyncio.run(run())


# ---- control messages --------------------------------------------------------------------
def test_no_protocol_publishes_a_control_message_and_reloads_stay_real(
    node: PolymqProcess, stomp_clients: Clients
) -> None:
    """``system.connections.close`` (anyone's connection, the frontends' own core links)
    and a ``system.config`` reload whose version no request made: refused on every
    protocol; the administrator's next reload is still applied by every frontend."""
    forged = json.dumps({"version": FORGED, "log_level": "CRITICAL"})
    close = json.dumps({"id": "http-00000000.1", "reason": "pwned"})
    for topic, body in (("system.config", forged), ("system.connections.close", close)):
        r = requests.post(
            f"{node.url('http')}/v1/topic/{topic}/messages",
            json={"body": body, "reply_to": "topic/x"}, auth=TOPICS, timeout=WAIT,
        )  # fmt: skip
        refused(assert_problem(r, 403)["detail"])
        r = requests.post(
            f"{node.url('longpoll')}/v1/topic/{topic}/messages",
            json={"body": body}, auth=MALLORY, timeout=WAIT,
        )  # fmt: skip
        refused(assert_problem(r, 403)["detail"])

        refused(stomp_refused(stomp_clients, TOPICS, "send", f"/topic/{topic}", body))
        amqp_publish_refused(node, TOPICS, "amq.topic", topic)

    async def wire() -> None:
        async with await native(node, MALLORY) as client:
            with pytest.raises(Forbidden):
                await client.publish("topic/system.config", forged.encode())

    asyncio.run(wire())
    reloads_reach_every_frontend(node)


def test_the_frontends_obey_the_core_alone(node: PolymqProcess, stomp_clients: Clients) -> None:
    """An administrator may publish on ``system.*`` (trusted), but a control message is the
    core's: a reload the core did not send (a version an hour ahead: within what a clock
    could be off) and a close of someone's connection are ignored by every frontend."""
    victim = stomp_clients(username=TOPICS[0], passcode=TOPICS[1])
    r = requests.get(f"{node.url('admin')}/api/connections", auth=ADMIN, timeout=WAIT)
    assert r.status_code == 200, r.text
    [conn_id] = [c["id"] for c in r.json()["connections"]
                 if c["protocol"] == "stomp" and c["user"] == TOPICS[0]]  # fmt: skip
    ahead = int((time.time() + 3600) * 1e6)
    for topic, request in (
        ("system.config", {"version": ahead, "log_level": "CRITICAL"}),
        ("system.connections.close", {"id": conn_id, "reason": "forged"}),
    ):
        r = requests.post(
            f"{node.url('http')}/v1/topic/{topic}/messages",
            json={"body": json.dumps(request), "reply_to": "topic/system.connections.reply.x"},
            auth=ADMIN, timeout=WAIT,
        )  # fmt: skip
        assert r.status_code == 200 and r.json()["subscribers"] >= 1, r.text
    reloads_reach_every_frontend(node)
    assert f"configuration {ahead} applied" not in node.log()
    victim.send_receipted(f"/topic/{unique('still')}", "here")  # still connected


def reloads_reach_every_frontend(node: PolymqProcess, auth: Any = ADMIN) -> None:
    version = reload(node, {"log_level": "INFO"}, auth)
    deadline = time.monotonic() + WAIT
    while not all(f"{fe}: configuration {version} applied" in node.log() for fe in FRONTENDS):
        assert time.monotonic() < deadline, "a frontend ignored the administrator's reload"
        time.sleep(0.05)
    assert requests.get(f"{node.url('http')}/readyz", timeout=WAIT).status_code == 200


def test_anonymous_mode_sends_no_control_message(tmp_path: Path) -> None:
    """Without ``--auth`` every client may do everything but speak for polymq: nobody
    publishes a control message; reading ``system.*`` stays open (a frontend run apart logs
    in to the core as anonymous), AMQP's replies do not."""
    forged = json.dumps({"version": FORGED, "log_level": "CRITICAL"})
    guest = ("guest", "guest")
    with PolymqProcess("run", tmp_path) as node:
        for topic in ("system.config", "system.connections.close"):
            r = requests.post(
                f"{node.url('http')}/v1/topic/{topic}/messages", json={"body": forged},
                timeout=WAIT,
            )  # fmt: skip
            refused(assert_problem(r, 403)["detail"])
            with clients(node, "tcp") as make:
                refused(stomp_refused(make, guest, "send", f"/topic/{topic}", forged))
            amqp_publish_refused(node, guest, "amq.topic", topic)

        async def wire() -> None:
            async with await Client.connect("127.0.0.1", node.ports["core"]) as client:
                with pytest.raises(Forbidden):
                    await client.publish("topic/system.config", forged.encode())
                with pytest.raises(Forbidden):
                    await client.subscribe("topic/amqp-reply.#")
                await client.subscribe("topic/system.config")

        asyncio.run(wire())
        reloads_reach_every_frontend(node, None)


# ---- reply-to ----------------------------------------------------------------------------
def test_a_reply_to_must_be_writable_by_its_sender(
    node: PolymqProcess, stomp_clients: Clients
) -> None:
    """A responder (or polymq) writes where ``reply_to`` says: naming a destination its
    sender may not write is refused, a writable one is not."""
    ours, theirs = unique("team.req"), "queue/payroll"
    r = requests.post(
        f"{node.url('http')}/v1/queue/{ours}/messages",
        json={"body": "q", "reply_to": theirs}, auth=TEAM, timeout=WAIT,
    )  # fmt: skip
    assert "write permission on 'queue/payroll'" in assert_problem(r, 403)["detail"]
    r = requests.post(
        f"{node.url('http')}/v1/queue/{ours}/messages",
        json={"body": "q", "reply_to": f"queue/{unique('team.answers')}"}, auth=TEAM,
        timeout=WAIT,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    r = requests.post(
        f"{node.url('longpoll')}/v1/topic/news/messages",
        json={"body": "q", "reply_to": "topic/system.connections.list"}, auth=TOPICS,
        timeout=WAIT,
    )  # fmt: skip
    refused(assert_problem(r, 403)["detail"])

    stomp_refused(
        stomp_clients, TEAM, "send", f"/queue/{ours}", "q", **{"reply-to": "/queue/payroll"}
    )
    amqp_publish_refused(node, TEAM, "", ours, reply_to="payroll")

    async def wire() -> None:
        async with await native(node, TEAM) as client:
            with pytest.raises(Forbidden):
                await client.publish(f"queue/{ours}", Message(b"q", reply_to=theirs))
            await client.publish(f"queue/{ours}", Message(b"q", reply_to=f"queue/{ours}"))

    asyncio.run(wire())


def test_a_stomp_temp_queue_takes_replies_but_serves_its_connection_alone(
    node: PolymqProcess, stomp_clients: Clients
) -> None:
    """A STOMP requester's ``/temp-queue/x`` reaches a responder as its real name
    (``/queue/tmp.<connection>.x``): the responder may write its reply there, but no other
    connection — not even one of the same user, granted ``*`` — may subscribe to (steal the
    replies of), pull from or purge it; the requester gets the reply."""
    service = unique("team.svc")
    requester = stomp_clients(username=MALLORY[0], passcode=MALLORY[1])
    responder = stomp_clients(username=MALLORY[0], passcode=MALLORY[1])
    responder.conn.subscribe(f"/queue/{service}", id="svc", headers={"receipt": "svc"})
    responder.listener.wait_receipt("svc")
    requester.conn.send(f"/queue/{service}", "ping", headers={"reply-to": "/temp-queue/r"})
    [request] = responder.listener.wait_messages(1)
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith("/queue/tmp."), reply_to
    core_name = reply_to.removeprefix("/")  # queue/tmp.<connection>.r

    body = stomp_refused(stomp_clients, MALLORY, "subscribe", reply_to, id="steal")
    assert "reserved" in body, body
    r = requests.post(f"{node.url('http')}/v1/{core_name}/purge", auth=MALLORY, timeout=WAIT)
    assert_problem(r, 403)
    r = requests.delete(f"{node.url('http')}/v1/{core_name}", auth=MALLORY, timeout=WAIT)
    assert_problem(r, 403)
    r = requests.post(
        f"{node.url('http')}/v1/{core_name}/pull", params={"max": 1}, auth=MALLORY,
        timeout=WAIT,
    )  # fmt: skip
    assert_problem(r, 403)

    async def wire() -> None:
        async with await native(node, MALLORY) as client:
            with pytest.raises(Forbidden):
                await client.subscribe(core_name)

    asyncio.run(wire())
    responder.conn.send(reply_to, "pong")  # a reply, by its exact name: allowed
    [reply] = requester.listener.wait_messages(1)
    assert reply.body == "pong"
    assert reply.headers["destination"] == "/temp-queue/r"


def longpoll_open(node: PolymqProcess, destination: str) -> dict[str, Any]:
    r = requests.post(
        f"{node.url('longpoll')}/v1/subscriptions", json={"destination": destination},
        auth=MALLORY, timeout=WAIT,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    sub: dict[str, Any] = r.json()
    return sub


def longpoll_until(node: PolymqProcess, sub: dict[str, Any], topic: str) -> list[str]:
    """The destinations a long-poll subscription hears, up to ``topic``'s message."""
    seen: list[str] = []
    cursor = sub["cursor"]
    deadline = time.monotonic() + WAIT
    while topic not in seen:
        assert time.monotonic() < deadline, seen
        r = requests.get(
            f"{node.url('longpoll')}/v1/subscriptions/{sub['id']}/poll",
            params={"cursor": cursor, "wait": 2}, auth=MALLORY, timeout=WAIT,
        )  # fmt: skip
        assert r.status_code == 200, r.text
        cursor = r.json()["cursor"]
        seen += [m["destination"] for m in r.json()["messages"]]
    return seen


def test_hash_hears_neither_system_topics_nor_direct_replies(
    node: PolymqProcess, stomp_clients: Clients
) -> None:
    """An AMQP requester's replies (direct reply-to) reach it alone, and the core's and
    frontends' system traffic nobody: not a ``#`` binding on ``amq.topic``, a STOMP
    ``/topic/#``, a long-poll ``topic/#`` or a native ``#`` subscription, whose first message
    is the application's marker published after them all."""
    rpc, marker = unique("team.rpc"), unique("app.marker")
    eavesdropper = pika_channel(node, MALLORY)
    tap = eavesdropper.queue_declare("", exclusive=True).method.queue
    eavesdropper.queue_bind(tap, "amq.topic", "#")
    stomp_tap = stomp_clients(username=MALLORY[0], passcode=MALLORY[1])
    stomp_tap.subscribe("/topic/#")
    longpoll_tap = longpoll_open(node, "topic/#")

    requester = pika_channel(node, TEAM)
    replies: list[bytes] = []
    requester.basic_consume(
        "amq.rabbitmq.reply-to", lambda _ch, _m, _p, body: replies.append(body), auto_ack=True
    )
    requester.queue_declare(rpc, auto_delete=False)
    requester.basic_publish(
        "", rpc, b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
    )

    async def respond_and_listen() -> str:
        async with await native(node, TEAM) as responder, await native(node, MALLORY) as listener:
            hash_sub = await listener.subscribe("topic/#")
            await asyncio.to_thread(system_traffic, node)
            [lease] = await responder.pull(f"queue/{rpc}", 1, wait=WAIT)
            reply_to = lease.message.reply_to
            assert reply_to is not None and reply_to.startswith("topic/amqp-reply."), reply_to
            await responder.publish(reply_to, b"pong")
            await responder.settle([lease.receipt])
            await listener.publish(f"topic/{marker}", b"m")  # (after the reply)
            return str((await hash_sub.get(WAIT)).message.destination)

    assert asyncio.run(respond_and_listen()) == f"topic/{marker}"  # and nothing before it
    deadline = time.monotonic() + WAIT
    while not replies:
        assert time.monotonic() < deadline, "the requester got no reply"
        requester.connection.process_data_events(time_limit=0.1)
    assert replies == [b"pong"]
    tapped: list[str] = []
    while marker not in tapped:
        assert time.monotonic() < deadline + WAIT, tapped
        method, _props, _body = eavesdropper.basic_get(tap, auto_ack=True)
        if method is not None:
            tapped.append(method.routing_key)
    assert tapped == [marker], tapped
    got = stomp_tap.listener.wait_messages(1)
    assert got[0].headers["destination"] == f"/topic/{marker}", got[0].headers
    assert longpoll_until(node, longpoll_tap, f"topic/{marker}") == [f"topic/{marker}"]
    requester.connection.close()
    eavesdropper.connection.close()
