"""Avro records read as JSON where a client asks for JSON, against one ``polymq run``: the
HTTP frontend's pull, the long-polling frontend's polls and its server-sent events add each
record decoded as ``value`` (the same way: one message format); a STOMP subscription with
``accept: application/json`` gets JSON bodies. The records are published as the Avro
frontend stores them (single-object encoding, schema in the core's key/value store)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from polymq import Client, Message
from polymq_server.messages.avro import (
    CONTENT_TYPE,
    KV_SCHEMAS,
    SCHEMA_ID_HEADER,
    encode_single,
    parse,
)

from ...procs import PolymqProcess
from ..longpoll.conftest import Longpoll
from ..stomp.helpers import WAIT, Clients, clients, unique

pytestmark = pytest.mark.timeout(60)

SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": f"test.x{uuid.uuid4().hex[:8]}",  # a schema no earlier run stored
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "raw", "type": "bytes"},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
AT = datetime.datetime(2026, 11, 21, 12, 30, tzinfo=datetime.UTC)


def record(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "item": f"widget-{i}",
        "note": None if i % 2 else f"n{i}",
        "raw": bytes([i % 256, 0, 255]),
        "price": decimal.Decimal(f"{i}.25"),
        "at": AT,
    }


def as_json(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "item": f"widget-{i}",
        "note": None if i % 2 else f"n{i}",
        "raw": base64.b64encode(bytes([i % 256, 0, 255])).decode(),
        "price": f"{i}.25",
        "at": AT.isoformat(),
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir: Path = tmp_path_factory.mktemp("avrojson")
    with PolymqProcess("run", workdir) as proc:
        yield proc


async def publish(
    run: PolymqProcess, dest: str, n: int, *, store_schema: bool = True, name: str = "Order"
) -> str:
    schema = parse({**SCHEMA, "name": name})
    async with await Client.connect("127.0.0.1", run.ports["core"]) as c:
        if store_schema:
            await c.kv_put(KV_SCHEMAS + schema.id, schema.json.encode())
        messages = [
            Message(
                encode_single(schema, record(i)),
                content_type=CONTENT_TYPE,
                headers={SCHEMA_ID_HEADER: schema.id},
            )
            for i in range(n)
        ]
        await c.publish(dest, messages)
    return schema.id


def test_http_pull_shows_avro_records_as_json_values(run: PolymqProcess) -> None:
    name = unique()
    sid = asyncio.run(publish(run, f"queue/{name}", 20))
    r = requests.post(f"{run.url('http')}/v1/queue/{name}/pull", params={"max": 20}, timeout=WAIT)
    assert r.status_code == 200, r.text
    got = r.json()["messages"]
    assert [m["value"] for m in got] == [as_json(i) for i in range(20)]
    assert all(m["headers"][SCHEMA_ID_HEADER] == sid for m in got)
    assert all(m["content_type"] == CONTENT_TYPE and m["encoding"] == "base64" for m in got)
    assert base64.b64decode(got[0]["body"])[:2] == b"\xc3\x01"  # the bytes stay as they are


def test_http_pull_says_why_a_record_has_no_value(run: PolymqProcess) -> None:
    name = unique()
    plain = {
        "type": "record",
        "name": f"P{uuid.uuid4().hex[:8]}",
        "fields": [{"name": "a", "type": "int"}],
    }
    schema = parse(plain)  # never stored: its id is unknown to the core

    async def go() -> None:
        async with await Client.connect("127.0.0.1", run.ports["core"]) as c:
            await c.publish(
                f"queue/{name}",
                [
                    Message(encode_single(schema, {"a": 1}), content_type=CONTENT_TYPE),
                    Message(b"plain text"),
                ],
            )

    asyncio.run(go())
    r = requests.post(f"{run.url('http')}/v1/queue/{name}/pull", params={"max": 2}, timeout=WAIT)
    avro_msg, text_msg = r.json()["messages"]
    # no avro-schema-id header: named by the fingerprint its body carries
    assert avro_msg["value"] is None and schema.rabin in avro_msg["value_error"]
    assert "value" not in text_msg and text_msg["body"] == "plain text"


def test_long_poll_shows_avro_records_as_the_http_pull_does(run: PolymqProcess) -> None:
    name = unique()
    lp = Longpoll(run.url("longpoll"))
    sub = lp.open(f"queue/{name}", ack="client", prefetch=20)
    sid = asyncio.run(publish(run, f"queue/{name}", 20))
    got: list[dict[str, Any]] = []
    while len(got) < 20:
        answer = lp.poll(sub["id"], max=20, wait=5)
        assert answer["messages"], f"only {len(got)} of 20 records came"
        got += answer["messages"]
    assert [m["value"] for m in got] == [as_json(i) for i in range(20)]
    assert all(m["headers"][SCHEMA_ID_HEADER] == sid and m["receipt"] for m in got)
    assert all(m["content_type"] == CONTENT_TYPE and m["encoding"] == "base64" for m in got)
    # the same message, pulled over HTTP, reads the same but for the receipt and the cursor
    lp.settle("nack", *(m["receipt"] for m in got[:1]))
    r = requests.post(f"{run.url('http')}/v1/queue/{name}/pull", timeout=WAIT)
    [pulled] = r.json()["messages"]
    drop = ("receipt", "cursor", "delivery_count", "redelivered")
    first = {k: v for k, v in got[0].items() if k not in drop}
    assert {k: v for k, v in pulled.items() if k not in drop} == first


def test_server_sent_events_show_avro_records_and_why_one_has_no_value(
    run: PolymqProcess,
) -> None:
    name = unique()
    lp = Longpoll(run.url("longpoll"))
    sub = lp.open(f"stream/{name}", offset="first")
    asyncio.run(publish(run, f"stream/{name}", 5))
    unstored = asyncio.run(publish(run, f"stream/{name}", 1, store_schema=False, name="Unstored"))
    with lp.events(sub["id"]) as events:
        got = [e.data for e in events.read(6)]
    assert [m["value"] for m in got[:5]] == [as_json(i) for i in range(5)]
    assert got[5]["value"] is None and unstored in got[5]["value_error"]


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_stomp_accept_json_gets_avro_records_as_json_bodies(
    run: PolymqProcess, transport: str
) -> None:
    name = unique()
    with clients(run, transport) as make:
        as_is: Clients = make
        plain, js = as_is(), as_is()
        js.subscribe(f"/queue/{name}", sid="j", accept="application/json")
        sid = asyncio.run(publish(run, f"queue/{name}", 30))
        got = js.listener.wait_messages(30)
        assert [json.loads(m.body) for m in got] == [as_json(i) for i in range(30)]
        assert all(m.headers["content-type"] == "application/json" for m in got)
        assert all(m.headers[SCHEMA_ID_HEADER] == sid for m in got)
        # without accept, the same records arrive as Avro bytes
        other = unique()
        plain.subscribe(f"/stream/{other}", sid="p", **{"x-stream-offset": "first"})
        asyncio.run(publish(run, f"stream/{other}", 3))
        raw = plain.listener.wait_messages(3)
        assert all(m.headers["content-type"] == CONTENT_TYPE for m in raw)


def test_stomp_accept_json_passes_unknown_schemas_through_with_the_reason(
    run: PolymqProcess,
) -> None:
    name = unique()
    with clients(run, "tcp") as make:
        c = make()
        c.subscribe(f"/topic/{name}", sid="j", accept="application/json")
        asyncio.run(publish(run, f"topic/{name}", 2, store_schema=False, name="Unstored"))
        got = c.listener.wait_messages(2)
        assert all(m.headers["content-type"] == CONTENT_TYPE for m in got)
        assert all("x-avro-error" in m.headers for m in got)
