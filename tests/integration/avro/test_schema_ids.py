"""Schemas are named by the digest of their whole JSON, so one tenant's schema never decides
how another's records read. Against one ``polymq run --auth``: two tenants publish records of
schemas that differ only in a decimal's scale (``decimal(12,6)`` and ``decimal(12,2)``: one
Rabin fingerprint, the one Avro's single-object header carries), and each reads its own
values back through the Avro frontend (JSON and an object container read with fastavro) and
as JSON through the HTTP frontend's pull. Single-object records name their schema by id or
subject; a bare fingerprint that two schemas share is refused, not guessed. A schema stored
the old way (under its fingerprint) still reads."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterator
from decimal import Decimal as dec
from typing import Any

import fastavro
import pytest
import requests

from polymq import Client, Message
from polymq_server.auth.provider import hash_password
from polymq_server.messages.avro import KV_SCHEMAS, MAGIC, SCHEMA_ID_HEADER, parse

from ...procs import PolymqProcess, serving
from ..webapi import TIMEOUT
from .conftest import Avro, assert_problem, unique

pytestmark = pytest.mark.timeout(120)

PASSWORDS = {"six": "six-pw", "two": "two-pw", "admin": "admin-pw"}


def price(scale: int, namespace: str = "shop") -> dict[str, Any]:
    """The tenants' schema: the same in all but the scale of ``amount``."""
    amount = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": scale}
    return {
        "type": "record",
        "name": "Price",
        "namespace": namespace,
        "fields": [{"name": "sku", "type": "string"}, {"name": "amount", "type": amount}],
    }


SIX, TWO = price(6), price(2)


