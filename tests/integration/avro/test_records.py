"""Records in and out: a container of 10,000 records POSTed, each record read back over HTTP
as an Avro container and as JSON, from a queue and from a stream; every codec; single-object
records; a stream read from every kind of offset."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import time
from typing import Any

import fastavro
import pytest
import requests

from polymq_server.messages.avro import encode_single, parse, schema_id

from .conftest import USER, Avro, assert_problem, container, read_container, unique, users

N = 10_000
USER_ID = schema_id(USER)


def json_value(record: dict[str, Any]) -> dict[str, Any]:
    """What a record looks like in a JSON answer (bytes in base64)."""
    return {**record, "avatar": base64.b64encode(record["avatar"]).decode()}


def drain_queue_as_containers(api: Avro, queue: str) -> list[Any]:
    got: list[Any] = []
    while True:
        r = api.get(f"/v1/queue/{queue}/records", params={"max": 1000})
        if r.status_code == 204:
            return got
        assert r.status_code == 200, r.text[:300]
        assert r.headers["Content-Type"] == "avro/binary"
        assert r.headers["X-Polymq-Schema-Id"] == USER_ID
        records, meta = read_container(r.content)
        receipts = json.loads(meta["polymq.receipts"])
        assert len(receipts) == len(records) > 0
        if "X-Polymq-Receipts" in r.headers:
            assert json.loads(r.headers["X-Polymq-Receipts"]) == receipts
        assert json.loads(meta["avro.schema"])["name"].endswith("User")
        api.ack(receipts)
        got += records


def test_ten_thousand_records_through_a_queue_as_avro_and_as_json(api: Avro) -> None:
    records = users(N)
    body = container(records, codec="deflate", sync_interval=64 * 1024)
    first, second = unique("q"), unique("q")

    started = time.monotonic()
    out = api.published(f"queue/{first}", body)
    assert out["count"] == N and out["schema_id"] == USER_ID and out["duplicate"] is False
    assert len(out["ids"]) == len(set(out["ids"])) == N and out["seqs"] == list(range(1, N + 1))
    assert api.stats(f"queue/{first}")["messages"] == N
    got = drain_queue_as_containers(api, first)
    assert got == records  # every record, once, in order
    assert api.depth(f"queue/{first}") == 0

    api.published(f"queue/{second}", body)
    seen: list[Any] = []
    while True:
        r = api.get(
            f"/v1/queue/{second}/records",
            params={"max": 1000},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
        answer = r.json()
        if not answer["records"]:
            break
        for rec in answer["records"]:
            assert rec["schema_id"] == USER_ID and rec["headers"]["avro-schema-id"] == USER_ID
            assert rec["redelivered"] is False and rec["receipt"].startswith(f"queue/{second}|")
        seen += [rec["value"] for rec in answer["records"]]
        api.ack([rec["receipt"] for rec in answer["records"]])
    assert seen == [json_value(rec) for rec in records]
    assert time.monotonic() - started < 30


def test_ten_thousand_records_through_a_stream_as_avro_and_as_json(api: Avro) -> None:
    records = users(N)
    stream = unique("s")
    out = api.published(f"stream/{stream}", container(records, codec="snappy"))
    assert out["count"] == N and out["seqs"][0] == 1 and out["seqs"][-1] == N

    got: list[Any] = []
    offset = "first"
    while True:
        r = api.get(f"/v1/stream/{stream}/records", params={"offset": offset, "max": 1000})
        if r.status_code == 204:
            assert r.headers["X-Polymq-Next-Offset"] == str(N + 1)
            break
        assert r.status_code == 200, r.text[:300]
        part, meta = read_container(r.content)
        assert meta["polymq.next"] == r.headers["X-Polymq-Next-Offset"]
        got += part
        offset = meta["polymq.next"]
    assert got == records

    seen: list[Any] = []
    offset = "first"
    while True:
        r = api.get(
            f"/v1/stream/{stream}/records",
            params={"offset": offset, "max": 1000},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 200, r.text[:300]
        answer = r.json()
        if not answer["records"]:
            assert answer["next"] == str(N + 1)
            break
        assert [rec["seq"] for rec in answer["records"]] == list(
            range(int(offset) if offset != "first" else 1, answer["records"][-1]["seq"] + 1)
        )
        assert all("receipt" not in rec for rec in answer["records"])
        seen += [rec["value"] for rec in answer["records"]]
        offset = answer["next"]
    assert seen == [json_value(rec) for rec in records]
    assert api.stats(f"stream/{stream}")["messages"] == N  # reading a stream takes nothing


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy"])
def test_codecs(api: Avro, codec: str) -> None:
    records = users(300)
    queue = unique(codec)
    body = container(records, codec=codec, sync_interval=2000)
    assert api.published(f"queue/{queue}", body)["count"] == 300
    assert drain_queue_as_containers(api, queue) == records


@pytest.mark.parametrize(
    "content_type",
    ["avro/binary", "application/vnd.apache.avro+binary", "application/octet-stream", None],
)
def test_single_object_records(api: Avro, content_type: str | None) -> None:
    """Records in the single-object encoding, laid end to end, of registered schemas."""
    schema = parse(USER)
    assert api.register(unique("subj"), USER).status_code == 200
    records = users(25)
    body = b"".join(encode_single(schema, rec) for rec in records)
    queue = unique("so")
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = api.post(f"/v1/queue/{queue}/records", data=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 25 and r.json()["schema_id"] == schema.id
    assert drain_queue_as_containers(api, queue) == records


def test_a_topic_takes_records_for_its_subscribers(api: Avro) -> None:
    out = api.published(f"topic/{unique('t')}", container(users(5)))
    assert out == {
        "count": 5,
        "schema_id": USER_ID,
        "schema_ids": [USER_ID],
        "subscribers": 0,
        "duplicate": False,
    }


def test_message_options_and_an_empty_container(api: Avro) -> None:
    queue = unique("opt")
    out = api.published(
        f"queue/{queue}", container(users(3)), persistent="true", priority="9", ttl="600"
    )
    assert out["count"] == 3
    assert api.stats(f"queue/{queue}")["messages"] == 3
    empty = api.published(f"queue/{queue}", container([]))
    assert empty["count"] == 0 and empty["ids"] == [] and empty["schema_id"] == USER_ID
    assert api.stats(f"queue/{queue}")["messages"] == 3


def test_a_queue_answer_holds_one_schema_and_gives_the_rest_back(api: Avro) -> None:
    """Records of two schemas: a container answer takes the run of the first schema, the
    others are back in the queue at once for the next read."""
    other = {"type": "record", "name": "Other", "fields": [{"name": "n", "type": "int"}]}
    queue = unique("mix")
    api.published(f"queue/{queue}", container(users(3)))
    api.published(f"queue/{queue}", container([{"n": 1}, {"n": 2}], schema=other))
    api.published(f"queue/{queue}", container(users(1, start=3)))
    r = api.get(f"/v1/queue/{queue}/records", params={"max": 10})
    first, meta = read_container(r.content)
    assert first == users(3) and len(json.loads(meta["polymq.receipts"])) == 3
    r = api.get(f"/v1/queue/{queue}/records", params={"max": 10})
    assert read_container(r.content)[0] == [{"n": 1}, {"n": 2}]
    r = api.get(f"/v1/queue/{queue}/records", params={"max": 10})
    assert read_container(r.content)[0] == users(1, start=3)


def test_a_message_that_is_not_avro(api: Avro) -> None:
    """Published as plain JSON over HTTP: shown as base64 in JSON; a container read refuses
    it (406) and leaves it in the queue."""
    assert api.http is not None
    queue = unique("plain")
    r = requests.post(f"{api.http}/v1/queue/{queue}/messages", json={"body": "hello"}, timeout=10)
    assert r.status_code == 200
    r = api.get(f"/v1/queue/{queue}/records")
    assert_problem(r, 406, "not-acceptable")
    assert api.stats(f"queue/{queue}")["messages"] == 1  # given back at once
    r = api.get(f"/v1/queue/{queue}/records", headers={"Accept": "application/json"})
    (rec,) = r.json()["records"]
    assert rec["value"] is None and rec["schema_id"] is None
    assert base64.b64decode(rec["body"]) == b"hello"
    r = api.post("/v1/nack", json={"receipts": [rec["receipt"]], "requeue": False})
    assert r.status_code == 200 and r.json()["settled"] == 1
    assert api.depth(f"queue/{queue}") == 0


def test_stream_offsets(api: Avro) -> None:
    stream = unique("off")
    api.published(f"stream/{stream}", container(users(5)))
    time.sleep(0.05)
    middle = time.time()
    time.sleep(0.05)
    api.published(f"stream/{stream}", container(users(5, start=5)))

    def ids(offset: str, **params: Any) -> list[int]:
        r = api.get(f"/v1/stream/{stream}/records", params={"offset": offset, "max": 100, **params})
        if r.status_code == 204:
            return []
        return [rec["id"] for rec in read_container(r.content)[0]]

    assert ids("first") == list(range(10))
    assert ids("3") == list(range(2, 10))
    assert ids("last") == [9]
    assert ids("next") == []
    assert ids(f"{middle:.6f}") == list(range(5, 10))
    assert ids(f"@{middle}") == list(range(5, 10))
    assert_problem(api.get(f"/v1/stream/{stream}/records", params={"offset": "soon"}), 400)


def test_a_waiting_read_gets_what_is_published_meanwhile(api: Avro) -> None:
    queue = unique("wait")
    api.declare(f"queue/{queue}")
    started = time.monotonic()
    r = api.get(f"/v1/queue/{queue}/records", params={"wait": 0.5})
    assert r.status_code == 204 and time.monotonic() - started >= 0.4
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(
            api.fresh().get, f"/v1/queue/{queue}/records", params={"wait": 20, "max": 10}
        )
        time.sleep(0.3)
        assert not reading.done()
        started = time.monotonic()
        api.published(f"queue/{queue}", container(users(2)))
        r = reading.result(timeout=10)
    assert r.status_code == 200 and read_container(r.content)[0] == users(2)
    assert time.monotonic() - started < 5


def test_reading_with_an_accept_it_cannot_give(api: Avro) -> None:
    r = api.get(f"/v1/queue/{unique()}/records", headers={"Accept": "text/csv"})
    assert_problem(r, 406)


def test_fastavro_schemaless_reader_decodes_a_stored_body(api: Avro) -> None:
    """The body of each message is the single-object encoding: C3 01, the fingerprint, and
    the datum a schemaless reader decodes."""
    queue = unique("raw")
    api.published(f"queue/{queue}", container(users(1)))
    r = api.get(f"/v1/queue/{queue}/records", headers={"Accept": "application/json"})
    (rec,) = r.json()["records"]
    assert rec["value"] == json_value(users(1)[0])
    # the same record as the core holds it, through the HTTP frontend
    assert api.http is not None
    api.post("/v1/nack", json={"receipts": [rec["receipt"]]})
    raw = requests.post(f"{api.http}/v1/queue/{queue}/pull", timeout=10).json()["messages"][0]
    body = base64.b64decode(raw["body"])
    assert raw["content_type"] == "avro/binary" and raw["headers"] == {"avro-schema-id": USER_ID}
    assert body[:2] == b"\xc3\x01" and body[2:10] == parse(USER).fingerprint
    assert fastavro.schemaless_reader(io.BytesIO(body[10:]), USER, None) == users(1)[0]
