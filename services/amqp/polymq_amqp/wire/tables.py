"""AMQP field tables: encoded here for what goes out, and carried through the core.

pamqp decodes what comes in; what goes out is encoded by :func:`encode_table`, which keeps
a double a double (pamqp would narrow it to a 4-byte float) and writes integers in the
smallest signed type RabbitMQ's own clients read.

A polymq message's headers map strings to strings, so that STOMP and HTTP can show them.
A header whose AMQP value is not a string is carried as its text (:func:`to_text`: ``42``,
``true``, a timestamp in unix seconds, JSON for a table or an array) for the other
protocols, and as a typed value (:func:`to_tagged`, JSON) in one reserved header, from which
an AMQP delivery restores it, unless another protocol changed the text meanwhile. Those
three (:func:`to_text`, :func:`to_tagged`, :func:`from_tagged`) live in
:mod:`polymq_server.messages.tagged` (the STOMP frontend reads tagged binding arguments too) and are
imported from there.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Mapping
from typing import Any, Final

from polymq_server.messages.tagged import from_tagged, to_tagged, to_text

__all__ = ["encode_table", "from_tagged", "to_tagged", "to_text"]

_INT8: Final = struct.Struct(">b")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_UINT32: Final = struct.Struct(">I")
_INT64: Final = struct.Struct(">q")
_UINT64: Final = struct.Struct(">Q")
_DOUBLE: Final = struct.Struct(">d")


def encode_table(table: Mapping[str, Any] | None) -> bytes:
    """A field table (with its 4-byte length)."""
    if not table:
        return b"\x00\x00\x00\x00"
    parts: list[bytes] = []
    for key, value in table.items():
        name = str(key).encode("utf-8")[:255]
        parts.append(bytes((len(name),)))
        parts.append(name)
        parts.append(_value(value))
    data = b"".join(parts)
    return _UINT32.pack(len(data)) + data


def _value(v: Any) -> bytes:
    if isinstance(v, str):
        data = v.encode("utf-8", "surrogatepass")
        return b"S" + _UINT32.pack(len(data)) + data
    if isinstance(v, bool):
        return b"t\x01" if v else b"t\x00"
    if isinstance(v, int):
        if -128 <= v <= 127:
            return b"b" + _INT8.pack(v)
        if -32768 <= v <= 32767:
            return b"s" + _INT16.pack(v)
        if -(2**31) <= v < 2**31:
            return b"I" + _INT32.pack(v)
        if -(2**63) <= v < 2**63:
            return b"l" + _INT64.pack(v)
        return _value(str(v))
    if isinstance(v, float):
        return b"d" + _DOUBLE.pack(v)
    if isinstance(v, decimal.Decimal):
        sign, digits, exponent = v.as_tuple()
        if isinstance(exponent, int) and -255 <= exponent <= 0:
            raw = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
            if -(2**31) <= raw < 2**31:
                return b"D" + bytes((-exponent,)) + _INT32.pack(raw)
        return _value(str(v))
    if isinstance(v, bytearray):
        return b"x" + _UINT32.pack(len(v)) + bytes(v)
    if isinstance(v, bytes | memoryview):
        data = bytes(v)
        return b"S" + _UINT32.pack(len(data)) + data
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.UTC)
        return b"T" + _UINT64.pack(max(0, int(v.timestamp())))
    if isinstance(v, Mapping):
        return b"F" + encode_table(v)
    if isinstance(v, list | tuple):
        data = b"".join(_value(x) for x in v)
        return b"A" + _UINT32.pack(len(data)) + data
    if v is None:
        return b"V"
    return _value(str(v))
