"""Rows to Avro: Arrow record batches (what Spark hands an Arrow writer) to Python records
that fastavro takes, and records to an Avro object container file.

No Spark and no sockets here: the writer calls these in its tasks, the tests call them alone.

Top-level ``timestamp``/``timestamp_ntz``/``date`` columns are turned into their Avro
representation (microseconds / days since the epoch) by Arrow in one vectorised cast, which
spares building a ``datetime`` per value; fastavro takes those integers as they are. Nested
ones come through as ``datetime``/``date`` objects, which fastavro converts itself. Arrow
gives a map as a list of ``(key, value)`` pairs: those are made dicts, at any depth.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import fastavro
import pyarrow as pa

from .errors import EncodingError
from .schema import AvroSchema

__all__ = ["SYNC_INTERVAL", "arrow_to_records", "encode_container", "parse_schema"]

Record = dict[str, Any]
_Fix = Callable[[Any], Any]
# bytes of records between two sync markers in a container: one block per ~64 KiB (fastavro's
# default is ~16 KB), so a 5,000-row batch is a handful of blocks rather than dozens
SYNC_INTERVAL = 64 * 1024


def parse_schema(schema: AvroSchema) -> Any:
    """fastavro's parsed form of ``schema`` (parse once per task, encode many batches)."""
    return fastavro.parse_schema(schema)


def arrow_to_records(batch: pa.RecordBatch) -> list[Record]:
    """The rows of ``batch`` as dicts whose values fastavro can write with the schema that
    :func:`polymq_spark.schema.avro_schema` gives for the same Spark schema."""
    names = batch.schema.names
    columns: list[list[Any]] = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        columns.append(_column_values(field.type, column))
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def _column_values(t: pa.DataType, column: pa.Array) -> list[Any]:
    if pa.types.is_timestamp(t):
        if t.unit != "us":
            column = column.cast(pa.timestamp("us", tz=t.tz))
        return column.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_date32(t):
        return column.cast(pa.int32()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_date64(t):
        return column.cast(pa.date32()).cast(pa.int32()).to_pylist()  # type: ignore[no-any-return]
    values: list[Any] = column.to_pylist()
    fix = _fixer(t)
    if fix is not None:
        values = [fix(v) for v in values]
    return values


def _fixer(t: pa.DataType) -> _Fix | None:
    """A function that turns Arrow's Python value of type ``t`` into fastavro's, or None when
    the value is already right (no map inside)."""
    if pa.types.is_map(t):
        fix_value = _fixer(t.item_type)
        if fix_value is None:
            return lambda v: None if v is None else dict(v)
        fv = fix_value
        return lambda v: None if v is None else {k: fv(x) for k, x in v}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        fix_item = _fixer(t.value_type)
        if fix_item is None:
            return None
        fi = fix_item
        return lambda v: None if v is None else [fi(x) for x in v]
    if pa.types.is_struct(t):
        fixes = [(t.field(i).name, _fixer(t.field(i).type)) for i in range(t.num_fields)]
        needed = [(name, f) for name, f in fixes if f is not None]
        if not needed:
            return None

        def fix_struct(v: Any) -> Any:
            if v is None:
                return None
            for name, f in needed:
                v[name] = f(v[name])
            return v

        return fix_struct
    return None


def encode_container(parsed_schema: Any, records: Sequence[Record], codec: str) -> bytes:
    """An Avro object container file holding ``records`` (codec ``null``/``deflate``/``snappy``)."""
    buf = io.BytesIO()
    try:
        fastavro.writer(buf, parsed_schema, records, codec=codec, sync_interval=SYNC_INTERVAL)
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise EncodingError(f"a row does not fit the Avro schema: {exc}") from exc
    return buf.getvalue()
