"""The Avro schema of a DataFrame: Spark SQL types mapped to Avro types.

============================  =========================================================
Spark                         Avro
============================  =========================================================
string, char(n), varchar(n)   ``string``
long                          ``long``
int, short, byte              ``int``
double / float                ``double`` / ``float``
boolean                       ``boolean``
binary                        ``bytes``
decimal(p, s)                 ``bytes`` with logical type ``decimal`` (precision p, scale s)
date                          ``int`` with logical type ``date`` (days since 1970-01-01)
timestamp                     ``long`` with logical type ``timestamp-micros`` (UTC instant)
timestamp_ntz                 ``long`` with logical type ``local-timestamp-micros``
array<T>                      ``array`` of T
map<string, T>                ``map`` of T (Avro map keys are strings: other keys are refused)
struct<...>                   a nested ``record``, named after its path (``Row_address``)
void (NULL literal)           ``null``
nullable T                    ``["null", T]`` (with ``"default": null`` on record fields)
============================  =========================================================

Everything else (intervals, variant, time, calendar types, user-defined types) raises
:class:`~polymq_spark.errors.UnsupportedTypeError` naming the column and saying what to cast
it to. Field names must be valid Avro names (``[A-Za-z_][A-Za-z0-9_]*``); a column such as
``count(1)`` has to be renamed (``alias``) first.
"""

from __future__ import annotations

import re
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from .errors import UnsupportedTypeError

__all__ = ["DEFAULT_NAMESPACE", "DEFAULT_RECORD_NAME", "AvroSchema", "avro_schema", "valid_name"]

AvroSchema = dict[str, Any]
DEFAULT_RECORD_NAME = "Row"
DEFAULT_NAMESPACE = "polymq.spark"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAMESPACE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

_PRIMITIVES: dict[type[DataType], str] = {
    StringType: "string",
    CharType: "string",
    VarcharType: "string",
    LongType: "long",
    IntegerType: "int",
    ShortType: "int",
    ByteType: "int",
    DoubleType: "double",
    FloatType: "float",
    BooleanType: "boolean",
    BinaryType: "bytes",
    NullType: "null",
}
_HINTS = {
    "DayTimeIntervalType": "cast it to a long (e.g. seconds) or a string",
    "YearMonthIntervalType": "cast it to an int (months) or a string",
    "CalendarIntervalType": "cast it to a string",
    "VariantType": "convert it with to_json() to a string",
    "TimeType": "cast it to a string",
}


def valid_name(name: str) -> bool:
    """Whether ``name`` is a valid Avro name (not a dotted full name)."""
    return _NAME.match(name) is not None


def valid_namespace(namespace: str) -> bool:
    """Whether ``namespace`` is a valid (dotted, possibly empty) Avro namespace."""
    return namespace == "" or _NAMESPACE.match(namespace) is not None


def avro_schema(
    schema: StructType, name: str = DEFAULT_RECORD_NAME, namespace: str = DEFAULT_NAMESPACE
) -> AvroSchema:
    """The Avro record schema for rows of ``schema``: a top-level record ``namespace.name``
    whose nested records are named after their path (``Row_address``, ``Row_tags_item``)."""
    if not valid_name(name):
        raise UnsupportedTypeError("<root>", f"record name {name!r} is not a valid Avro name")
    if not valid_namespace(namespace):
        raise UnsupportedTypeError("<root>", f"namespace {namespace!r} is not a valid Avro name")
    mapper = _Mapper()
    record = mapper.record(schema, name, path="")
    if namespace:
        record["namespace"] = namespace
    return record


class _Mapper:
    """One schema's mapping: remembers the record names used so that none repeats."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def unique(self, name: str) -> str:
        candidate, n = name, 1
        while candidate in self.names:
            n += 1
            candidate = f"{name}{n}"
        self.names.add(candidate)
        return candidate

    def record(self, struct: StructType, name: str, path: str) -> AvroSchema:
        fields: list[AvroSchema] = []
        seen: set[str] = set()
        record_name = self.unique(name)
        for f in struct.fields:
            where = f"{path}.{f.name}" if path else f.name
            if not valid_name(f.name):
                raise UnsupportedTypeError(
                    where,
                    f"{f.name!r} is not a valid Avro field name ([A-Za-z_][A-Za-z0-9_]*); "
                    "rename the column (alias or withColumnRenamed)",
                )
            if f.name in seen:
                raise UnsupportedTypeError(where, "appears twice in the same struct")
            seen.add(f.name)
            avro_type = self.type(f.dataType, f"{record_name}_{f.name}", where)
            field: AvroSchema = {"name": f.name, "type": avro_type}
            if f.nullable and not isinstance(f.dataType, NullType):
                field["type"] = ["null", avro_type]
                field["default"] = None
            elif isinstance(f.dataType, NullType):
                field["default"] = None
            fields.append(field)
        return {"type": "record", "name": record_name, "fields": fields}

    def type(self, dt: DataType, name: str, path: str) -> Any:
        primitive = _PRIMITIVES.get(type(dt))
        if primitive is not None:
            return primitive
        if isinstance(dt, DecimalType):
            return {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": dt.precision,
                "scale": dt.scale,
            }
        if isinstance(dt, DateType):
            return {"type": "int", "logicalType": "date"}
        if isinstance(dt, TimestampNTZType):
            return {"type": "long", "logicalType": "local-timestamp-micros"}
        if isinstance(dt, TimestampType):
            return {"type": "long", "logicalType": "timestamp-micros"}
        if isinstance(dt, ArrayType):
            items = self.type(dt.elementType, f"{name}_item", f"{path}[]")
            return {"type": "array", "items": self.nullable(items, dt.containsNull)}
        if isinstance(dt, MapType):
            if not isinstance(dt.keyType, StringType | CharType | VarcharType):
                raise UnsupportedTypeError(
                    path,
                    f"map keys must be strings in Avro, not {dt.keyType.simpleString()}; "
                    "cast the keys (transform_keys) or store the map as an array of structs",
                )
            values = self.type(dt.valueType, f"{name}_value", f"{path}{{}}")
            return {"type": "map", "values": self.nullable(values, dt.valueContainsNull)}
        if isinstance(dt, StructType):
            return self.record(dt, name, path)
        hint = _HINTS.get(type(dt).__name__, "cast it to a supported type")
        raise UnsupportedTypeError(
            path, f"Spark type {dt.simpleString()} has no Avro mapping: {hint}"
        )

    @staticmethod
    def nullable(avro_type: Any, nullable: bool) -> Any:
        if not nullable or avro_type == "null":
            return avro_type
        return ["null", avro_type]
