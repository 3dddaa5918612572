"""Query strings, headers and JSON of the Avro API: what a POST of records may ask for, how
a read negotiates its answer (an Avro container or JSON), stream offsets, and records as
JSON. Checks that every JSON frontend makes (pull parameters, settling, JSON bodies) are
shared, imported from ``polymq_server.web.payloads``.
"""

from __future__ import annotations

import base64
import datetime
import math
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from polymq import Message
from polymq_server.messages.avro import (
    AvroSchema,
    DecodeError,
    decode_single,
    is_digest,
    message_schema_id,
    to_json_value,
)
from polymq_server.messages.headers import public_headers
from polymq_server.web.payloads import MAX_SECONDS, no_query, query_value
from polymq_server.web.problems import Problem, bad_request

__all__ = [
    "ACCEPTED_TYPES",
    "CONTAINER_TYPES",
    "JSON_TYPE",
    "PublishOptions",
    "check_content_type",
    "idempotency_key",
    "negotiate",
    "no_query",
    "parse_offset",
    "parse_publish_query",
    "parse_read_query",
    "query_value",
    "record_json",
]

# what a POST of records may be sent as (the body is sniffed either way)
ACCEPTED_TYPES = frozenset(
    {
        "avro/binary",
        "application/avro",
        "application/vnd.apache.avro+binary",
        "application/octet-stream",
    }
)
CONTAINER_TYPES = ("avro/binary", "application/avro", "application/vnd.apache.avro+binary")
JSON_TYPE = "application/json"
PUBLISH_QUERY = frozenset({"persistent", "priority", "ttl", "subject", "schema_id"})
MAX_SCHEMA_IDS = 16  # ids one POST may name
MAX_KEY = 200  # characters of an Idempotency-Key
_KEY_RE = re.compile(r"[\x21-\x7e]+\Z")  # visible ASCII


# ---- publishing ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PublishOptions:
    persistent: bool = False
    priority: int | None = None
    ttl: float | None = None
    subject: str | None = None
    schema_ids: tuple[str, ...] = ()  # the schemas single-object records are of


def parse_publish_query(request: web.Request) -> PublishOptions:
    no_query(request, PUBLISH_QUERY)
    raw = query_value(request, "persistent")
    if raw is None or raw.lower() in ("false", "0", "no"):
        persistent = False
    elif raw.lower() in ("true", "1", "yes", ""):
        persistent = True
    else:
        raise bad_request("persistent must be true or false")
    priority = None
    raw = query_value(request, "priority")
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and 0 <= int(raw) <= 9):
            raise bad_request("priority must be an integer 0..9")
        priority = int(raw)
    ttl = None
    raw = query_value(request, "ttl")
    if raw is not None:
        try:
            ttl = float(raw)
        except ValueError:
            ttl = math.nan
        if not (math.isfinite(ttl) and 0 < ttl <= MAX_SECONDS):
            raise bad_request(f"ttl must be a number of seconds > 0 and <= {MAX_SECONDS}")
    subject = query_value(request, "subject")
    if subject is not None and not subject:
        raise bad_request("subject must not be empty")
    raw = query_value(request, "schema_id")
    ids = tuple(raw.split(",")) if raw is not None else ()
    if len(ids) > MAX_SCHEMA_IDS or not all(map(is_digest, ids)):
        raise bad_request(
            f"schema_id must be 1 to {MAX_SCHEMA_IDS} schema ids (64 lowercase hex digits each, "
            "as registering answered), separated by commas"
        )
    return PublishOptions(persistent, priority, ttl, subject, ids)


def check_content_type(request: web.Request) -> None:
    """Avro (or octet-stream) bodies only; none given is fine (the body is sniffed)."""
    ctype = request.headers.get("Content-Type")
    if ctype is None:
        return
    media = ctype.split(";", 1)[0].strip().lower()
    if media not in ACCEPTED_TYPES:
        raise Problem(
            415,
            f"send Avro as {', '.join(sorted(ACCEPTED_TYPES))}, not {ctype[:80]!r}",
            code="unsupported-media-type",
        )


def idempotency_key(request: web.Request) -> str | None:
    """``Idempotency-Key`` (or ``X-Batch-Id``): 1..200 visible ASCII characters."""
    key = request.headers.get("Idempotency-Key")
    other = request.headers.get("X-Batch-Id")
    if key is not None and other is not None and key != other:
        raise bad_request("Idempotency-Key and X-Batch-Id differ: send one of them")
    key = key if key is not None else other
    if key is None:
        return None
    key = key.strip().strip('"')
    if not 1 <= len(key) <= MAX_KEY or not _KEY_RE.match(key):
        raise bad_request(f"Idempotency-Key must be 1..{MAX_KEY} visible ASCII characters")
    return key


