"""Tests for polymq.connections without sockets: the table a frontend keeps of its client
connections, and the responder's answers to the list and close requests (against a stand-in
for the client)."""

from __future__ import annotations

import json
from typing import Any

from polymq.types import Message
from polymq_server.link.connections import (
    CLOSE_TOPIC,
    LIST_TOPIC,
    ConnectionTable,
    Responder,
    instance_id,
)
from polymq_server.names import core_headers


def test_ids_start_with_the_instance_id_and_are_not_reused() -> None:
    table = ConnectionTable(instance_id("stomp"), "stomp")
    assert table.id.startswith("stomp-") and len(table.id) == len("stomp-") + 8
    a = table.open("stomp", "10.0.0.1:5000", lambda reason: None)
    b = table.open("stomp-ws", "10.0.0.2:5001", lambda reason: None)
    assert a.id == f"{table.id}.1" and b.id == f"{table.id}.2"
    table.close(a)
    table.close(a)  # twice is no error
    c = table.open("stomp", "10.0.0.3:5002", lambda reason: None)
    assert c.id == f"{table.id}.3"
    assert [e["id"] for e in table.describe()] == [b.id, c.id]
    assert table.owns(b.id) and table.owns(a.id)  # (owned: it is this instance's id)
    assert not table.owns(f"{table.id}x.1") and not table.owns("amqp-12345678.1")
    assert not table.owns(table.id)


def test_an_entry_describes_its_user_counters_and_counts() -> None:
    table = ConnectionTable("amqp-00000001", "amqp")
    counts = {"subscriptions": 2, "channels": 3}
    entry = table.open("amqp", "127.0.0.1:4000", lambda reason: None, lambda: dict(counts))
    entry.user, entry.vhost = "alice", "/prod"
    entry.messages_in += 5
    entry.messages_out += 7
    counts["subscriptions"] = 4  # read when described, not when opened
    row = table.describe()[0]
    assert row == {
        "id": "amqp-00000001.1",
        "protocol": "amqp",
        "peer": "127.0.0.1:4000",
        "user": "alice",
        "vhost": "/prod",
        "subscriptions": 4,
        "channels": 3,
        "messages_in": 5,
        "messages_out": 7,
        "connected_at": row["connected_at"],
    }
    assert row["connected_at"] > 1.7e9
    answer = table.answer("node-0")
    assert answer["frontend"] == "amqp-00000001" and answer["protocol"] == "amqp"
    assert answer["connections"][0]["frontend"] == "amqp-00000001"
    assert answer["connections"][0]["node"] == "node-0"


def test_shut_calls_the_closer_of_that_connection_only() -> None:
    table = ConnectionTable("http-00000002", "http")
    closed: list[tuple[str, str]] = []
    a = table.open("http", "p:1", lambda reason: closed.append(("a", reason)))
    table.open("http", "p:2", lambda reason: closed.append(("b", reason)))
    assert table.shut(a.id, "bye") is True
    assert closed == [("a", "bye")]
    assert table.shut("http-00000002.99", "bye") is False
    assert closed == [("a", "bye")]


def test_recheck_asks_every_connection_that_can_check_its_login() -> None:
    table = ConnectionTable("stomp-00000003", "stomp")
    checked: list[str] = []
    a = table.open("stomp", "p:1", lambda reason: None)
    a.recheck = lambda: checked.append("a")
    table.open("stomp", "p:2", lambda reason: None)  # (none: nothing to ask)
    c = table.open("stomp", "p:3", lambda reason: None)

    def closes_itself() -> None:
        checked.append("c")
        table.close(c)  # (a session that loses its login leaves the table meanwhile)

    c.recheck = closes_itself
    table.recheck()
    assert checked == ["a", "c"] and len(table) == 2


class _Sub:
    def __init__(self, destination: str) -> None:
        self.destination = destination


class _Client:
    """What the responder uses of a Client: subscribe, publish_nowait, server."""

    server = "polymq-core/n1"

    def __init__(self) -> None:
        self.subscribed: list[str] = []
        self.sent: list[tuple[str, Message]] = []

    async def subscribe(self, destination: str, **options: Any) -> _Sub:
        self.subscribed.append(destination)
        return _Sub(destination)

    def publish_nowait(self, destination: str, messages: list[Message]) -> None:
        self.sent += [(destination, m) for m in messages]


async def test_the_responder_answers_lists_and_the_owner_alone_closes() -> None:
    table = ConnectionTable("stomp-00000003", "stomp")
    closed: list[str] = []
    entry = table.open("stomp", "127.0.0.1:6000", closed.append)
    client = _Client()
    responder = Responder(client, table)  # type: ignore[arg-type]
    await responder.start()
    assert client.subscribed == [f"topic/{LIST_TOPIC}", f"topic/{CLOSE_TOPIC}"]
    ask = Message(
        b"{}", reply_to="topic/system.connections.reply.x", correlation_id="c1",
        headers=core_headers(),
    )  # fmt: skip
    responder.on_deliver(_Sub(f"topic/{LIST_TOPIC}"), [1], [ask])  # type: ignore[arg-type]
    (to, answer), *_ = client.sent
    assert to == "topic/system.connections.reply.x" and answer.correlation_id == "c1"
    listed = json.loads(answer.body)
    assert listed["node"] == "n1" and [c["id"] for c in listed["connections"]] == [entry.id]
    close = f"topic/{CLOSE_TOPIC}"
    reply, core = "topic/system.connections.reply.r", core_headers()
    mine = json.dumps({"id": entry.id}).encode()
    others = Message(b'{"id": "amqp-1.1"}', reply_to=reply, correlation_id="c2", headers=core)
    garbage = Message(b"not json", reply_to=reply, correlation_id="c3", headers=core)
    no_reply = Message(mine, headers=core)
    # an answer written elsewhere would be written with the frontend's authority: never
    deputy = Message(mine, reply_to="queue/not-theirs", headers=core)
    # and only the core asks (a client publishing there, an administrator's included)
    forged = Message(mine, reply_to=reply, correlation_id="c5")
    ignored = [others, garbage, no_reply, deputy, forged]
    responder.on_deliver(_Sub(close), [2, 3, 4, 5, 6], ignored)  # type: ignore[arg-type]
    assert len(client.sent) == 1 and closed == []  # not ours, unreadable, nowhere to answer
    asked = Message(mine, reply_to=reply, correlation_id="c4", headers=core)
    responder.on_deliver(_Sub(close), [7], [asked])  # type: ignore[arg-type]
    assert closed == ["closed by an administrator"]
    assert json.loads(client.sent[-1][1].body) == {
        "frontend": "stomp-00000003",
        "id": entry.id,
        "closed": True,
    }
