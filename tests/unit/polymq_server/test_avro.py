"""``polymq_server.messages.avro`` (the shared module every frontend uses to show Avro messages):
schema ids,
the single-object encoding, the schema cache and records as JSON. No sockets."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import hashlib
import io
import json
import math
import uuid
from typing import Any

import avro.schema
import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymq import Message
from polymq.errors import NotFound, RequestError
from polymq_server.messages.avro import (
    CONTENT_TYPE,
    MAGIC,
    SCHEMA_ID_HEADER,
    AvroError,
    DecodeError,
    InvalidSchema,
    SchemaCache,
    UnknownSchema,
    decode_single,
    encode_single,
    is_avro,
    is_schema_id,
    message_schema_id,
    parse,
    read_header,
    schema_id,
    single_object_header,
    to_json_value,
)

RICH = {
    "type": "record",
    "name": "Rich",
    "namespace": "test.polymq",
    "fields": [
        {"name": "n", "type": "long"},
        {"name": "i", "type": "int"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "d", "type": "double"},
        {"name": "ok", "type": "boolean"},
        {"name": "maybe", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "int"}},
        {"name": "attrs", "type": {"type": "map", "values": "string"}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    ],
}

LOGICAL = {
    "type": "record",
    "name": "Logical",
    "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
    ],
}

rich_records = st.fixed_dictionaries(
    {
        "n": st.integers(-(2**63), 2**63 - 1),
        "i": st.integers(-(2**31), 2**31 - 1),
        "s": st.text(),
        "b": st.binary(),
        "d": st.floats(allow_nan=False),
        "ok": st.booleans(),
        "maybe": st.none() | st.text(max_size=10),
        "tags": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
        "attrs": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
        "color": st.sampled_from(["RED", "GREEN"]),
        "digest": st.binary(min_size=4, max_size=4),
    }
)


# ---- schema ids ------------------------------------------------------------------------------
def test_the_fingerprint_is_the_little_endian_rabin_fingerprint() -> None:
    """The Avro spec's test vector: CRC-64-AVRO of "int" is 8247732601305521295
    (0x7275d51a3f395c8f); the fingerprint is its 8 bytes little-endian, as the single-object
    header carries them (Java's SchemaNormalization.parsingFingerprint64 and its encoder)."""
    fp = parse('"int"').rabin
    assert fp == "8f5c393f1ad57572"
    assert int.from_bytes(bytes.fromhex(fp), "little") == 8247732601305521295
    assert single_object_header(fp) == b"\xc3\x01" + (8247732601305521295).to_bytes(8, "little")
    assert parse("int").rabin == parse({"type": "int"}).rabin == fp  # spellings of one schema


def test_the_id_is_the_sha256_of_the_canonical_form_with_logical_types() -> None:
    """The id tells apart what the fingerprint does not (a decimal's scale, a logical type)
    and, as the fingerprint, not two spellings of one schema, docs, aliases or defaults; it
    is the canonical form's digest where there is no logical type."""
    d = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
    two = {"type": "record", "name": "P", "fields": [{"name": "d", "type": d}]}
    six = {"type": "record", "name": "P", "fields": [{"name": "d", "type": {**d, "scale": 6}}]}
    assert parse(two).rabin == parse(six).rabin and schema_id(two) != schema_id(six)
    bare = {"type": "record", "name": "P", "fields": [{"name": "d", "type": "bytes"}]}
    assert parse(bare).rabin == parse(two).rabin and schema_id(bare) != schema_id(two)
    canonical = parse(bare).canonical
    assert schema_id(bare) == hashlib.sha256(canonical.encode()).hexdigest()
    kept = '{"name":"P","type":"record","fields":[{"name":"d","type":{"type":"bytes",'
    kept += '"logicalType":"decimal","precision":12,"scale":2}}]}'
    assert schema_id(two) == hashlib.sha256(kept.encode()).hexdigest()
    shuffled = {
        "fields": [{"type": dict(reversed(d.items())), "name": "d", "doc": "x"}],
        "name": "P",
        "type": "record",
        "aliases": ["Q"],
    }
    assert schema_id(shuffled) == schema_id(two) and is_schema_id(schema_id(two))


@pytest.mark.parametrize(
    "schema",
    [
        RICH,
        {"type": "array", "items": "string"},
        ["null", "long", "string"],
        {"type": "enum", "name": "E", "namespace": "a.b", "symbols": ["X", "Y"]},
        {"type": "fixed", "name": "F", "size": 16},
        {
            "type": "record",
            "name": "Node",
            "fields": [
                {"name": "value", "type": "int"},
                {"name": "next", "type": ["null", "Node"], "default": None},
            ],
        },
    ],
)
def test_the_fingerprint_agrees_with_apache_avro(schema: Any) -> None:
    text = json.dumps(schema)
    assert parse(text).rabin == avro.schema.parse(text).fingerprint("CRC-64-AVRO").hex()


def test_docs_aliases_and_logical_types_are_not_part_of_the_fingerprint() -> None:
    """The fingerprint is over the Parsing Canonical Form (Java's too: apache avro's Python
    canonical form keeps a logical type's {"type": ...} wrapper, which the spec drops); the
    id keeps the logical type (not docs, aliases or defaults)."""
    plain = {"type": "record", "name": "R", "fields": [{"name": "t", "type": "long"}]}
    fancy = {
        "type": "record",
        "name": "R",
        "doc": "documented",
        "aliases": ["Old"],
        "fields": [
            {"name": "t", "doc": "x", "type": {"type": "long", "logicalType": "timestamp-millis"}}
        ],
    }
    assert parse(plain).rabin == parse(fancy).rabin
    assert schema_id(plain) != schema_id(fancy)  # the logical type
    assert schema_id({**fancy, "doc": "other"}) == schema_id(fancy)
    assert parse(fancy).json != parse(plain).json  # the full JSON is kept as given


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        '{"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]}',
        '{"type": "record", "name": "R", "fields": [{"name": "x", "type": "int", "default": "s"}]}',
        '{"type": "enum", "name": "E"}',
        "Unknown.Name",
        b"\xff\xfe",
        42,
    ],
)
def test_invalid_schemas_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidSchema) as info:
        parse(bad)
    assert info.value.status == 422 and info.value.code == "invalid-schema"
    assert isinstance(info.value, RequestError)  # answered as problem details by frontends


