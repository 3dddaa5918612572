"""Avro nested deeper than a process's C stack, against one real ``polymq run``: a recursive
schema (a linked list) whose one record nests 20,000 deep. POSTed to the Avro frontend in
an object container it is refused with a 422 problem (fastavro's C reader used to
segfault the node); stored as an ordinary ``avro/binary`` message through the JSON over
HTTP frontend (a poison message) it is delivered with a decode error, to an HTTP pull and
to a STOMP subscriber that asked for JSON, and the message behind it is delivered too.
Every time, the node is still alive afterwards."""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any

import pytest
import requests
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from ...procs import PolymqProcess
from ..longpoll.conftest import Longpoll
from ..stomp.helpers import WAIT, clients
from ..webapi import TIMEOUT
from .conftest import Avro, assert_problem, read_container, unique

pytestmark = pytest.mark.timeout(120)

DEPTH = 20_000
LIST = {
    "type": "record",
    "name": "L",
    "namespace": f"test.deep{uuid.uuid4().hex[:8]}",  # a schema no earlier run stored
    "fields": [
        {"name": "v", "type": "int"},
        {"name": "next", "type": ["null", "L"]},
    ],
}


def linked(depth: int) -> bytes:
    """The binary encoding of a list of ``depth`` + 1 nodes (v = 1 each)."""
    return b"\x02\x02" * depth + b"\x02\x00"


def value(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"v": 1, "next": None}
    for _ in range(depth):
        node = {"v": 1, "next": node}
    return node


