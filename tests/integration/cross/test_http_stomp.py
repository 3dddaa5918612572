"""Across protocols, against one ``polymq run``: what HTTP (``/v1/...``) or the native client
publishes, STOMP receives (over TCP and WebSocket) with its body, content type, priority and
headers intact, and the reverse; binary bodies with NULs survive (``content-length``)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from polymq import Client, Message

from ...procs import PolymqProcess
from ..stomp.helpers import WAIT, Clients, clients, unique
from .helpers import BINARY, body_of, post, pull

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir: Path = tmp_path_factory.mktemp("cross")
    with PolymqProcess("run", workdir) as proc:
        yield proc


@pytest.fixture(params=["tcp", "ws"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def stomp_client(run: PolymqProcess, transport: str) -> Iterator[Clients]:
    with clients(run, transport) as make:
        yield make


# ---- HTTP -> STOMP --------------------------------------------------------------------------
def test_http_post_is_received_over_stomp(run: PolymqProcess, stomp_client: Clients) -> None:
    name = unique()
    consumer = stomp_client()
    consumer.subscribe(f"/queue/{name}")
    published = post(
        run,
        f"queue/{name}/messages",
        {
            "body": '{"order": 42}',
            "content_type": "application/json",
            "priority": 7,
            "persistent": True,
            "headers": {"x-trace": "abc", "x-tenant": "t1", "x-colon": "a:b"},
            "correlation_id": "corr-1",
            "reply_to": "queue/answers",
            "ttl": 60,
        },
    )
    [msg] = consumer.listener.wait_messages(1)
    h = msg.headers
    assert msg.body == '{"order": 42}'
    assert h["content-type"] == "application/json"
    assert h["priority"] == "7"
    assert h["persistent"] == "true"
    assert (h["x-trace"], h["x-tenant"], h["x-colon"]) == ("abc", "t1", "a:b")
    assert h["correlation-id"] == "corr-1"
    assert h["reply-to"] == "/queue/answers"  # shown in STOMP's form
    assert h["message-id"] == published["ids"][0]  # one id across protocols
    assert h["destination"] == f"/queue/{name}"
    assert abs(int(h["expires"]) / 1000 - (time.time() + 60)) < 30
    assert abs(int(h["timestamp"]) / 1000 - time.time()) < 30


def test_http_messages_wait_for_stomp_in_priority_order(
    run: PolymqProcess, stomp_client: Clients
) -> None:
    name = unique()
    post(run, f"queue/{name}/messages", {"messages": [
        {"body": "low", "priority": 1},
        {"body": "high", "priority": 9},
        {"body": "mid"},
    ]})  # fmt: skip
    consumer = stomp_client()
    consumer.subscribe(f"/queue/{name}")
    msgs = consumer.listener.wait_messages(3)
    assert [(m.body, m.headers["priority"]) for m in msgs] == [
        ("high", "9"),
        ("mid", "4"),
        ("low", "1"),
    ]
    assert msgs[0].headers["content-type"] == "text/plain; charset=utf-8"  # HTTP's default


def test_http_topic_publish_reaches_stomp_subscribers(
    run: PolymqProcess, stomp_client: Clients
) -> None:
    base = unique()
    exact, pattern = stomp_client(), stomp_client()
    exact.subscribe(f"/topic/{base}.news")
    pattern.subscribe(f"/topic/{base}.*")
    out = post(run, f"topic/{base}.news/messages", {"body": "extra", "headers": {"x-k": "v"}})
    assert out["subscribers"] == 2
    for c in (exact, pattern):
        [msg] = c.listener.wait_messages(1)
        assert (msg.body, msg.headers["x-k"]) == ("extra", "v")
        assert msg.headers["destination"] == f"/topic/{base}.news"


# ---- STOMP -> HTTP -------------------------------------------------------------------------
def test_stomp_send_is_pulled_over_http(run: PolymqProcess, stomp_client: Clients) -> None:
    name = unique()
    producer = stomp_client()
    producer.send_receipted(
        f"/queue/{name}",
        "a,b\n1,2\n",
        **{"content-type": "text/csv"},
        priority="8",
        persistent="true",
        **{
            "x-trace": "xyz",
            "x-colon": "k:v",
            "correlation-id": "corr-2",
            "reply-to": "/queue/replies",
        },
    )
    [m] = pull(run, name)
    assert body_of(m) == b"a,b\n1,2\n"
    assert m["content_type"] == "text/csv"
    assert m["priority"] == 8
    assert m["persistent"] is True
    assert m["correlation_id"] == "corr-2"
    assert m["reply_to"] == "queue/replies"  # the core's form
    assert m["headers"] == {"x-trace": "xyz", "x-colon": "k:v"}  # STOMP's own headers stay
    assert m["destination"] == f"queue/{name}"
    assert m["delivery_count"] == 1


def test_stomp_send_without_content_type_is_octet_stream(
    run: PolymqProcess, stomp_client: Clients
) -> None:
    name = unique()
    stomp_client().send_receipted(f"/queue/{name}", "plain")
    [m] = pull(run, name)
    assert m["content_type"] == "application/octet-stream"
    assert m["priority"] == 4
    assert m["persistent"] is False
    assert m["headers"] == {}


# ---- binary bodies ------------------------------------------------------------------------
def binary_client(make: Clients, transport: str) -> Any:
    """A stomp.py client that hands bodies over as bytes (and, over WebSocket, sends binary
    messages: a body with NULs and invalid UTF-8 is no text)."""
    ctor: dict[str, Any] = {"auto_decode": False}
    if transport == "ws":
        ctor["binary_mode"] = True
    return make(ctor=ctor)


def test_binary_body_from_stomp_to_http(
    run: PolymqProcess, stomp_client: Clients, transport: str
) -> None:
    name = unique()
    producer = binary_client(stomp_client, transport)
    producer.send_receipted(f"/queue/{name}", BINARY)  # stomp.py adds content-length
    [m] = pull(run, name)
    assert m["encoding"] == "base64"
    assert body_of(m) == BINARY


def test_binary_body_from_http_to_stomp(
    run: PolymqProcess, stomp_client: Clients, transport: str
) -> None:
    name = unique()
    consumer = binary_client(stomp_client, transport)
    consumer.subscribe(f"/queue/{name}")
    post(
        run,
        f"queue/{name}/messages",
        {"body": base64.b64encode(BINARY).decode(), "encoding": "base64"},
    )
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == BINARY
    assert msg.headers["content-length"] == str(len(BINARY))
    assert msg.headers["content-type"] == "application/octet-stream"


def test_binary_body_from_stomp_to_stomp(stomp_client: Clients, transport: str) -> None:
    q = f"/queue/{unique()}"
    consumer = binary_client(stomp_client, transport)
    consumer.subscribe(q)
    binary_client(stomp_client, transport).send_receipted(q, BINARY)
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == BINARY


# ---- native client <-> STOMP -----------------------------------------------------------
async def test_native_client_to_stomp(run: PolymqProcess, stomp_client: Clients) -> None:
    name = unique()
    consumer = stomp_client(ctor={"auto_decode": False})
    consumer.subscribe(f"/queue/{name}")
    async with await Client.connect("127.0.0.1", run.ports["core"]) as client:
        await client.publish(
            f"queue/{name}",
            Message(
                BINARY,
                content_type="application/x-thing",
                headers={"x-from": "native"},
                priority=6,
                correlation_id="n-1",
            ),
        )
    [msg] = await asyncio.to_thread(consumer.listener.wait_messages, 1)
    h = msg.headers
    assert msg.body == BINARY
    assert (h["content-type"], h["priority"], h["x-from"]) == ("application/x-thing", "6", "native")
    assert h["correlation-id"] == "n-1"


async def test_stomp_to_native_client(run: PolymqProcess, stomp_client: Clients) -> None:
    name = unique()
    async with await Client.connect("127.0.0.1", run.ports["core"]) as client:
        sub = await client.subscribe(f"queue/{name}", ack_mode="client-individual")
        producer = stomp_client()
        await asyncio.to_thread(
            producer.send_receipted,
            f"/queue/{name}",
            "from stomp",
            **{"content-type": "text/plain"},
            priority="9",
            persistent="true",
            **{"x-from": "stomp", "correlation-id": "s-1"},
        )
        delivery = await sub.get(WAIT)
        m = delivery.message
        assert m.body == b"from stomp"
        assert (m.content_type, m.priority, m.persistent) == ("text/plain", 9, True)
        assert m.headers == {"x-from": "stomp"}
        assert m.correlation_id == "s-1"
        assert m.destination == f"queue/{name}"
        delivery.ack()


# ---- what the core refuses -------------------------------------------------------------
def test_a_send_the_core_refuses_is_an_error_not_a_receipt(
    run: PolymqProcess, stomp_client: Clients
) -> None:
    """A queue declared over HTTP to hold one message and refuse more: the first SEND gets its
    RECEIPT, the second an ERROR carrying its receipt id, and only the first is kept."""
    name = unique()
    r = requests.put(
        f"{run.url('http')}/v1/queue/{name}",
        json={"max_length": 1, "overflow": "reject"},
        timeout=WAIT,
    )
    assert r.status_code == 200, r.text
    producer = stomp_client()
    producer.send_receipted(f"/queue/{name}", "fits")
    producer.conn.send(f"/queue/{name}", "too many", headers={"receipt": "second"})
    error = producer.listener.wait_error()
    assert error.headers["message"] == "SEND refused: queue-full"
    assert error.headers["receipt-id"] == "second"
    assert "second" not in producer.listener.receipts
    assert [body_of(m) for m in pull(run, name)] == [b"fits"]


def test_utf8_headers_and_bodies_cross_protocols(run: PolymqProcess, stomp_client: Clients) -> None:
    name = unique()
    consumer = stomp_client()
    consumer.subscribe(f"/queue/{name}")
    post(run, f"queue/{name}/messages", {"body": "café ☕", "headers": {"x-name": "ünï ☕"}})
    [msg] = consumer.listener.wait_messages(1)
    assert (msg.body, msg.headers["x-name"]) == ("café ☕", "ünï ☕")
    other = unique()
    consumer.send_receipted(f"/queue/{other}", "naïve ☕", **{"x-name": "ça:va"})
    [m] = pull(run, other)
    assert (body_of(m).decode(), m["headers"]) == ("naïve ☕", {"x-name": "ça:va"})