def test_is_schema_id() -> None:
    assert is_schema_id("0123456789abcdef" * 4)
    assert is_schema_id("0123456789abcdef")  # the fingerprint an old schema is stored under
    for bad in (
        "0123456789ABCDEF",
        "0123456789abcde",
        "0123456789abcdef0",
        "g" * 16,
        "",
        "0123456789abcdef" * 3,
        "0123456789abcdef" * 4 + "0",
    ):
        assert not is_schema_id(bad)


# ---- single-object encoding ---------------------------------------------------------------------
@settings(max_examples=200)
@given(rich_records)
def test_single_object_round_trip(record: dict[str, Any]) -> None:
    schema = parse(RICH)
    data = encode_single(schema, record)
    assert data[:2] == MAGIC and data[2:10] == schema.fingerprint
    assert read_header(data) == schema.rabin
    assert decode_single(data, schema) == record
    assert decode_single(data, lambda fp: {schema.rabin: schema}[fp]) == record
    # the body after the header is exactly fastavro's schemaless encoding
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema.parsed, record)
    assert data[10:] == out.getvalue()


@given(rich_records, st.integers(min_value=0))
def test_every_truncation_of_a_record_is_refused(record: dict[str, Any], cut: int) -> None:
    schema = parse(RICH)
    data = encode_single(schema, record)
    short = data[: cut % len(data)]
    with pytest.raises(DecodeError):
        decode_single(short, schema)


def test_decode_refuses_another_schema_trailing_bytes_and_no_header() -> None:
    schema = parse(RICH)
    other = parse('"long"')
    data = encode_single(other, 5)
    with pytest.raises(DecodeError, match="of schema"):
        decode_single(data, schema)
    with pytest.raises(DecodeError, match="after the record"):
        decode_single(data + b"\0", other)
    with pytest.raises(DecodeError, match="no single-object header"):
        decode_single(b"Obj\x01" + data, other)
    with pytest.raises(DecodeError, match="truncated"):
        decode_single(data[:5], other)
    with pytest.raises(UnknownSchema):
        decode_single(data, lambda sid: (_ for _ in ()).throw(UnknownSchema(sid)))


def test_encode_refuses_a_value_that_does_not_match() -> None:
    with pytest.raises(DecodeError):
        encode_single(parse(RICH), {"n": "not a number"})
    with pytest.raises(DecodeError):
        encode_single(parse('"int"'), 2**40)


def test_logical_types_decode_to_python_values_or_plain_avro() -> None:
    schema = parse(LOGICAL)
    value = {
        "at": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC),
        "day": datetime.date(2024, 5, 1),
        "t": datetime.time(1, 2, 3, 4),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "price": decimal.Decimal("12.34"),
    }
    data = encode_single(schema, value)
    decoded = decode_single(data, schema)
    assert decoded["at"] == value["at"] and decoded["price"] == value["price"]
    plain = decode_single(data, schema, logical=False)
    assert plain["at"] == 1714564800000 and plain["day"] == 19844


def test_is_avro() -> None:
    data = encode_single(parse('"long"'), 1)
    assert is_avro(Message(data, content_type=CONTENT_TYPE, headers={SCHEMA_ID_HEADER: "x"}))
    assert is_avro(Message(data, content_type="application/avro; charset=binary"))
    assert not is_avro(Message(data, content_type="application/octet-stream"))
    assert not is_avro(Message(b"hello", content_type=CONTENT_TYPE))
    assert not is_avro(Message(data[:9], content_type=CONTENT_TYPE))


