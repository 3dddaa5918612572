"""AMQP header values through the core, whose message headers map strings to strings.

A header whose AMQP value is not a string is carried as its text (:func:`to_text`: ``42``,
``true``, a timestamp in unix seconds, JSON for a table or an array) for the other
protocols, and as a typed value (:func:`to_tagged`, JSON) from which :func:`from_tagged`
restores it. The AMQP frontend keeps the typed values of a message's headers in one reserved
header; the records of bindings (``polymq_server.exchanges.records``) keep their arguments tagged,
so that
every frontend that routes through an exchange reads them with their AMQP types.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["from_tagged", "to_tagged", "to_text"]


def to_text(v: Any) -> str:
    """How other protocols see an AMQP header value."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | decimal.Decimal):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    if isinstance(v, bytes | bytearray):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.UTC)
        return str(int(v.timestamp()))
    if v is None:
        return ""
    return json.dumps(_plain(v), separators=(",", ":"), ensure_ascii=False, default=str)


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, str | bool | int | float) or v is None:
        return v
    return to_text(v)


def to_tagged(v: Any) -> Any:
    """A JSON value that :func:`from_tagged` turns back into ``v`` (its AMQP type kept)."""
    if isinstance(v, str):
        return ["S", v]
    if isinstance(v, bool):
        return ["t", v]
    if isinstance(v, int):
        return ["i", v]
    if isinstance(v, float):
        return ["d", v if math.isfinite(v) else repr(v)]
    if isinstance(v, decimal.Decimal):
        return ["D", str(v)]
    if isinstance(v, bytearray):
        return ["x", base64.b64encode(bytes(v)).decode("ascii")]
    if isinstance(v, bytes):
        return ["b", base64.b64encode(v).decode("ascii")]
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.UTC)
        return ["T", int(v.timestamp())]
    if isinstance(v, Mapping):
        return ["F", {str(k): to_tagged(x) for k, x in v.items()}]
    if isinstance(v, list | tuple):
        return ["A", [to_tagged(x) for x in v]]
    if v is None:
        return ["V"]
    return ["S", str(v)]


def from_tagged(t: Any) -> Any:
    """The value :func:`to_tagged` made; ValueError if ``t`` is not one."""
    if not isinstance(t, list) or not t or not isinstance(t[0], str):
        raise ValueError("not a tagged value")
    tag = t[0]
    if tag == "V":
        return None
    if len(t) != 2:
        raise ValueError("not a tagged value")
    v = t[1]
    if tag == "S" and isinstance(v, str):
        return v
    if tag == "t" and isinstance(v, bool):
        return v
    if tag == "i" and isinstance(v, int) and not isinstance(v, bool):
        return v
    if tag == "d" and isinstance(v, int | float | str) and not isinstance(v, bool):
        return float(v)
    if tag == "D" and isinstance(v, str):
        return decimal.Decimal(v)
    if tag == "x" and isinstance(v, str):
        return bytearray(base64.b64decode(v))
    if tag == "b" and isinstance(v, str):
        return base64.b64decode(v)
    if tag == "T" and isinstance(v, int):
        return datetime.datetime.fromtimestamp(v, tz=datetime.UTC)
    if tag == "F" and isinstance(v, dict):
        return {k: from_tagged(x) for k, x in v.items()}
    if tag == "A" and isinstance(v, list):
        return [from_tagged(x) for x in v]
    raise ValueError(f"not a tagged value: {tag!r}")