def auth(user: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def tenant(name: str) -> dict[str, Any]:
    return {
        "password_hash": hash_password(PASSWORDS[name]),
        "grants": [
            {"pattern": f"queue/{name}-*", "permissions": ["read", "write", "configure"]},
            {"pattern": f"kv/avro/subjects/{name}-*", "permissions": ["read", "write"]},
            {"pattern": "kv/avro/schemas/*", "permissions": ["read"]},
        ],
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir = tmp_path_factory.mktemp("avro-ids")
    users = {
        "six": tenant("six"),
        "two": tenant("two"),
        "admin": {
            "password_hash": hash_password(PASSWORDS["admin"]),
            "grants": [{"pattern": "*", "permissions": ["read", "write", "configure"]}],
        },
    }
    (workdir / "users.json").write_text(json.dumps({"users": users}))
    with serving("run", workdir, "--auth", f"file:{workdir / 'users.json'}") as proc:
        yield proc


def api_of(run: PolymqProcess, user: str) -> Avro:
    api = Avro(run)
    api.session.headers.update(auth(user))
    return api


def container_of(schema: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), records)
    return out.getvalue()


def single_object(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """Avro's single-object encoding, as a producer writes it with fastavro."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return MAGIC + parse(schema).fingerprint + out.getvalue()


def avro_json(api: Avro, queue: str) -> list[dict[str, Any]]:
    r = api.get(
        f"/v1/queue/{queue}/records", params={"max": 100}, headers={"Accept": "application/json"}
    )
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()["records"]
    api.ack([rec["receipt"] for rec in records])  # settled: the next read sees the rest
    return records


def http_pull(run: PolymqProcess, user: str, queue: str) -> list[dict[str, Any]]:
    r = requests.post(
        f"{run.url('http')}/v1/queue/{queue}/pull",
        params={"max": 100},
        headers=auth(user),
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def test_two_tenants_read_their_own_decimals(run: PolymqProcess) -> None:
    """decimal(12,6) first, then decimal(12,2): each reads back what it wrote (123.45 stays
    123.45, not 0.012345), through the Avro frontend and the HTTP frontend alike."""
    six, two = api_of(run, "six"), api_of(run, "two")
    q6, q2 = unique("six"), unique("two")
    assert parse(SIX).fingerprint == parse(TWO).fingerprint  # what the bodies carry
    out6 = six.published(f"queue/{q6}", container_of(SIX, [{"sku": "a", "amount": dec("1.5")}]))
    out2 = two.published(f"queue/{q2}", container_of(TWO, [{"sku": "b", "amount": dec("123.45")}]))
    # as JSON from the Avro frontend; the other copy as JSON from the HTTP frontend
    for api, queue, value, sid in (
        (six, q6, {"sku": "a", "amount": "1.500000"}, out6["schema_id"]),
        (two, q2, {"sku": "b", "amount": "123.45"}, out2["schema_id"]),
    ):
        [rec] = avro_json(api, queue)
        assert rec["value"] == value, rec
        assert rec["schema_id"] == sid and rec["headers"][SCHEMA_ID_HEADER] == sid
    assert out6["schema_id"] != out2["schema_id"]
    body = container_of(TWO, [{"sku": "c", "amount": dec("123.45")}])
    two.published(f"queue/{q2}", body)
    [pulled] = http_pull(run, "two", q2)
    assert pulled["value"] == {"sku": "c", "amount": "123.45"}, pulled
    # and as an object container, read with fastavro: the schema is the writer's own
    two.published(f"queue/{q2}", body)
    r = two.get(f"/v1/queue/{q2}/records", headers={"Accept": "application/avro"})
    assert r.status_code == 200, r.text
    reader = fastavro.reader(io.BytesIO(r.content))
    assert list(reader) == [{"sku": "c", "amount": dec("123.45")}]
    assert reader.writer_schema["fields"][1]["type"]["scale"] == 2  # type: ignore[index]
    assert r.headers["X-Polymq-Schema-Id"] == out2["schema_id"]


def test_single_object_records_name_their_schema(run: PolymqProcess) -> None:
    """The body's fingerprint is shared by both tenants' schemas: a POST names its schema
    with ?schema_id= (the id registering answered) or ?subject=; naming neither is a 409
    that says how, and nothing is published."""
    six, two = api_of(run, "six"), api_of(run, "two")
    ns = unique("ns").replace("-", "_")  # schemas no other test stored
    s6, s2 = price(6, ns), price(2, ns)
    sub6, sub2 = unique("six"), unique("two")
    r = six.register(sub6, s6)
    assert r.status_code == 200, r.text
    r = two.register(sub2, s2)
    assert r.status_code == 200, r.text
    id2 = r.json()["id"]
    assert id2 == parse(s2).id and len(id2) == 64
    got = two.get(f"/v1/schemas/ids/{id2}")
    assert got.status_code == 200 and json.loads(got.json()["schema"]) == s2
    queue = unique("two")
    body = single_object(s2, {"sku": "d", "amount": dec("123.45")})
    problem = assert_problem(two.publish(f"queue/{queue}", body), 409, "ambiguous-schema")
    assert "?schema_id=" in problem["detail"]
    out = two.published(f"queue/{queue}", body, schema_id=id2)
    assert out["schema_id"] == id2
    out = two.published(f"queue/{queue}", body, subject=sub2)
    assert out["schema_id"] == id2 and out["version"] == 1
    records = avro_json(two, queue)
    assert [rec["value"]["amount"] for rec in records] == ["123.45", "123.45"], records
    # a fingerprint that one stored schema alone has needs no name
    lone = price(2, unique("lone").replace("-", "_"))
    assert two.register(unique("two"), lone).status_code == 200
    lone_q = unique("two")
    two.published(f"queue/{lone_q}", single_object(lone, {"sku": "e", "amount": dec("0.07")}))
    [pulled] = http_pull(run, "two", lone_q)
    assert pulled["value"] == {"sku": "e", "amount": "0.07"}
    assert_problem(two.publish(f"queue/{queue}", body, schema_id="0123"), 400)


def test_a_schema_stored_under_its_fingerprint_still_reads(run: PolymqProcess) -> None:
    """What an earlier version stored: the schema under ``avro/schemas/<fingerprint>`` and
    messages whose ``avro-schema-id`` header is that fingerprint. They still read as JSON,
    and the schema by that id."""
    legacy = price(6, unique("old").replace("-", "_"))
    schema = parse(legacy)
    queue = unique("six")
    raw = io.BytesIO()
    fastavro.schemaless_writer(
        raw, fastavro.parse_schema(legacy), {"sku": "f", "amount": dec("2.000001")}
    )

    async def store_as_before() -> None:
        async with await Client.connect(
            "127.0.0.1", run.ports["core"], user="admin", password=PASSWORDS["admin"]
        ) as c:
            await c.kv_put(KV_SCHEMAS + schema.rabin, schema.json.encode())
            message = Message(
                MAGIC + schema.fingerprint + raw.getvalue(),
                content_type="avro/binary",
                headers={SCHEMA_ID_HEADER: schema.rabin},
            )
            await c.publish(f"queue/{queue}", [message])

    asyncio.run(store_as_before())
    [pulled] = http_pull(run, "six", queue)
    assert pulled["value"] == {"sku": "f", "amount": "2.000001"}, pulled
    got = api_of(run, "six").get(f"/v1/schemas/ids/{schema.rabin}")
    assert got.status_code == 200 and json.loads(got.json()["schema"]) == legacy
    assert got.json()["id"] == schema.id
