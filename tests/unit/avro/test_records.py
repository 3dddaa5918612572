"""A POSTed body as records and messages (``polymq_avro.records``). No sockets."""

from __future__ import annotations

import decimal
import io
import time
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polymq_avro.container import TooLarge, Truncated
from polymq_avro.records import (
    BodyKind,
    NeedSchema,
    NotAvro,
    batch_digest,
    decode_container,
    messages,
    sniff,
    split_single,
)
from polymq_server.messages.avro import (
    CONTENT_TYPE,
    SCHEMA_ID_HEADER,
    AvroSchema,
    DecodeError,
    decode_single,
    encode_single,
    parse,
)

A = parse(
    {"type": "record", "name": "A", "fields": [{"name": "x", "type": "long"}]},
)
B = parse(
    {"type": "record", "name": "B", "fields": [{"name": "s", "type": "string"}]},
)
KNOWN = {A.rabin: A, B.rabin: B}  # what a lookup finds by fingerprint


def body_of(*items: tuple[AvroSchema, Any]) -> bytes:
    return b"".join(encode_single(s, v) for s, v in items)


def test_sniff() -> None:
    assert sniff(b"Obj\x01rest") is BodyKind.CONTAINER
    assert sniff(b"\xc3\x01rest") is BodyKind.SINGLE
    with pytest.raises(NotAvro):
        sniff(b"")
    with pytest.raises(NotAvro):
        sniff(b'{"json": true}')
    with pytest.raises(Truncated):
        sniff(b"Ob")


def test_single_objects_of_several_schemas() -> None:
    body = body_of((A, {"x": 1}), (B, {"s": "two"}), (A, {"x": 3}))
    records = split_single(body, KNOWN.get, max_records=10)
    assert records.kind is BodyKind.SINGLE and records.count == 3
    assert records.ids == [A.id, B.id, A.id] and list(records.schemas) == [A.id, B.id]
    assert b"".join(records.bodies) == body
    assert decode_single(records.bodies[1], B) == {"s": "two"}


def test_an_unknown_schema_is_asked_for() -> None:
    body = body_of((A, {"x": 1}), (B, {"s": "two"}))
    with pytest.raises(NeedSchema) as info:
        split_single(body, {A.rabin: A}.get, max_records=10)
    assert info.value.fingerprint == B.rabin


def test_records_take_the_id_of_the_schema_found_not_of_their_fingerprint() -> None:
    """Two schemas that differ only in a decimal's scale share a fingerprint (the body's
    header) and have different ids: each record is of the schema the lookup found, and its
    message names that schema's id."""
    field = {"type": "bytes", "logicalType": "decimal", "precision": 12}
    two, six = (
        parse(
            {
                "type": "record",
                "name": "P",
                "fields": [{"name": "d", "type": {**field, "scale": scale}}],
            }
        )
        for scale in (2, 6)
    )
    assert two.rabin == six.rabin and two.id != six.id
    body = encode_single(two, {"d": decimal.Decimal("123.45")})
    for schema in (two, six):
        records = split_single(body, {schema.rabin: schema}.get, max_records=1)
        assert records.ids == [schema.id] and list(records.schemas) == [schema.id]
        [m] = messages(records)
        assert m.headers == {SCHEMA_ID_HEADER: schema.id} and m.body == body


@given(st.integers(min_value=1))
def test_every_truncation_is_refused(cut: int) -> None:
    body = body_of((A, {"x": 12345678}), (B, {"s": "hello"}))
    short = body[: cut % len(body)]
    if not short:
        return
    if short in (body_of((A, {"x": 12345678})),):
        return  # cut right after a whole record: a valid, shorter body
    with pytest.raises((Truncated, DecodeError)):
        split_single(short, KNOWN.get, max_records=10)


def test_garbage_between_records_is_refused() -> None:
    body = body_of((A, {"x": 1})) + b"\x00\x00" + body_of((A, {"x": 2}))
    with pytest.raises(DecodeError, match="record 1"):
        split_single(body, KNOWN.get, max_records=10)


def test_a_record_that_does_not_match_its_schema() -> None:
    body = B.header + b"\x04\xff\xfe"  # a 2-byte string that is not UTF-8
    with pytest.raises(DecodeError, match="not valid for schema"):
        split_single(body, KNOWN.get, max_records=10)


def test_too_many_single_records() -> None:
    body = body_of(*[(A, {"x": i}) for i in range(6)])
    with pytest.raises(TooLarge):
        split_single(body, KNOWN.get, max_records=5)


def test_container_records_get_the_single_object_header() -> None:
    out = io.BytesIO()
    fastavro.writer(out, A.parsed, [{"x": i} for i in range(5)], codec="deflate")
    records = decode_container(out.getvalue(), max_records=10, max_decoded=10**6)
    assert records.kind is BodyKind.CONTAINER and records.ids == [A.id] * 5
    assert [decode_single(b, A) for b in records.bodies] == [{"x": i} for i in range(5)]


def test_messages() -> None:
    records = split_single(body_of((A, {"x": 1}), (B, {"s": "b"})), KNOWN.get, max_records=10)
    before = time.time()
    m1, m2 = messages(records, persistent=True, priority=7, ttl=60)
    assert m1.body == records.bodies[0] and m1.content_type == CONTENT_TYPE
    assert m1.headers == {SCHEMA_ID_HEADER: A.id} and m2.headers == {SCHEMA_ID_HEADER: B.id}
    assert m1.persistent and m1.priority == 7
    assert m1.expires is not None and before + 60 <= m1.expires <= time.time() + 60
    (m,) = messages(split_single(body_of((A, {"x": 1})), KNOWN.get, max_records=1))
    assert not m.persistent and m.priority == 4 and m.expires is None
    for msg in (m1, m2, m):
        msg.validate(1 << 20)


def test_batch_digest_depends_on_records_not_on_their_container() -> None:
    """A retry of the same records digests the same, whatever codec or sync marker the
    producer's new file has; other records or options digest differently."""
    data = [{"x": i} for i in range(50)]

    def posted(codec: str) -> bytes:
        out = io.BytesIO()
        fastavro.writer(out, A.parsed, data, codec=codec)
        return out.getvalue()

    first = decode_container(posted("deflate"), max_records=100, max_decoded=10**6)
    retry = decode_container(posted("snappy"), max_records=100, max_decoded=10**6)
    single = split_single(b"".join(first.bodies), KNOWN.get, max_records=100)
    d = batch_digest(first, False, None)
    assert d == batch_digest(retry, False, None) == batch_digest(single, False, None)
    assert len(d) == 32
    assert batch_digest(first, True, None) != d
    assert batch_digest(first, False, 5) != d
    other = split_single(body_of((A, {"x": 0})), KNOWN.get, max_records=1)
    assert batch_digest(other, False, None) != d