def _long(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    return bytes(out + bytes([z]))


def container(schema: Any, datum: bytes) -> bytes:
    """An object container (null codec) of one record, written by hand: fastavro's writer
    would recurse as deep as its reader."""
    sync = os.urandom(16)
    meta = {b"avro.schema": json.dumps(schema).encode(), b"avro.codec": b"null"}
    out = bytearray(b"Obj\x01" + _long(len(meta)))
    for k, v in meta.items():
        out += _long(len(k)) + k + _long(len(v)) + v
    out += _long(0) + sync + _long(1) + _long(len(datum)) + datum + sync
    return bytes(out)


def test_a_deep_record_in_a_container_is_refused(server: PolymqProcess, api: Avro) -> None:
    queue = f"queue/{unique('deep')}"
    body = container(LIST, linked(DEPTH))
    assert 30_000 < len(body) < 50_000
    r = api.publish(queue, body)
    problem = assert_problem(r, 422)
    assert "more than 128 deep" in problem["detail"], problem
    assert server.alive, server.log()
    assert api.depth(queue) == 0  # nothing of it was published
    # the schema is no fault: a list of ordinary length goes through, and reads back
    out = api.published(queue, container(LIST, linked(50)))
    assert out["count"] == 1
    r = api.get(f"/v1/{queue}/records", headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    [got] = r.json()["records"]
    assert got["value"] == value(50)


def single_object_header(schema: Any) -> bytes:
    """``C3 01`` and the schema's CRC-64 fingerprint: the body names its schema by it (the id,
    a digest that keeps logical types, travels in the ``avro-schema-id`` header)."""
    canonical = to_parsing_canonical_form(parse_schema(schema, named_schemas={}))
    return b"\xc3\x01" + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def _poison_and_next(server: PolymqProcess, api: Avro, queue: str) -> str:
    """Register the list's schema, publish the poison message and a good one behind it
    (persistent, through the JSON over HTTP frontend); the schema id."""
    r = api.register(unique("deep-subject"), json.dumps(LIST))
    assert r.status_code == 200, r.text
    sid: str = r.json()["id"]
    schema = json.loads(api.get(f"/v1/schemas/ids/{sid}").json()["schema"])
    assert schema["name"] == "L"
    header = single_object_header(LIST)
    messages = [
        {
            "body": base64.b64encode(header + datum).decode(),
            "encoding": "base64",
            "content_type": "avro/binary",
            "headers": {"avro-schema-id": sid},
            "persistent": True,
        }
        for datum in (linked(DEPTH), linked(3))
    ]
    r = requests.post(
        f"{server.url('http')}/v1/{queue}/messages", json={"messages": messages}, timeout=TIMEOUT
    )
    assert r.status_code == 200, r.text
    return sid


def test_a_poison_message_is_pulled_with_a_decode_error(server: PolymqProcess, api: Avro) -> None:
    queue = f"queue/{unique('poison')}"
    _poison_and_next(server, api, queue)
    r = requests.post(f"{server.url('http')}/v1/{queue}/pull?max=10&wait=5", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    poison, good = r.json()["messages"]
    assert poison["value"] is None
    assert "more than 128 deep" in poison["value_error"]
    assert base64.b64decode(poison["body"])[10:] == linked(DEPTH)  # the bytes, as stored
    assert good["value"] == value(3) and "value_error" not in good
    assert server.alive, server.log()


def test_a_poison_message_is_polled_and_read_with_a_decode_error(
    server: PolymqProcess, api: Avro
) -> None:
    """The long-polling frontend's poll and the Avro frontend's JSON read show it too."""
    queue = f"queue/{unique('poison')}"
    _poison_and_next(server, api, queue)
    lp = Longpoll(server.url("longpoll"))
    sub = lp.open(queue, ack="client", prefetch=10)
    got: list[dict[str, Any]] = []
    while len(got) < 2:
        answer = lp.poll(sub["id"], max=10, wait=5)
        assert answer["messages"], f"only {len(got)} of 2 messages came"
        got += answer["messages"]
    poison, good = got
    assert poison["value"] is None and "more than 128 deep" in poison["value_error"]
    assert good["value"] == value(3)
    lp.settle("nack", *(m["receipt"] for m in got))  # back to the queue, for the Avro read
    r = api.get(f"/v1/{queue}/records?max=10&wait=5", headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    poison, good = r.json()["records"]
    assert poison["value"] is None and "more than 128 deep" in poison["error"]
    assert base64.b64decode(poison["body"])[10:] == linked(DEPTH)
    assert good["value"] == value(3)
    assert server.alive, server.log()


def test_a_poison_message_never_goes_into_a_container(server: PolymqProcess, api: Avro) -> None:
    """A container read stops before it (a reader's decoder would fail on it in turn), and
    refuses it first in line with a 406 that says to read it as JSON; read so, it is
    delivered with its error, and the container read goes on behind it."""
    queue = f"queue/{unique('poison')}"
    sid = _poison_and_next(server, api, queue)
    r = api.get(f"/v1/{queue}/records")
    problem = assert_problem(r, 406, "not-acceptable")
    assert "nested too deeply" in problem["detail"] and "application/json" in problem["detail"]
    assert api.depth(queue) == 2  # given back at once
    r = api.get(f"/v1/{queue}/records?max=1", headers={"Accept": "application/json"})
    [poison] = r.json()["records"]
    assert "more than 128 deep" in poison["error"]
    api.ack([poison["receipt"]])
    r = api.get(f"/v1/{queue}/records")
    assert r.status_code == 200, r.text
    assert r.headers["X-Polymq-Schema-Id"] == sid
    records, _ = read_container(r.content)
    assert records == [value(3)]
    # and on a stream: the read stops before it, and then refuses it, naming the offset after
    stream = f"stream/{unique('poison')}"
    requests.put(f"{server.url('http')}/v1/{stream}", json={}, timeout=TIMEOUT)
    _poison_and_next(server, api, stream)
    r = api.get(f"/v1/{stream}/records?offset=first")
    problem = assert_problem(r, 406, "not-acceptable")
    assert "offset=" in problem["detail"]
    assert server.alive, server.log()


def test_a_record_that_always_contains_itself_is_not_registered(api: Avro) -> None:
    endless = {"type": "record", "name": "X", "fields": [{"name": "x", "type": "X"}]}
    problem = assert_problem(api.register(unique("endless"), json.dumps(endless)), 422)
    assert "contains itself" in problem["detail"]


def test_a_poison_message_reaches_a_stomp_subscriber(server: PolymqProcess, api: Avro) -> None:
    queue = unique("poison")
    _poison_and_next(server, api, f"queue/{queue}")
    with clients(server, "tcp") as make:
        consumer = make(ctor={"auto_decode": False})
        consumer.subscribe(f"/queue/{queue}", ack="client-individual", accept="application/json")
        poison, good = consumer.listener.wait_messages(2, timeout=WAIT)[:2]
        assert poison.headers["content-type"] == "avro/binary"
        assert "more than 128 deep" in poison.headers["x-avro-error"]
        assert poison.body == single_object_header(LIST) + linked(DEPTH)
        assert good.headers["content-type"] == "application/json"
        assert json.loads(good.body) == value(3)
        for frame in (poison, good):
            consumer.conn.ack(frame.headers["ack"])
    assert server.alive, server.log()


@pytest.mark.parametrize(
    ("port", "method", "path"),
    [
        ("http", "POST", "/v1/queue/deep-json/messages"),
        ("longpoll", "POST", "/v1/queue/deep-json/messages"),
        ("avro", "POST", "/v1/schemas/subjects/deep-json/versions"),
        ("admin", "POST", "/api/destinations/queue/deep-json/messages"),
        ("admin", "POST", "/api/config/reload"),
    ],
)
def test_deep_json_anywhere_is_a_400(
    server: PolymqProcess, port: str, method: str, path: str
) -> None:
    """JSON nested 100,000 deep (200 KB) is a 400 problem, not a 500 (or worse)."""
    body = "[" * 100_000 + "]" * 100_000
    r = requests.request(
        method,
        server.url(port) + path,
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 400, r.text[:300]
    assert "json" in r.headers["Content-Type"]
    assert server.alive, server.log()
