"""Fuzzing the Avro decoding of ``polymq_server`` (``avro``, ``avrobounds``, ``avroview``,
``jsonview``) with deep and recursive inputs: schemas nested thousands deep or recursive,
records nested 30,000 deep in 60 KB, random bytes, arrays of items that take no bytes.

Each test asserts what a caller sees: the value, or one of the documented errors, never
anything else. On code without the bounds these inputs reach fastavro's C reader, which
recurses on the C stack until the process (here: the test run) dies of SIGSEGV."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymq.types import Message
from polymq_server.messages.avro import (
    DecodeError,
    InvalidSchema,
    SchemaCache,
    decode_single,
    parse,
    to_json_value,
)
from polymq_server.messages.avrobounds import MAX_DEPTH, MAX_EMPTY_ITEMS, walk
from polymq_server.messages.avroview import json_value
from polymq_server.messages.jsonview import message_json

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

# ---- recursive schemas and their deepest values, encoded by hand ---------------------------
LIST = {
    "type": "record",
    "name": "L",
    "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "L"]}],
}
TREE = {
    "type": "record",
    "name": "T",
    "fields": [{"name": "kids", "type": {"type": "array", "items": "T"}}],
}
MAPTREE = {
    "type": "record",
    "name": "M",
    "namespace": "deep.ns",
    "fields": [{"name": "kids", "type": {"type": "map", "values": "deep.ns.M"}}],
}


def list_data(d: int) -> bytes:
    """``d`` + 1 nodes: each is a record and a union (two levels)."""
    return b"\x02\x02" * d + b"\x02\x00"


def tree_data(d: int) -> bytes:
    """A chain of ``d`` + 1 records, each an array holding the next (two levels each)."""
    return b"\x02" * d + b"\x00" + b"\x00" * d


def maptree_data(d: int) -> bytes:
    return b"\x02\x02k" * d + b"\x00" + b"\x00" * d


def list_value(d: int) -> Any:
    node: Any = {"v": 1, "next": None}
    for _ in range(d):
        node = {"v": 1, "next": node}
    return node


def tree_value(d: int) -> Any:
    node: Any = {"kids": []}
    for _ in range(d):
        node = {"kids": [node]}
    return node


def maptree_value(d: int) -> Any:
    node: Any = {"kids": {}}
    for _ in range(d):
        node = {"kids": {"k": node}}
    return node


DEEP: list[tuple[Any, Callable[[int], bytes], Callable[[int], Any]]] = [
    (LIST, list_data, list_value),
    (TREE, tree_data, tree_value),
    (MAPTREE, maptree_data, maptree_value),
]
LAST_ALLOWED = MAX_DEPTH // 2 - 1  # links of the deepest chain that fits: 2 levels a node
DEPTHS = st.sampled_from([0, 1, LAST_ALLOWED, LAST_ALLOWED + 1, 1000, 5000, 30_000]) | st.integers(
    0, 20_000
)


def avro_message(body: bytes, schema_id: str) -> Message:
    """An Avro message as the frontends publish it: its header names its schema's id."""
    return Message(body, "avro/binary", headers={"avro-schema-id": schema_id})


def cache_of(*schemas: Any) -> SchemaCache:
    async def fetch(key: str) -> bytes:  # pragma: no cover - every schema is put
        raise AssertionError(key)

    cache = SchemaCache(fetch)
    for s in schemas:
        cache.put(parse(s))
    return cache


@FUZZ
@given(st.sampled_from(DEEP), DEPTHS)
def test_deep_records_decode_within_the_bound_and_are_refused_past_it(
    case: tuple[Any, Callable[[int], bytes], Callable[[int], Any]], depth: int
) -> None:
    schema_json, data, value = case
    schema = parse(schema_json)
    assert schema.shape.recursive and schema.shape.walk
    body = schema.header + data(depth)
    if depth <= LAST_ALLOWED:
        assert decode_single(body, schema) == value(depth)
        assert decode_single(body, schema, logical=False) == value(depth)
    else:
        with pytest.raises(DecodeError, match=f"more than {MAX_DEPTH} deep"):
            decode_single(body, schema)


