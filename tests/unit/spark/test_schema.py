"""Spark types to Avro types (polymq_spark.schema): every mapping, nesting, nullability and
the refusals, each checked to be a schema fastavro accepts."""

from __future__ import annotations

from typing import Any

import fastavro
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
    YearMonthIntervalType,
)

from polymq_spark.errors import UnsupportedTypeError
from polymq_spark.schema import avro_schema


def one(dt: DataType, nullable: bool = False) -> Any:
    """The Avro type of a single column ``c`` of type ``dt``."""
    schema = avro_schema(StructType([StructField("c", dt, nullable)]))
    fastavro.parse_schema(schema)  # a schema fastavro takes
    return schema["fields"][0]


@pytest.mark.parametrize(
    ("dt", "avro"),
    [
        (StringType(), "string"),
        (LongType(), "long"),
        (IntegerType(), "int"),
        (ShortType(), "int"),
        (ByteType(), "int"),
        (DoubleType(), "double"),
        (FloatType(), "float"),
        (BooleanType(), "boolean"),
        (BinaryType(), "bytes"),
        (DateType(), {"type": "int", "logicalType": "date"}),
        (TimestampType(), {"type": "long", "logicalType": "timestamp-micros"}),
        (TimestampNTZType(), {"type": "long", "logicalType": "local-timestamp-micros"}),
        (
            DecimalType(12, 3),
            {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
        ),
    ],
)
def test_scalar_types(dt: DataType, avro: Any) -> None:
    assert one(dt) == {"name": "c", "type": avro}
    assert one(dt, nullable=True) == {"name": "c", "type": ["null", avro], "default": None}


def test_top_level_record_name_and_namespace() -> None:
    schema = avro_schema(StructType([StructField("id", LongType(), False)]))
    assert (schema["type"], schema["name"], schema["namespace"]) == (
        "record",
        "Row",
        "polymq.spark",
    )
    named = avro_schema(StructType([StructField("id", LongType())]), "Event", "acme.events")
    assert (named["name"], named["namespace"]) == ("Event", "acme.events")
    assert avro_schema(StructType(), "E", "").get("namespace") is None


def test_arrays_and_maps_with_and_without_nulls() -> None:
    assert one(ArrayType(LongType(), containsNull=False))["type"] == {
        "type": "array",
        "items": "long",
    }
    assert one(ArrayType(StringType(), containsNull=True))["type"] == {
        "type": "array",
        "items": ["null", "string"],
    }
    assert one(MapType(StringType(), DoubleType(), valueContainsNull=False))["type"] == {
        "type": "map",
        "values": "double",
    }
    assert one(MapType(StringType(), DoubleType(), valueContainsNull=True))["type"] == {
        "type": "map",
        "values": ["null", "double"],
    }


def test_nested_structs_are_records_named_after_their_path() -> None:
    point = StructType([StructField("x", DoubleType(), False), StructField("y", DoubleType())])
    schema = avro_schema(
        StructType(
            [
                StructField("where", point, True),
                StructField("path", ArrayType(point, False), False),
                StructField("named", MapType(StringType(), point, False), False),
            ]
        )
    )
    fastavro.parse_schema(schema)
    where, path, named = schema["fields"]
    assert where["type"][0] == "null" and where["default"] is None
    rec = where["type"][1]
    assert rec["type"] == "record" and rec["name"] == "Row_where"
    assert rec["fields"] == [
        {"name": "x", "type": "double"},
        {"name": "y", "type": ["null", "double"], "default": None},
    ]
    assert path["type"]["items"]["name"] == "Row_path_item"
    assert named["type"]["values"]["name"] == "Row_named_value"


def test_record_names_never_repeat() -> None:
    inner = StructType([StructField("v", LongType(), False)])
    # "a_b" at the top and "b" inside "a" would both be Row_a_b
    schema = avro_schema(
        StructType(
            [
                StructField("a_b", inner, False),
                StructField("a", StructType([StructField("b", inner, False)]), False),
            ]
        )
    )
    fastavro.parse_schema(schema)  # would raise on a redefined name
    names = [
        schema["fields"][0]["type"]["name"],
        schema["fields"][1]["type"]["fields"][0]["type"]["name"],
    ]
    assert len(set(names)) == 2


def test_null_type_is_avro_null() -> None:
    assert one(NullType(), nullable=True) == {"name": "c", "type": "null", "default": None}
    assert one(ArrayType(NullType(), True))["type"] == {"type": "array", "items": "null"}


@pytest.mark.parametrize(
    ("dt", "hint"),
    [
        (DayTimeIntervalType(), "cast it to a long"),
        (YearMonthIntervalType(), "months"),
        (VariantType(), "to_json"),
        (MapType(LongType(), StringType()), "map keys must be strings"),
    ],
)
def test_unsupported_types_name_the_column(dt: DataType, hint: str) -> None:
    with pytest.raises(UnsupportedTypeError) as err:
        avro_schema(StructType([StructField("ok", LongType()), StructField("bad", dt)]))
    assert "'bad'" in str(err.value) and hint in str(err.value)
    assert err.value.path == "bad"


def test_unsupported_type_deep_inside_names_its_path() -> None:
    inner = StructType([StructField("span", DayTimeIntervalType())])
    with pytest.raises(UnsupportedTypeError) as err:
        avro_schema(StructType([StructField("outer", ArrayType(inner))]))
    assert err.value.path == "outer[].span"


@pytest.mark.parametrize("name", ["count(1)", "a b", "1st", "é"])
def test_field_names_must_be_avro_names(name: str) -> None:
    with pytest.raises(UnsupportedTypeError, match="rename the column"):
        avro_schema(StructType([StructField(name, LongType())]))


def test_duplicate_columns_are_refused() -> None:
    with pytest.raises(UnsupportedTypeError, match="twice"):
        avro_schema(StructType([StructField("a", LongType()), StructField("a", StringType())]))
