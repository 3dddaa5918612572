"""JSON in and out, for the JSON frontends (``polymq_http``; ``polymq_longpoll`` and
``polymq_avro`` read bodies, publish and settle with the same checks): request bodies and
query strings checked into polymq values, and pulled messages as JSON. Every check here
matches a schema in the HTTP frontend's OpenAPI document (``polymq_http/openapi.py``).

A value that passes here can always be encoded for the core: strings are valid Unicode
(no lone surrogates), integers fit 64 bits and numbers are finite.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from polymq import Lease, Message
from polymq.types import MAX_PRIORITY, DeclareOptions, Destination, Kind

from ..auth.deadletter import DECLARER
from ..messages.avro import SchemaCache
from ..messages.headers import public_headers
from ..messages.jsonview import message_json
from .guards import is_json
from .problems import Problem, bad_request
from .receipts import receipt_destination as receipt_destination  # settling is shared

__all__ = [
    "BASE64_PATTERN",
    "ENCODINGS",
    "MAX_CONTENT_TYPE",
    "MAX_COUNT",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_KEYS",
    "MAX_SECONDS",
    "MAX_TEXT",
    "MAX_VISIBILITY",
    "MESSAGE_KEYS",
    "NAME_PATTERN",
    "SEGMENT",
    "lease_json",
    "no_query",
    "parse_declare",
    "parse_message",
    "parse_metadata",
    "parse_publish",
    "parse_pull_query",
    "parse_settle",
    "query_value",
    "read_json",
    "receipt_destination",
]

MAX_SECONDS = 10 * 365 * 86400  # ttl, ack timeout, idle ttl: at most ten years
MAX_VISIBILITY = 43200.0  # the core's bound
MAX_COUNT = 2**53 - 1  # integer options: what every JSON parser reads exactly
MAX_TEXT = 1024  # correlation id, reply-to, a receipt
MAX_CONTENT_TYPE = 255
MAX_METADATA_KEYS = 256
MAX_METADATA_BYTES = 65536

BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_BASE64_RE = re.compile(BASE64_PATTERN)
SEGMENT = r"[A-Za-z0-9_:\-]+"
NAME_PATTERN = rf"^{SEGMENT}(\.{SEGMENT})*$"

ENCODINGS = ("utf8", "base64")
MESSAGE_KEYS = frozenset(
    {
        "body",
        "encoding",
        "content_type",
        "headers",
        "priority",
        "persistent",
        "ttl",
        "ack_timeout",
        "correlation_id",
        "reply_to",
    }
)
_TEXT_DEFAULT = "text/plain; charset=utf-8"
_BINARY_DEFAULT = "application/octet-stream"


# ---- reading a body ------------------------------------------------------------------------
async def read_json(
    request: web.Request, max_body: int, *, required: bool = True
) -> tuple[Any, int]:
    """The request's JSON body and its size in bytes; ``(None, 0)`` if empty and optional."""
    declared = request.content_length
    if declared is not None and declared > max_body:
        raise Problem(413, f"request body of {declared} bytes exceeds the maximum of {max_body}")
    ctype = request.headers.get("Content-Type")
    if request.body_exists and ctype is not None and not is_json(ctype):
        raise Problem(415, f"send JSON with Content-Type: application/json, not {ctype[:80]!r}")
    raw = await request.read()  # aiohttp stops at client_max_size (413) for chunked bodies
    if not raw:
        if required:
            raise bad_request("this request needs a JSON body")
        return None, 0
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise bad_request("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise bad_request(f"malformed JSON: {exc}") from None
    _check_encodable(data)
    return data, len(raw)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_encodable(data: Any) -> None:
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            _check_text(v)
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not -(2**63) <= v < 2**63:
                raise bad_request("an integer in the body is out of the 64-bit range")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise bad_request("a number in the body is out of range")
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("a string in the body is not valid Unicode (lone surrogate)") from None


def _object(data: Any, what: str, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise bad_request(f"{what} must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise bad_request(f"unknown field(s) in {what}: {shown}")
    return data


# ---- field checks ------------------------------------------------------------------------------
def _as_int(v: Any) -> int | None:
    """An integer, or a float with no fraction (JSON Schema's "integer"); else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _seconds(
    d: Mapping[str, Any], key: str, where: str, upper: float = MAX_SECONDS
) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if not _is_number(v) or not 0 < v <= upper:
        raise bad_request(f"{where}{key} must be a number of seconds > 0 and <= {upper:g}")
    return float(v)


def _count(d: Mapping[str, Any], key: str, where: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    n = _as_int(v)
    if n is None or not 1 <= n <= MAX_COUNT:
        raise bad_request(f"{where}{key} must be an integer 1..{MAX_COUNT}")
    return n


def _text(d: Mapping[str, Any], key: str, where: str, limit: int = MAX_TEXT) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise bad_request(f"{where}{key} must be a string of at most {limit} characters")
    return v


# ---- publish ---------------------------------------------------------------------------------
def parse_publish(data: Any, dest: Destination, max_batch: int) -> tuple[list[Message], str | None]:
    """``{"body": ...}`` or ``{"messages": [...]}``, each with an optional channel ``role``."""
    if isinstance(data, dict) and "messages" in data:
        data = _object(data, "the batch", frozenset({"messages", "role"}))
        items = data["messages"]
        if not isinstance(items, list) or not 1 <= len(items) <= max_batch:
            raise bad_request(f"messages must be a list of 1..{max_batch} message objects")
        msgs = [parse_message(m, f"messages[{i}].") for i, m in enumerate(items)]
    else:
        data = _object(data, "the message", MESSAGE_KEYS | {"role"})
        msgs = [parse_message({k: v for k, v in data.items() if k != "role"}, "")]
    role = data.get("role")
    if role is not None and role not in ("server", "client"):
        raise bad_request("role must be 'server' or 'client'")
    return msgs, role if dest.kind is Kind.CHANNEL else None  # other kinds have no roles


def parse_message(obj: Any, where: str) -> Message:
    d = _object(obj, f"message {where.rstrip('.') or ''}".strip(), MESSAGE_KEYS)
    body = d.get("body")
    if not isinstance(body, str):
        raise bad_request(f"{where}body is required and must be a string")
    encoding = d.get("encoding")
    if encoding is None:
        encoding = "utf8"
    if encoding == "utf8":
        raw = body.encode("utf-8")
    elif encoding == "base64":
        try:
            if not _BASE64_RE.fullmatch(body):
                raise ValueError
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(
                f"{where}body is not valid base64 (RFC 4648, no line breaks)"
            ) from None
    else:
        raise bad_request(f"{where}encoding must be 'utf8' or 'base64'")
    default_ct = _TEXT_DEFAULT if encoding == "utf8" else _BINARY_DEFAULT
    content_type = _text(d, "content_type", where, MAX_CONTENT_TYPE)
    headers = d.get("headers")
    if headers is None:
        headers = {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise bad_request(f"{where}headers must be an object of string values")
    headers = dict(public_headers(headers))  # (the AMQP frontend's own: a client cannot set them)
    priority = d.get("priority")
    priority = Message(b"").priority if priority is None else _as_int(priority)
    if priority is None or not 0 <= priority <= 9:
        raise bad_request(f"{where}priority must be an integer 0..9")
    persistent = d.get("persistent")
    if persistent is not None and not isinstance(persistent, bool):
        raise bad_request(f"{where}persistent must be true or false")
    ttl = _seconds(d, "ttl", where)
    return Message(
        body=raw,
        content_type=content_type or default_ct,
        headers=dict(headers),
        priority=priority,
        persistent=bool(persistent),
        expires=time.time() + ttl if ttl is not None else None,
        ack_timeout=_seconds(d, "ack_timeout", where),
        correlation_id=_text(d, "correlation_id", where),
        reply_to=_text(d, "reply_to", where),
    )


# ---- pull, ack, nack ---------------------------------------------------------------------------
def _query_value(query: MultiMapping[str], key: str) -> str | None:
    values = query.getall(key, [])
    if len(values) > 1:
        raise bad_request(f"query parameter {key!r} is given more than once")
    return values[0] if values else None


def query_value(request: web.Request, key: str) -> str | None:
    """The one value of query parameter ``key`` (None if absent; 400 if repeated)."""
    return _query_value(request.query, key)


def no_query(request: web.Request, allowed: frozenset[str] = frozenset()) -> None:
    """400 if the query string has a parameter not in ``allowed``."""
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise bad_request(f"unknown query parameter(s): {shown}")


def parse_pull_query(
    request: web.Request, max_pull: int, max_wait: float
) -> tuple[int, float, float]:
    no_query(request, frozenset({"max", "wait", "visibility"}))
    q = request.query
    raw_max = _query_value(q, "max")
    try:
        n = 1 if raw_max is None else int(raw_max)
    except ValueError:
        raise bad_request(f"max must be an integer 1..{max_pull}") from None
    if not 1 <= n <= max_pull:
        raise bad_request(f"max must be an integer 1..{max_pull}")
    wait = _query_number(q, "wait", 0.0)
    if not 0 <= wait <= max_wait:
        raise bad_request(f"wait must be 0..{max_wait:g} seconds")
    vis = _query_number(q, "visibility", 30.0)
    if not 0 < vis <= MAX_VISIBILITY:
        raise bad_request(f"visibility must be > 0 and <= {MAX_VISIBILITY:g} seconds")
    return n, wait, vis


def _query_number(q: MultiMapping[str], key: str, default: float) -> float:
    raw = _query_value(q, key)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise bad_request(f"{key} must be a number of seconds") from None
    if not math.isfinite(v):
        raise bad_request(f"{key} must be a number of seconds")
    return v


def parse_settle(data: Any, max_batch: int, *, nack: bool) -> tuple[list[str], bool]:
    keys = frozenset({"receipts", "requeue"} if nack else {"receipts"})
    d = _object(data, "the body", keys)
    receipts = d.get("receipts")
    if (
        not isinstance(receipts, list)
        or not 1 <= len(receipts) <= max_batch
        or not all(isinstance(r, str) and 1 <= len(r) <= MAX_TEXT for r in receipts)
    ):
        raise bad_request(f"receipts must be a list of 1..{max_batch} receipt strings")
    requeue = d.get("requeue")
    if requeue is None:
        requeue = True
    if not isinstance(requeue, bool):
        raise bad_request("requeue must be true or false")
    return receipts, requeue


def lease_json(lease: Lease, schemas: SchemaCache | None = None) -> dict[str, Any]:
    """A pulled message as JSON (:func:`polymq_server.messages.jsonview.message_json`), its receipt
    first."""
    return {"receipt": lease.receipt, **message_json(lease.message, schemas)}


# ---- declare, metadata -------------------------------------------------------------------------
def parse_declare(data: Any) -> dict[str, Any]:
    """Declare options (``DeclareOptions`` keys; a null value means the default)."""
    d = _object(data, "the declare options", DeclareOptions.KEYS - {DECLARER})
    out: dict[str, Any] = {}
    durable = d.get("durable")
    if durable is not None:
        if not isinstance(durable, bool):
            raise bad_request("durable must be true or false")
        out["durable"] = durable
    for key in ("max_length", "max_bytes", "max_deliveries"):
        if (n := _count(d, key, "")) is not None:
            out[key] = n
    for key in ("idle_ttl", "ack_timeout", "message_ttl"):
        if (s := _seconds(d, key, "")) is not None:
            out[key] = s
    if (v := d.get("max_priority")) is not None:
        top = _as_int(v)
        if top is None or not 0 <= top <= MAX_PRIORITY:
            raise bad_request(f"max_priority must be an integer 0..{MAX_PRIORITY}")
        out["max_priority"] = top
    overflow = d.get("overflow")
    if overflow is not None:
        if overflow not in ("reject", "drop-oldest"):
            raise bad_request("overflow must be 'reject' or 'drop-oldest'")
        out["overflow"] = overflow
    dl = d.get("dead_letter")
    if dl is not None:
        if not isinstance(dl, str):
            raise bad_request("dead_letter must be a destination such as 'queue/dead'")
        out["dead_letter"] = dl
    DeclareOptions.from_dict(out)  # the core's own checks (dead_letter's kind and name)
    return out


def parse_metadata(data: Any) -> dict[str, str]:
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise bad_request("metadata must be a JSON object of string values")
    if len(data) > MAX_METADATA_KEYS:
        raise bad_request(f"metadata is limited to {MAX_METADATA_KEYS} keys")
    if sum(len(k) + len(v) for k, v in data.items()) > MAX_METADATA_BYTES:
        raise bad_request(f"metadata is limited to {MAX_METADATA_BYTES} characters in all")
    return dict(data)