@FUZZ
@given(st.sampled_from(DEEP), DEPTHS)
def test_a_view_of_a_deep_record_is_the_value_or_an_error(
    case: tuple[Any, Callable[[int], bytes], Callable[[int], Any]], depth: int
) -> None:
    """The JSON views (HTTP's pull, long polling, STOMP's accept: json) never raise."""
    schema_json, data, value = case
    cache = cache_of(schema_json)
    [schema] = [cache.cached(s) for s in [parse(schema_json).id]]
    assert schema is not None
    message = avro_message(schema.header + data(depth), schema.id)
    shown = message_json(message, cache)
    got, error = json_value(cache, message)
    if depth <= LAST_ALLOWED:
        assert error is None and got == to_json_value(value(depth)) == shown["value"]
        assert "value_error" not in shown
    else:
        assert got is None and shown["value"] is None
        assert error is not None and f"more than {MAX_DEPTH} deep" in error
        assert shown["value_error"] == error
    json.dumps(shown)  # and what it shows can be written as JSON


TOPS: list[tuple[Any, bytes, bytes, Callable[[Any], Any]]] = [
    # (a schema holding the list, the bytes before and after the list, the value around it)
    (["null", LIST], b"\x02", b"", lambda v: v),
    ({"type": "array", "items": LIST}, b"\x02", b"\x00", lambda v: [v]),
    ({"type": "map", "values": LIST}, b"\x02\x02k", b"\x00", lambda v: {"k": v}),
    (
        {
            "type": "record",
            "name": "Top",
            "namespace": "a.b",
            "fields": [{"name": "l", "type": LIST}],
        },
        b"",
        b"",
        lambda v: {"l": v},
    ),
]


@FUZZ
@given(st.sampled_from(TOPS), DEPTHS)
def test_a_recursive_type_inside_a_union_array_map_or_record_is_bounded_alike(
    top: tuple[Any, bytes, bytes, Callable[[Any], Any]], depth: int
) -> None:
    """Where the recursive record is defined (not at the top, where fastavro keeps its
    table of names) its data is walked all the same."""
    schema_json, before, after, around = top
    schema = parse(schema_json)
    assert schema.shape.recursive
    body = schema.header + before + list_data(depth) + after
    if depth + 1 <= LAST_ALLOWED:  # (one level more: the union, array, map or record)
        assert decode_single(body, schema) == around(list_value(depth))
    elif depth > LAST_ALLOWED:
        with pytest.raises(DecodeError, match=f"more than {MAX_DEPTH} deep"):
            decode_single(body, schema)


@FUZZ
@given(st.sampled_from([LIST, TREE, MAPTREE]), st.binary(max_size=300))
def test_random_bytes_of_a_recursive_schema_decode_or_fail_as_documented(
    schema_json: Any, data: bytes
) -> None:
    schema = parse(schema_json)
    cache = cache_of(schema_json)
    body = schema.header + data
    try:
        decode_single(body, schema)
    except DecodeError:
        pass
    shown = message_json(avro_message(body, schema.id), cache)
    assert (shown["value"] is None) == ("value_error" in shown)


@FUZZ
@given(
    st.sampled_from(
        [
            {"type": "array", "items": "null"},
            {"type": "array", "items": {"type": "record", "name": "E", "fields": []}},
            {"type": "array", "items": {"type": "fixed", "name": "Z", "size": 0}},
        ]
    ),
    st.sampled_from([MAX_EMPTY_ITEMS, MAX_EMPTY_ITEMS + 3, MAX_EMPTY_ITEMS + 4, 2**62])
    | st.integers(0, 2**62),
)
def test_items_that_take_no_bytes_are_bounded(schema_json: Any, count: int) -> None:
    """An array of nulls may claim 2**62 items in ten bytes: refused before fastavro
    builds the list (it used to grow until memory ran out)."""
    schema = parse(schema_json)
    assert schema.shape.empty_items and schema.shape.walk
    data = _long(count) + (b"\x00" if count else b"")  # a block, and the end
    if count > len(data) + MAX_EMPTY_ITEMS:
        with pytest.raises(DecodeError, match="more array and map items"):
            decode_single(schema.header + data, schema)
    else:
        assert len(decode_single(schema.header + data, schema)) == count