# ---- reading -------------------------------------------------------------------------------
def negotiate(accept: str | None) -> str:
    """The media type to answer a read with, from ``Accept``: an Avro container (the
    default) or JSON; 406 if the client takes neither."""
    if accept is None or not accept.strip():
        return CONTAINER_TYPES[0]
    best_rank: tuple[float, int, int] | None = None
    best_media = CONTAINER_TYPES[0]
    for index, item in enumerate(accept.split(",")):
        media, *params = (p.strip() for p in item.split(";"))
        media = media.lower()
        q = 1.0
        for p in params:
            name, _, value = p.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if not 0 < q <= 1:
            continue
        if media in CONTAINER_TYPES or media == JSON_TYPE:
            chosen = media
        elif media in ("*/*", "avro/*"):
            chosen = CONTAINER_TYPES[0]
        elif media == "application/*":
            chosen = "application/avro"
        else:
            continue
        # the highest q wins; between equals, a type named outright beats a wildcard, and
        # then the client's order
        rank = (q, 0 if "*" in media else 1, -index)
        if best_rank is None or rank > best_rank:
            best_rank, best_media = rank, chosen
    if best_rank is None:
        raise Problem(
            406,
            f"records can be read as {', '.join(CONTAINER_TYPES)} (an Avro object container) "
            f"or {JSON_TYPE}",
            code="not-acceptable",
        )
    return best_media


def parse_read_query(request: web.Request, max_pull: int, max_wait: float) -> tuple[int, float]:
    raw = query_value(request, "max")
    try:
        n = 100 if raw is None else int(raw)
    except ValueError:
        raise bad_request(f"max must be an integer 1..{max_pull}") from None
    if not 1 <= n <= max_pull:
        raise bad_request(f"max must be an integer 1..{max_pull}")
    raw = query_value(request, "wait")
    try:
        wait = 0.0 if raw is None else float(raw)
    except ValueError:
        wait = math.nan
    if not (math.isfinite(wait) and 0 <= wait <= max_wait):
        raise bad_request(f"wait must be 0..{max_wait:g} seconds")
    return n, wait


def parse_offset(raw: str | None) -> str | int:
    """A stream offset: ``first`` (the default), ``last``, ``next``, a sequence number, or a
    time: unix seconds with a decimal point or an ``@`` (``1700000000.0``, ``@1700000000``),
    or ISO 8601 (``2024-05-01T12:00:00Z``). Times are given to the core as ``@<seconds>``."""
    if raw is None:
        return "first"
    text = raw.strip()
    if text in ("first", "last", "next"):
        return text
    if text.isascii() and text.isdigit() and len(text) <= 19:
        return int(text)
    seconds: float | None = None
    try:
        if text.startswith("@"):
            seconds = float(text[1:])
        elif re.fullmatch(r"\d+\.\d*", text):
            seconds = float(text)
        elif re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ].*)?", text):
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.UTC)
            seconds = when.timestamp()
    except ValueError:
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise bad_request(
            "offset must be first, last, next, a sequence number, or a time (unix seconds "
            "with a decimal point or a leading @, or ISO 8601)"
        )
    return f"@{seconds!r}"


# ---- records as JSON ---------------------------------------------------------------------------
def record_json(message: Message, schema: AvroSchema | None, receipt: str | None) -> dict[str, Any]:
    """One message as JSON: its record as ``value`` when it is Avro of a known schema, else
    ``value`` null and the body in base64 (and ``error`` saying why, for Avro)."""
    out: dict[str, Any] = {
        "value": None,
        "schema_id": None,
        "seq": message.seq,
        "id": message.id,
    }
    if receipt is not None:
        out["receipt"] = receipt
    out["headers"] = public_headers(message.headers)
    out["redelivered"] = message.redelivered
    out["timestamp"] = message.timestamp
    out["content_type"] = message.content_type
    error = None
    sid = message_schema_id(message)
    if sid is not None:
        out["schema_id"] = sid
        if schema is None:
            error = f"schema {out['schema_id']} is not registered"
        else:
            try:
                out["value"] = _value(message.body, schema)
                return out
            except DecodeError as exc:
                error = exc.message
            except Exception as exc:  # never fail a read over one message: show its bytes
                error = (
                    f"the record cannot be shown as JSON: {str(exc)[:300] or type(exc).__name__}"
                )
    out["body"] = base64.b64encode(message.body).decode("ascii")
    if error is not None:
        out["error"] = error
    return out


def _value(body: bytes, schema: AvroSchema) -> Any:
    try:
        return to_json_value(decode_single(body, schema))
    except (DecodeError, TypeError, ValueError, OverflowError):
        # a value a logical type cannot hold (a date past year 9999...): the plain Avro value
        return to_json_value(decode_single(body, schema, logical=False))
