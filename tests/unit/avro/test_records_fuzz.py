"""Fuzzing what the Avro frontend decodes from a POSTed body (``polymq_avro.records`` and
``.container``, with its ``.scanner``): object container files and single-object records
of recursive schemas nested up to 30,000 deep (in every codec that shrinks them), random
bytes, and containers whose schema is nested thousands deep or always contains itself.

The answer is the records, or an ``AvroError`` (a 4xx problem), never anything else. On
code without the bounds these bodies reach fastavro's C reader (or, through the scanner's
fallback, its C reader after the scanner's RecursionError) and the process dies of SIGSEGV.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymq_avro.container import write_container
from polymq_avro.records import decode_container, split_single
from polymq_server.messages.avro import AvroError, AvroSchema, DecodeError, InvalidSchema, parse
from polymq_server.messages.avrobounds import MAX_DEPTH

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
LIMITS = {"max_records": 10_000, "max_decoded": 64 * 1024 * 1024}

LIST = {
    "type": "record",
    "name": "L",
    "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "L"]}],
}
SCHEMA = parse(LIST)
LAST_ALLOWED = MAX_DEPTH // 2 - 1  # two levels (a record, a union) a node
DEPTHS = st.sampled_from([0, LAST_ALLOWED, LAST_ALLOWED + 1, 20_000, 30_000]) | st.integers(
    0, 30_000
)


def linked(d: int) -> bytes:
    return b"\x02\x02" * d + b"\x02\x00"


def container(schema: Any, records: list[bytes], codec: str = "null") -> bytes:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return write_container(text, records, codec=codec)


@FUZZ
@given(st.lists(DEPTHS, min_size=1, max_size=3), st.sampled_from(["null", "deflate", "snappy"]))
def test_a_container_of_deep_records_is_taken_within_the_bound_and_refused_past_it(
    depths: list[int], codec: str
) -> None:
    body = container(LIST, [linked(d) for d in depths], codec)
    deepest = max(depths)
    if deepest <= LAST_ALLOWED:
        records = decode_container(body, **LIMITS)
        assert records.bodies == [SCHEMA.header + linked(d) for d in depths]
        return
    first = next(i for i, d in enumerate(depths) if d > LAST_ALLOWED)
    with pytest.raises(DecodeError, match=f"record {first} .*more than {MAX_DEPTH} deep") as info:
        decode_container(body, **LIMITS)
    assert info.value.status == 422


@FUZZ
@given(st.lists(DEPTHS, min_size=1, max_size=3))
def test_deep_single_object_records_are_taken_within_the_bound_and_refused_past_it(
    depths: list[int],
) -> None:
    body = b"".join(SCHEMA.header + linked(d) for d in depths)
    lookup: dict[str, AvroSchema] = {SCHEMA.rabin: SCHEMA}
    if max(depths) <= LAST_ALLOWED:
        assert split_single(body, lookup.get, max_records=100).count == len(depths)
        return
    with pytest.raises(DecodeError, match=f"more than {MAX_DEPTH} deep"):
        split_single(body, lookup.get, max_records=100)


@FUZZ
@given(st.binary(max_size=400), st.sampled_from(["null", "deflate"]))
def test_random_records_of_a_recursive_schema_are_taken_or_refused(data: bytes, codec: str) -> None:
    for attempt in (
        lambda: decode_container(container(LIST, [data], codec), **LIMITS),
        lambda: split_single(SCHEMA.header + data, {SCHEMA.rabin: SCHEMA}.get, max_records=100),
    ):
        try:
            attempt()
        except AvroError:
            pass


@FUZZ
@given(st.binary(max_size=600))
def test_random_bodies_are_taken_or_refused(data: bytes) -> None:
    head = container(LIST, [])
    for body in (data, head + data, head[:-1] + data):
        try:
            decode_container(body, **LIMITS)
        except AvroError:
            pass


@pytest.mark.parametrize(
    "schema",
    [
        '{"type":"array","items":' * 3000 + '"int"' + "}" * 3000,
        '{"type":"array","items":' * (MAX_DEPTH + 1) + '"int"' + "}" * (MAX_DEPTH + 1),
        {"type": "record", "name": "X", "fields": [{"name": "x", "type": "X"}]},
    ],
)
def test_a_container_whose_schema_is_too_deep_or_endless_is_refused(schema: Any) -> None:
    with pytest.raises(InvalidSchema) as info:
        decode_container(container(schema, [b"\x00"]), **LIMITS)
    assert info.value.status == 422