def _long(n: int) -> bytes:
    """Avro's encoding of a long (as fastavro writes it)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, "long", n)
    return out.getvalue()


def trees(depth: int) -> st.SearchStrategy[Any]:
    leaf: st.SearchStrategy[Any] = st.just({"kids": []})
    if depth == 0:
        return leaf
    return leaf | st.builds(lambda kids: {"kids": kids}, st.lists(trees(depth - 1), max_size=3))


@FUZZ
@given(st.lists(trees(5), min_size=1, max_size=4))
def test_the_walk_ends_where_fastavro_ends(values: list[Any]) -> None:
    """On what fastavro writes, the walk finds each record's end as fastavro reads it."""
    schema = parse(TREE)
    out = io.BytesIO()
    ends = []
    for v in values:
        fastavro.schemaless_writer(out, schema.plain, v)
        ends.append(out.tell())
    data = out.getvalue()
    pos, walked = 0, []
    for _ in values:
        pos = walk(data, pos, schema.plain, schema.shape.named)
        walked.append(pos)
    assert walked == ends


# ---- schemas ---------------------------------------------------------------------------------
def nested(kind: str, depth: int) -> str:
    """A schema's JSON whose types nest ``depth`` deep."""
    if kind == "array":
        return '{"type":"array","items":' * depth + '"int"' + "}" * depth
    if kind == "map":
        return '{"type":"map","values":' * depth + '"int"' + "}" * depth
    if kind == "union":  # a union cannot hold a union: a union of an array of...
        return '["null",{"type":"array","items":' * depth + '"int"' + "}]" * depth
    if kind == "wrapper":
        return '{"type":' * depth + '"int"' + "}" * depth
    return (
        "".join(
            f'{{"type":"record","name":"R{i}","fields":[{{"name":"f","type":' for i in range(depth)
        )
        + '"int"'
        + "}]}" * depth
    )


@FUZZ
@given(
    st.sampled_from(["array", "map", "union", "record", "wrapper"]),
    st.sampled_from([1, MAX_DEPTH // 2, MAX_DEPTH, MAX_DEPTH + 1, 3000, 50_000])
    | st.integers(1, 5000),
)
def test_deep_schemas_are_refused_as_invalid(kind: str, depth: int) -> None:
    levels = depth * (2 if kind == "union" else 1) if kind != "wrapper" else 0
    try:
        schema = parse(nested(kind, depth))
    except InvalidSchema as exc:
        assert levels > MAX_DEPTH or kind == "wrapper", exc
        return
    assert levels <= MAX_DEPTH
    assert schema.shape.height == levels and not schema.shape.walk


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_a_deep_schema_given_as_data_is_refused_without_recursion(depth: int) -> None:
    """A schema handed over already decoded (not through json.loads, which would stop it)."""
    schema: Any = "int"
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InvalidSchema, match="nests"):
        parse(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "record", "name": "X", "fields": [{"name": "x", "type": "X"}]},
        {
            "type": "record",
            "name": "X",
            "fields": [
                {
                    "name": "y",
                    "type": {"type": "record", "name": "Y", "fields": [{"name": "x", "type": "X"}]},
                }
            ],
        },
        {
            "type": "record",
            "name": "X",
            "fields": [
                {"name": "n", "type": "int"},
                {
                    "name": "y",
                    "type": {
                        "type": "record",
                        "name": "Y",
                        "fields": [
                            {
                                "name": "z",
                                "type": {
                                    "type": "error",
                                    "name": "Z",
                                    "fields": [{"name": "x", "type": "X"}],
                                },
                            },
                        ],
                    },
                },
            ],
        },
    ],
)
def test_a_record_that_always_contains_itself_is_refused(schema: Any) -> None:
    """It has no finite value, and fastavro would recurse for ever reading any bytes."""
    with pytest.raises(InvalidSchema, match="contains itself"):
        parse(schema)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.sampled_from(["int", "null", "record", "array", "map", "L", "string", "fields"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["type", "name", "fields", "items", "values", "symbols", "size"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=40,
)


@FUZZ
@given(JSON)
def test_any_json_is_a_schema_or_invalid(obj: Any) -> None:
    for given_as in (obj, json.dumps(obj)):
        try:
            schema = parse(given_as)
        except InvalidSchema:
            continue
        assert schema.shape.height <= MAX_DEPTH
