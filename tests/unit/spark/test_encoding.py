"""Arrow batches (as Spark hands them to an Arrow writer) to Avro containers and back
(polymq_spark.encoding), with the schema polymq_spark.schema derives: what a reader of the
messages gets is what the DataFrame held."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from polymq_spark.encoding import arrow_to_records, encode_container, parse_schema
from polymq_spark.errors import EncodingError
from polymq_spark.schema import avro_schema

UTC = dt.UTC
POINT = StructType(
    [
        StructField("x", DoubleType(), False),
        StructField("at", TimestampType(), True),
        StructField("attrs", MapType(StringType(), LongType(), True), True),
    ]
)
SCHEMA = StructType(
    [
        StructField("id", LongType(), False),
        StructField("name", StringType(), True),
        StructField("score", DoubleType(), True),
        StructField("ratio", FloatType(), False),
        StructField("small", ByteType(), False),
        StructField("medium", ShortType(), False),
        StructField("count", IntegerType(), True),
        StructField("ok", BooleanType(), False),
        StructField("raw", BinaryType(), True),
        StructField("price", DecimalType(10, 2), True),
        StructField("day", DateType(), True),
        StructField("at", TimestampType(), True),
        StructField("local", TimestampNTZType(), True),
        StructField("tags", ArrayType(StringType(), True), True),
        StructField("labels", MapType(StringType(), StringType(), False), True),
        StructField("where", POINT, True),
        StructField("track", ArrayType(POINT, False), True),
        StructField("nested", MapType(StringType(), ArrayType(POINT, False), False), True),
    ]
)
AT = dt.datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=UTC)
ROWS: list[dict[str, Any]] = [
    {
        "id": 1,
        "name": "ünïcode ✓",
        "score": 0.5,
        "ratio": 0.25,
        "small": -128,
        "medium": 32767,
        "count": 2**31 - 1,
        "ok": True,
        "raw": b"\x00\xff",
        "price": Decimal("-12345678.90"),
        "day": dt.date(1969, 12, 31),
        "at": AT,
        "local": dt.datetime(2024, 1, 1, 12, 0, 0, 1),
        "tags": ["a", None, "c"],
        "labels": {"k": "v", "k2": "v2"},
        "where": {"x": 1.5, "at": AT, "attrs": {"n": 1, "none": None}},
        "track": [{"x": 2.0, "at": None, "attrs": None}],
        "nested": {"p": [{"x": 3.0, "at": AT, "attrs": {"deep": 7}}]},
    },
    {
        "id": -(2**63),
        "name": None,
        "score": None,
        "ratio": -1.5,
        "small": 0,
        "medium": 0,
        "count": None,
        "ok": False,
        "raw": None,
        "price": None,
        "day": None,
        "at": None,
        "local": None,
        "tags": None,
        "labels": None,
        "where": None,
        "track": [],
        "nested": {},
    },
]


def to_arrow(rows: list[dict[str, Any]], schema: StructType) -> pa.RecordBatch:
    """The batch Spark would hand the writer: Spark's own Spark-to-Arrow type mapping."""
    arrow_schema = to_arrow_schema(schema, timezone="Etc/UTC")

    def arrowish(value: Any) -> Any:  # Arrow takes maps as lists of pairs
        if isinstance(value, dict):
            return {k: arrowish(v) for k, v in value.items()}
        if isinstance(value, list):
            return [arrowish(v) for v in value]
        return value

    cols = {}
    for f in schema.fields:
        values = [arrowish(r[f.name]) for r in rows]
        t = arrow_schema.field(f.name).type
        cols[f.name] = pa.array([_pairs(v, t) for v in values], type=t)
    return pa.RecordBatch.from_pydict(cols, schema=arrow_schema)


def _pairs(value: Any, t: pa.DataType) -> Any:
    """Dicts for Arrow map types become lists of pairs, at any depth."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return [(k, _pairs(v, t.item_type)) for k, v in value.items()]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_pairs(v, t.value_type) for v in value]
    if pa.types.is_struct(t):
        return {
            t.field(i).name: _pairs(value[t.field(i).name], t.field(i).type)
            for i in range(t.num_fields)
        }
    return value


def read_back(body: bytes) -> list[dict[str, Any]]:
    return list(fastavro.reader(io.BytesIO(body)))  # type: ignore[arg-type]


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy"])
def test_round_trip_of_every_type(codec: str) -> None:
    batch = to_arrow(ROWS, SCHEMA)
    parsed = parse_schema(avro_schema(SCHEMA))
    body = encode_container(parsed, arrow_to_records(batch), codec)
    reader = fastavro.reader(io.BytesIO(body))
    assert reader.codec == codec
    got = list(reader)
    assert got == ROWS


def test_timestamps_are_instants_whatever_the_session_time_zone() -> None:
    schema = StructType([StructField("at", TimestampType(), False)])
    arrow_schema = to_arrow_schema(schema, timezone="America/New_York")
    batch = pa.RecordBatch.from_pydict({"at": pa.array([AT], arrow_schema.field("at").type)})
    body = encode_container(parse_schema(avro_schema(schema)), arrow_to_records(batch), "null")
    assert read_back(body) == [{"at": AT}]


def test_a_slice_encodes_only_its_rows() -> None:
    batch = to_arrow(ROWS, SCHEMA)
    parsed = parse_schema(avro_schema(SCHEMA))
    body = encode_container(parsed, arrow_to_records(batch.slice(1, 1)), "null")
    assert read_back(body) == ROWS[1:]


def test_a_row_that_does_not_fit_is_an_encoding_error() -> None:
    strict = StructType([StructField("id", LongType(), False)])
    parsed = parse_schema(avro_schema(strict))
    with pytest.raises(EncodingError, match="does not fit"):
        encode_container(parsed, [{"id": None}], "null")


SIMPLE = StructType(
    [
        StructField("id", LongType(), False),
        StructField("name", StringType(), True),
        StructField("value", DoubleType(), True),
        StructField("at", TimestampType(), True),
    ]
)
_rows = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.integers(-(2**63), 2**63 - 1),
            "name": st.none() | st.text(),
            "value": st.none() | st.floats(allow_nan=False),
            "at": st.none()
            | st.datetimes(
                min_value=dt.datetime(1, 1, 2),
                max_value=dt.datetime(9999, 12, 30),
                timezones=st.just(UTC),
            ),
        }
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(rows=_rows, codec=st.sampled_from(["null", "deflate", "snappy"]))
def test_round_trip_property(rows: list[dict[str, Any]], codec: str) -> None:
    batch = to_arrow(rows, SIMPLE)
    body = encode_container(parse_schema(avro_schema(SIMPLE)), arrow_to_records(batch), codec)
    assert read_back(body) == rows