# ---- the schema cache --------------------------------------------------------------------------
class Store:
    """A fake key/value store: what the core's kv_get would answer."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values
        self.calls: list[str] = []

    async def fetch(self, key: str) -> bytes:
        self.calls.append(key)
        await asyncio.sleep(0)
        try:
            return self.values[key]
        except KeyError:
            raise NotFound(f"no value under {key!r}") from None


async def test_cache_loads_once_and_shares_concurrent_loads() -> None:
    s = parse(RICH)
    store = Store({f"avro/schemas/{s.id}": s.json.encode()})
    cache = SchemaCache(store.fetch)
    assert cache.cached(s.id) is None
    got = await asyncio.gather(*(cache.get(s.id) for _ in range(10)))
    assert all(g is got[0] for g in got) and got[0].id == s.id
    assert store.calls == [f"avro/schemas/{s.id}"]
    assert cache.cached(s.id) is got[0]
    assert await cache.get(s.id) is got[0]
    assert store.calls == [f"avro/schemas/{s.id}"]


async def test_cache_unknown_ids_are_not_remembered() -> None:
    s = parse('"string"')
    store = Store({})
    cache = SchemaCache(store.fetch)
    with pytest.raises(UnknownSchema) as info:
        await cache.get(s.id)
    assert info.value.status == 404 and isinstance(info.value, AvroError)
    store.values[f"avro/schemas/{s.id}"] = s.json.encode()  # registered later
    assert (await cache.get(s.id)).id == s.id
    with pytest.raises(UnknownSchema):
        await cache.get("not-an-id")
    assert len(store.calls) == 2  # an id that cannot be one is not even asked for


async def test_cache_refuses_a_schema_stored_under_another_id() -> None:
    s, other = parse('"string"'), parse('"long"')
    cache = SchemaCache(Store({f"avro/schemas/{s.id}": other.json.encode()}).fetch)
    with pytest.raises(InvalidSchema):
        await cache.get(s.id)


async def test_cache_reads_a_schema_stored_under_its_fingerprint_before_ids_were_digests() -> None:
    """``avro/schemas/<fingerprint>``: what the registry wrote when ids were fingerprints,
    read for the messages of then (their header names no digest); a schema whose fingerprint
    is another is refused there too."""
    s, other = parse(RICH), parse('"long"')
    stored = {
        f"avro/schemas/{s.rabin}": s.json.encode(),
        f"avro/schemas/{other.rabin[::-1]}": other.json.encode(),
    }
    cache = SchemaCache(Store(stored).fetch)
    got = await cache.get(s.rabin)
    assert got.id == s.id and cache.cached(s.rabin) is got
    with pytest.raises(InvalidSchema):
        await cache.get(other.rabin[::-1])


def test_a_message_names_its_schema_by_the_id_in_its_header_else_by_its_fingerprint() -> None:
    s = parse(RICH)
    body = s.header + b"\x00"  # (the record itself is not read here)
    named = Message(body, content_type=CONTENT_TYPE, headers={SCHEMA_ID_HEADER: s.id})
    assert message_schema_id(named) == s.id
    for headers in ({}, {SCHEMA_ID_HEADER: s.rabin}, {SCHEMA_ID_HEADER: "junk"}):
        old = Message(body, content_type=CONTENT_TYPE, headers=headers)
        assert message_schema_id(old) == s.rabin
    assert message_schema_id(Message(body, content_type="text/plain", headers={})) is None


async def test_cache_is_lru() -> None:
    schemas = [parse(json.dumps({"type": "fixed", "name": f"F{i}", "size": i})) for i in range(5)]
    store = Store({f"avro/schemas/{s.id}": s.json.encode() for s in schemas})
    cache = SchemaCache(store.fetch, maxsize=3)
    for s in schemas[:3]:
        await cache.get(s.id)
    cache.cached(schemas[0].id)  # used: the least recently used is now schemas[1]
    await cache.get(schemas[3].id)
    assert schemas[0].id in cache and schemas[1].id not in cache and len(cache) == 3
    cache.put(schemas[4])
    assert schemas[4].id in cache and schemas[2].id not in cache


# ---- records as JSON ----------------------------------------------------------------------------
def test_to_json_value() -> None:
    value = {
        "b": b"\x00\xff",
        "dec": decimal.Decimal("-1.50"),
        "at": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC),
        "day": datetime.date(2024, 5, 1),
        "t": datetime.time(1, 2, 3),
        "u": uuid.UUID(int=1),
        "nums": [math.nan, math.inf, -math.inf, 1.5],
        "nested": ({"x": None, "y": True},),
    }
    assert to_json_value(value) == {
        "b": "AP8=",
        "dec": "-1.50",
        "at": "2024-05-01T12:00:00+00:00",
        "day": "2024-05-01",
        "t": "01:02:03",
        "u": "00000000-0000-0000-0000-000000000001",
        "nums": ["NaN", "Infinity", "-Infinity", 1.5],
        "nested": [{"x": None, "y": True}],
    }
    with pytest.raises(TypeError):
        to_json_value(object())


@given(rich_records)
def test_decoded_records_are_always_json(record: dict[str, Any]) -> None:
    schema = parse(RICH)
    value = to_json_value(decode_single(encode_single(schema, record), schema))
    assert json.loads(json.dumps(value, allow_nan=False)) == value
