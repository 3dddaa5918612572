"""Queries, headers and JSON of the Avro API (``polymq_avro.payloads``), with aiohttp's
mocked requests (no sockets)."""

from __future__ import annotations

import base64
import datetime
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from polymq import Message
from polymq_avro.payloads import (
    check_content_type,
    idempotency_key,
    negotiate,
    parse_offset,
    parse_publish_query,
    parse_read_query,
    record_json,
)
from polymq_server.messages.avro import CONTENT_TYPE, encode_single, parse
from polymq_server.web.problems import Problem

SCHEMA = parse({"type": "record", "name": "R", "fields": [{"name": "b", "type": "bytes"}]})


def request(path: str = "/", **headers: str) -> web.Request:
    return make_mocked_request("POST", path, headers=headers)


@pytest.mark.parametrize(
    ("accept", "media"),
    [
        (None, "avro/binary"),
        ("*/*", "avro/binary"),
        ("application/json", "application/json"),
        ("application/avro", "application/avro"),
        ("application/json;q=0.5, application/avro", "application/avro"),
        ("application/json, */*;q=0.1", "application/json"),
        ("text/html, application/*", "application/avro"),
        ("avro/binary;q=0.2, application/json;q=0.9", "application/json"),
        ("application/json, avro/binary", "application/json"),  # equal q: the client's order
    ],
)
def test_negotiate(accept: str | None, media: str) -> None:
    assert negotiate(accept) == media


@pytest.mark.parametrize("accept", ["text/html", "application/xml, image/*", "*/*;q=0"])
def test_negotiate_refuses(accept: str) -> None:
    with pytest.raises(Problem) as info:
        negotiate(accept)
    assert info.value.status == 406


@pytest.mark.parametrize(
    ("raw", "offset"),
    [
        (None, "first"),
        ("last", "last"),
        ("next", "next"),
        ("42", 42),
        ("@1700000000", "@1700000000.0"),
        ("1700000000.5", "@1700000000.5"),
        ("2023-11-14T22:13:20Z", "@1700000000.0"),
        ("2023-11-14T22:13:20", "@1700000000.0"),  # no zone: UTC
    ],
)
def test_parse_offset(raw: str | None, offset: str | int) -> None:
    assert parse_offset(raw) == offset


@pytest.mark.parametrize("raw", ["", "-1", "1e9", "@nan", "@-5", "2023-13-45T00:00:00", "soon"])
def test_parse_offset_refuses(raw: str) -> None:
    with pytest.raises(Problem) as info:
        parse_offset(raw)
    assert info.value.status == 400


def test_publish_query() -> None:
    o = parse_publish_query(request("/?persistent=true&priority=9&ttl=1.5&subject=s"))
    assert (o.persistent, o.priority, o.ttl, o.subject) == (True, 9, 1.5, "s")
    o = parse_publish_query(request("/"))
    assert (o.persistent, o.priority, o.ttl, o.subject) == (False, None, None, None)
    for bad in ("priority=10", "priority=x", "ttl=0", "ttl=nan", "persistent=maybe", "what=1",
                "subject=", "ttl=1&ttl=2"):  # fmt: skip
        with pytest.raises(Problem):
            parse_publish_query(request(f"/?{bad}"))


def test_read_query() -> None:
    assert parse_read_query(make_mocked_request("GET", "/"), 1000, 30) == (100, 0.0)
    assert parse_read_query(make_mocked_request("GET", "/?max=7&wait=2.5"), 1000, 30) == (7, 2.5)
    for bad in ("max=0", "max=1001", "wait=31", "wait=-1", "max=x"):
        with pytest.raises(Problem):
            parse_read_query(make_mocked_request("GET", f"/?{bad}"), 1000, 30)


def test_content_types() -> None:
    for ok in ("avro/binary", "application/avro", "application/vnd.apache.avro+binary",
               "application/octet-stream", "Application/Avro; foo=bar"):  # fmt: skip
        check_content_type(request(**{"Content-Type": ok}))
    check_content_type(request())
    with pytest.raises(Problem) as info:
        check_content_type(request(**{"Content-Type": "application/json"}))
    assert info.value.status == 415


def test_idempotency_key() -> None:
    assert idempotency_key(request()) is None
    assert idempotency_key(request(**{"Idempotency-Key": "abc-1"})) == "abc-1"
    assert idempotency_key(request(**{"X-Batch-Id": "b7"})) == "b7"
    assert idempotency_key(request(**{"Idempotency-Key": '"quoted"'})) == "quoted"
    for bad in ({"Idempotency-Key": "x" * 201}, {"Idempotency-Key": "two words"},
                {"Idempotency-Key": "a", "X-Batch-Id": "b"}):  # fmt: skip
        with pytest.raises(Problem):
            idempotency_key(request(**bad))


def test_record_json_of_an_avro_message() -> None:
    body = encode_single(SCHEMA, {"b": b"\x00\x01"})
    m = Message(body, content_type=CONTENT_TYPE, headers={"avro-schema-id": SCHEMA.id})
    m.seq, m.id, m.delivery_count = 5, "m5", 2
    out = record_json(m, SCHEMA, "queue/q|5|1")
    assert out["value"] == {"b": "AAE="} and out["schema_id"] == SCHEMA.id
    assert out["seq"] == 5 and out["id"] == "m5" and out["receipt"] == "queue/q|5|1"
    assert out["redelivered"] is True and "body" not in out
    json.dumps(out, allow_nan=False)


def test_record_json_of_other_messages() -> None:
    text = record_json(Message(b"hello", content_type="text/plain"), None, None)
    assert text["value"] is None and text["schema_id"] is None and "receipt" not in text
    assert base64.b64decode(text["body"]) == b"hello" and "error" not in text
    body = encode_single(SCHEMA, {"b": b""})
    unknown = record_json(Message(body, content_type=CONTENT_TYPE), None, None)
    assert (
        unknown["value"] is None and unknown["schema_id"] == SCHEMA.rabin
    )  # no id: its fingerprint
    assert "not registered" in unknown["error"]
    broken = record_json(Message(body + b"\0", content_type=CONTENT_TYPE), SCHEMA, None)
    assert broken["value"] is None and "after the record" in broken["error"]


def test_record_json_falls_back_to_plain_values() -> None:
    """A date no Python date holds is shown as its plain Avro int."""
    schema = parse(
        {
            "type": "record",
            "name": "D",
            "fields": [{"name": "d", "type": {"type": "int", "logicalType": "date"}}],
        }
    )
    body = schema.header + b"\xfe\xff\xff\xff\x0f"  # 2**31 - 1 days
    out = record_json(Message(body, content_type=CONTENT_TYPE), schema, None)
    assert out["value"] == {"d": 2**31 - 1}
    good = encode_single(schema, {"d": datetime.date(2024, 1, 2)})
    assert record_json(Message(good, content_type=CONTENT_TYPE), schema, None)["value"] == {
        "d": "2024-01-02"
    }
