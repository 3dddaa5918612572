"""Avro messages: schema ids, single-object encoding, a schema cache, and records as JSON.

A message carries one Avro record in Avro's **single-object encoding**: the two bytes
``C3 01``, the schema's 8-byte CRC-64-AVRO (Rabin) fingerprint, little-endian, as Avro's
Java implementation writes it, then the record's binary encoding. Its content type is
``avro/binary`` and its header ``avro-schema-id`` names the schema by its id.

No client data reaches fastavro's C reader (which recurses on the C stack without a limit)
unbounded: :func:`parse` refuses schemas nested too deeply or holding a record that always
contains itself, and data of a schema that could nest deeper than its schema (a recursive
one) or hold items that take no bytes is walked first, in pure Python, with a depth bound
(:mod:`polymq_server.messages.avrobounds` says what and why). Callers that read data with fastavro
themselves call :func:`check_bounds` first.

A schema's **id** is the SHA-256 of its Parsing Canonical Form with its logical types kept
(each with its attributes: a decimal's precision and scale...), 64 lowercase hex characters:
spellings of one schema, and schemas that differ only in docs, aliases or defaults, share it
(their records read the same). The **fingerprint** in the body (16 hex characters here) is
the CRC-64-AVRO of the Parsing Canonical Form itself, which leaves logical types out:
schemas that differ there share a fingerprint, and the body alone cannot tell
``decimal(12,2)`` from ``decimal(12,6)``. So a message is read with the schema its
``avro-schema-id`` header names, whose fingerprint must be the body's; only a message
without such a header (one stored before ids were digests, whose header was the
fingerprint) is read with the schema stored under its fingerprint, as it was then.

Schemas live in the core's key/value store, the full JSON under ``avro/schemas/<id>`` (the
first one stored; a schema is checked against its key when read, so nobody can change how
the records of an id read) and an index ``avro/fingerprints/<fingerprint>/<id>`` (empty values) of
the schemas sharing a fingerprint; ``avro/schemas/<fingerprint>`` holds a schema stored
before, read and never written. :class:`SchemaCache` loads and keeps them, parsed, for every
frontend that shows Avro messages (the Avro frontend reads and writes them, HTTP and STOMP
can show them as JSON with :func:`to_json_value`).

Sans-IO but for :class:`SchemaCache`, whose loader is handed in (a coroutine that reads a
key of the core). Errors form one tree, each a :class:`polymq.errors.RequestError` with the
HTTP status and word a frontend answers with::

    AvroError               422 avro           anything below
     ├── InvalidSchema      422 invalid-schema  not a valid Avro schema
     ├── UnknownSchema      404 unknown-schema  no schema with this id is stored
     └── DecodeError        422 invalid-record  bytes that are not a record of their schema

Whatever fastavro raises is translated into these at this boundary.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
import hashlib
import io
import json
import math
import re
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from fastavro.validation import validate

from polymq.errors import NotFound, RequestError
from polymq.types import Message

from .avrobounds import Shape, check_json_depth, shape, walk

__all__ = [
    "AVRO_CONTENT_TYPES",
    "CONTENT_TYPE",
    "HEADER_SIZE",
    "KV_FINGERPRINTS",
    "KV_SCHEMAS",
    "MAGIC",
    "SCHEMA_ID_HEADER",
    "AvroError",
    "AvroSchema",
    "DecodeError",
    "InvalidSchema",
    "SchemaCache",
    "UnknownSchema",
    "check_bounds",
    "decode_single",
    "encode_single",
    "is_avro",
    "is_digest",
    "is_schema_id",
    "message_schema_id",
    "parse",
    "read_datum",
    "read_header",
    "schema_id",
    "single_object_header",
    "to_json_value",
]

MAGIC = b"\xc3\x01"  # the single-object encoding's marker
HEADER_SIZE = 10  # the marker and the 8-byte fingerprint
CONTENT_TYPE = "avro/binary"
# media types that name Avro binary data (a message's content type is one of these)
AVRO_CONTENT_TYPES = frozenset(
    {"avro/binary", "application/avro", "application/vnd.apache.avro+binary"}
)
SCHEMA_ID_HEADER = "avro-schema-id"
KV_SCHEMAS = "avro/schemas/"  # + id: the schema's full JSON (+ fingerprint: one stored before)
KV_FINGERPRINTS = "avro/fingerprints/"  # + fingerprint/id: the ids that share a fingerprint

_DIGEST_RE = re.compile(r"[0-9a-f]{64}\Z")
_FINGERPRINT_RE = re.compile(r"[0-9a-f]{16}\Z")


# ---- errors ----------------------------------------------------------------------------
class AvroError(RequestError):
    """Avro data or a schema was refused."""

    code = "avro"
    status = 422


class InvalidSchema(AvroError):
    code = "invalid-schema"
    status = 422


class UnknownSchema(AvroError):
    code = "unknown-schema"
    status = 404

    def __init__(self, schema_id: str, message: str = "") -> None:
        super().__init__(message or f"no Avro schema with id {schema_id[:70]!r} is registered")
        self.schema_id = schema_id


class DecodeError(AvroError):
    code = "invalid-record"
    status = 422


# ---- schemas ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class AvroSchema:
    """One parsed schema: its id (the digest of its full JSON), its Rabin fingerprint (16
    hex characters), its full JSON (as stored), fastavro's parsed forms (``parsed`` with
    logical types, ``plain`` without: the pure Avro data), and what its data may do
    (``shape``: whether it must be walked before fastavro reads it)."""

    id: str
    rabin: str
    json: str
    canonical: str
    parsed: Any = field(repr=False)
    plain: Any = field(repr=False)
    shape: Shape = field(repr=False)

    @property
    def fingerprint(self) -> bytes:
        """The 8 bytes of the single-object header (``rabin``, decoded)."""
        return bytes.fromhex(self.rabin)

    @property
    def header(self) -> bytes:
        return MAGIC + self.fingerprint


def _load_json(schema: str | bytes | Mapping[str, Any] | list[Any]) -> Any:
    if isinstance(schema, bytes | bytearray):
        try:
            schema = bytes(schema).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidSchema("the schema is not UTF-8 text") from None
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except RecursionError:
            raise InvalidSchema("the schema is nested too deeply") from None
        except ValueError:
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", schema):
                return schema  # a bare type name, e.g. int or com.example.Thing
            raise InvalidSchema("the schema is not JSON") from None
    if isinstance(schema, Mapping):
        return dict(schema)
    if isinstance(schema, list):
        return list(schema)
    raise InvalidSchema("a schema is JSON: a type name, an object or a list (a union)")


def parse(schema: str | bytes | Mapping[str, Any] | list[Any] | AvroSchema) -> AvroSchema:
    """Parse a schema (JSON text, or JSON already decoded); InvalidSchema if it is none, or
    if it is nested too deeply or has a record that always contains itself
    (:func:`polymq_server.messages.avrobounds.shape`)."""
    if isinstance(schema, AvroSchema):
        return schema
    obj = _load_json(schema)
    try:
        check_json_depth(obj)  # before anything recurses over it
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        stripped = _strip_logical(obj)
        parsed = parse_schema(obj, named_schemas={})
        plain = parse_schema(stripped, named_schemas={})
        form = shape(plain)
        canonical = to_parsing_canonical_form(parsed)
        fp = fingerprint(canonical, "CRC-64-AVRO")
        identity = json.dumps(_identity(parsed), separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise InvalidSchema("the schema is nested too deeply") from None
    except Exception as exc:  # fastavro raises ValueError, KeyError, TypeError, its own...
        raise InvalidSchema(f"not a valid Avro schema: {_describe(exc)}") from None
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()
    return AvroSchema(
        id=digest,
        rabin=fp,
        json=text,
        canonical=canonical,
        parsed=parsed,
        plain=plain,
        shape=form,
    )


def schema_id(schema: str | bytes | Mapping[str, Any] | list[Any] | AvroSchema) -> str:
    """The id of a schema: the SHA-256 of its Parsing Canonical Form with logical types
    kept (:func:`_identity`), as 64 lowercase hex characters. Spellings of one schema share
    it, and so do schemas that differ in docs, aliases and defaults (their records read the
    same); a logical type or one of its attributes (a decimal's precision or scale) makes
    another id."""
    return parse(schema).id


# the attributes the Parsing Canonical Form keeps, in its order
_CANONICAL_KEYS = ("name", "type", "fields", "symbols", "items", "values", "size")
# what neither form keeps: none of it changes how a record reads
_DROPPED_KEYS = frozenset({"doc", "aliases", "default", "order", "namespace"})
_COMPLEX = frozenset({"record", "error", "enum", "array", "map", "fixed"})


def _identity(node: Any) -> Any:
    """A schema parsed by fastavro (full names resolved) in Avro's Parsing Canonical Form,
    but for logical types: a node with a ``logicalType`` keeps it and its other attributes
    (``precision``, ``scale``...), after the canonical ones, in sorted order."""
    if isinstance(node, list):
        return [_identity(n) for n in node]
    if not isinstance(node, dict):
        return node
    kind = node["type"]
    logical: dict[str, Any] = {}
    if "logicalType" in node:
        logical = {
            k: node[k]
            for k in sorted(node)
            if k not in _CANONICAL_KEYS and k not in _DROPPED_KEYS and not k.startswith("__")
        }
    if kind not in _COMPLEX:  # a primitive, a name, or a type wrapped in {"type": ...}
        inner = _identity(kind)
        return {"type": inner, **logical} if logical else inner
    out: dict[str, Any] = {}
    for key in _CANONICAL_KEYS:
        if key not in node:
            continue
        value = node[key]
        if key == "fields":
            value = [{"name": f["name"], "type": _identity(f["type"])} for f in value]
        elif key in ("items", "values"):
            value = _identity(value)
        out[key] = value
    return {**out, **logical}


def is_digest(text: object) -> bool:
    """Whether ``text`` is a schema id as made now: 64 lowercase hex characters."""
    return isinstance(text, str) and _DIGEST_RE.match(text) is not None


def is_schema_id(text: object) -> bool:
    """Whether ``text`` names a stored schema: an id (64 hex characters), or the fingerprint
    (16) a schema stored before ids were digests is kept under."""
    return is_digest(text) or (isinstance(text, str) and _FINGERPRINT_RE.match(text) is not None)


def _strip_logical(node: Any) -> Any:
    """``node`` without ``logicalType`` annotations (defaults and other values untouched)."""
    if isinstance(node, list):
        return [_strip_logical(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if k != "logicalType"}
    kind = out.get("type")
    if kind in ("record", "error") and isinstance(out.get("fields"), list):
        out["fields"] = [
            {**f, "type": _strip_logical(f["type"])} if isinstance(f, dict) and "type" in f else f
            for f in out["fields"]
        ]
    elif kind == "array" and "items" in out:
        out["items"] = _strip_logical(out["items"])
    elif kind == "map" and "values" in out:
        out["values"] = _strip_logical(out["values"])
    elif isinstance(kind, dict | list):
        out["type"] = _strip_logical(kind)
    return out


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# ---- single-object encoding ------------------------------------------------------------
def single_object_header(schema: AvroSchema | str) -> bytes:
    """``C3 01`` and the fingerprint of ``schema`` (or a fingerprint, 16 hex characters)."""
    fp = schema.rabin if isinstance(schema, AvroSchema) else schema
    if not (isinstance(fp, str) and _FINGERPRINT_RE.match(fp)):
        raise UnknownSchema(fp, f"{fp[:40]!r} is not a fingerprint (16 lowercase hex digits)")
    return MAGIC + bytes.fromhex(fp)


def encode_single(schema: AvroSchema | Any, datum: Any) -> bytes:
    """``datum`` in the single-object encoding of ``schema``; DecodeError if it does not
    match the schema."""
    s = parse(schema)
    out = io.BytesIO()
    out.write(s.header)
    try:
        validate(datum, s.parsed, raise_errors=True)  # the writer does not check ranges
        schemaless_writer(out, s.parsed, datum, strict=True)
    except Exception as exc:
        raise DecodeError(f"the value does not match schema {s.id}: {_describe(exc)}") from None
    return out.getvalue()


def read_header(data: bytes | memoryview, pos: int = 0) -> str:
    """The fingerprint (16 hex characters) of the single-object record at ``data[pos:]``;
    DecodeError if there is no single-object header there."""
    head = bytes(data[pos : pos + HEADER_SIZE])
    if len(head) < HEADER_SIZE or head[:2] != MAGIC:
        if head[:2] == MAGIC or (len(head) < 2 and MAGIC.startswith(head)):
            raise DecodeError(f"truncated single-object header at byte {pos}")
        raise DecodeError(f"no single-object header (C3 01) at byte {pos}")
    return head[2:].hex()


def check_bounds(data: bytes, pos: int, schema: AvroSchema) -> None:
    """Before fastavro reads the datum of ``schema`` at ``data[pos:]``: walk it if its schema
    lets it nest deeper than the schema, or hold items that take no bytes, raising (as
    fastavro would: ``ValueError``, ``EOFError``) where it breaks a bound
    (:mod:`polymq_server.messages.avrobounds`). Data of other schemas passes untouched."""
    if schema.shape.walk:
        walk(data, pos, schema.plain, schema.shape.named)


def read_datum(
    data: bytes, pos: int, schema: AvroSchema, *, logical: bool = True
) -> tuple[Any, int]:
    """Decode one binary datum of ``schema`` at ``data[pos:]``; the datum and where it
    ends. ``logical``: convert logical types (dates, decimals...), else plain Avro values.
    Its bounds are checked first (:func:`check_bounds`)."""
    stream = io.BytesIO(data)
    stream.seek(pos)
    try:
        check_bounds(data, pos, schema)
        datum = schemaless_reader(stream, schema.parsed if logical else schema.plain, None)
    except Exception as exc:
        raise DecodeError(
            f"the record at byte {pos} is not valid for schema {schema.id}: {_describe(exc)}"
        ) from None
    return datum, stream.tell()


def decode_single(
    data: bytes, schema: AvroSchema | Callable[[str], AvroSchema], *, logical: bool = True
) -> Any:
    """The record in one single-object encoded ``data``. ``schema`` is the schema, or a
    function from fingerprint to schema (raising UnknownSchema); DecodeError if the header
    has another fingerprint, the bytes do not decode, or bytes are left over."""
    fp = read_header(data)
    s = schema(fp) if callable(schema) else schema
    if s.rabin != fp:
        raise DecodeError(
            f"the record's fingerprint is {fp}, not that of schema {s.id} ({s.rabin})"
        )
    datum, end = read_datum(bytes(data), HEADER_SIZE, s, logical=logical)
    if end != len(data):
        raise DecodeError(f"{len(data) - end} byte(s) after the record")
    return datum


def is_avro(message: Message) -> bool:
    """Whether ``message`` holds an Avro record in the single-object encoding (an Avro
    content type and the single-object header)."""
    media = message.content_type.split(";", 1)[0].strip().lower()
    body = message.body
    return media in AVRO_CONTENT_TYPES and len(body) >= HEADER_SIZE and body[:2] == MAGIC


def message_schema_id(message: Message) -> str | None:
    """What names the schema of an Avro message (None if it is not Avro): the id in its
    ``avro-schema-id`` header, else (a message stored before ids were digests) the
    fingerprint in its body, under which such a message's schema was stored."""
    if not is_avro(message):
        return None
    named = message.headers.get(SCHEMA_ID_HEADER)
    if is_digest(named):
        return str(named)
    return bytes(message.body[2:HEADER_SIZE]).hex()


# ---- the schema cache ------------------------------------------------------------------
Fetch = Callable[[str], Awaitable[bytes]]


class SchemaCache:
    """Parsed schemas by id (or by the fingerprint of one stored before ids were digests),
    loaded from the core's key/value store on a miss (LRU).

    ``fetch(key)`` reads a key of the core (``Client.kv_get``, or a frontend's wrapper
    around its shared client) and raises :class:`polymq.errors.NotFound` when it is absent.
    Concurrent loads of one id share one fetch. A schema is immutable under its id, so an
    entry never goes stale; unknown ids are not remembered (they may be registered later).
    """

    def __init__(self, fetch: Fetch, maxsize: int = 1024) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.fetch = fetch
        self.maxsize = maxsize
        self._entries: OrderedDict[str, AvroSchema] = OrderedDict()
        self._loading: dict[str, asyncio.Future[AvroSchema]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sid: object) -> bool:
        return sid in self._entries

    def cached(self, sid: str) -> AvroSchema | None:
        """The schema if it is held (no I/O), else None."""
        s = self._entries.get(sid)
        if s is not None:
            self._entries.move_to_end(sid)
            self.hits += 1
        return s

    def put(self, schema: AvroSchema, key: str | None = None) -> None:
        """Hold ``schema`` (which its caller has stored under its id, or ``key``)."""
        key = schema.id if key is None else key
        self._entries[key] = schema
        self._entries.move_to_end(key)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    async def get(self, sid: str) -> AvroSchema:
        """The schema with id ``sid``; UnknownSchema if none is stored (or ``sid`` is no
        id); a corrupt stored schema is an InvalidSchema."""
        s = self.cached(sid)
        if s is not None:
            return s
        if not is_schema_id(sid):
            raise UnknownSchema(sid, f"{sid[:40]!r} is not a schema id (64 lowercase hex digits)")
        loading = self._loading.get(sid)
        if loading is None:
            self.misses += 1
            loading = asyncio.ensure_future(self._load(sid))
            self._loading[sid] = loading
            loading.add_done_callback(lambda f: self._loaded(sid, f))
        return await asyncio.shield(loading)

    def _loaded(self, sid: str, fut: asyncio.Future[AvroSchema]) -> None:
        self._loading.pop(sid, None)
        if not fut.cancelled():
            fut.exception()  # retrieved: every waiter may have gone (cancelled) meanwhile

    async def _load(self, sid: str) -> AvroSchema:
        try:
            raw = await self.fetch(KV_SCHEMAS + sid)
        except NotFound:
            raise UnknownSchema(sid) from None
        s = parse(raw)
        if sid not in (s.id, s.rabin):  # an id is its digest; an old key, its fingerprint
            raise InvalidSchema(f"the schema stored under {sid} has the id {s.id}")
        self.put(s, sid)
        return s


# ---- records as JSON -------------------------------------------------------------------
def to_json_value(datum: Any) -> Any:
    """A decoded Avro value as JSON-able data: bytes and fixed as base64 strings, decimals
    as strings (exact), dates and times in ISO 8601, UUIDs as strings, and the floats JSON
    cannot hold as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if datum is None or isinstance(datum, bool | int | str):
        return datum
    if isinstance(datum, float):
        if math.isfinite(datum):
            return datum
        return "NaN" if math.isnan(datum) else "Infinity" if datum > 0 else "-Infinity"
    if isinstance(datum, dict):
        return {str(k): to_json_value(v) for k, v in datum.items()}
    if isinstance(datum, list | tuple):
        return [to_json_value(v) for v in datum]
    if isinstance(datum, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(datum)).decode("ascii")
    if isinstance(datum, decimal.Decimal):
        return str(datum)
    if isinstance(datum, datetime.datetime | datetime.date | datetime.time):
        return datum.isoformat()
    if isinstance(datum, uuid.UUID):
        return str(datum)
    raise TypeError(f"not an Avro value: {type(datum).__name__}")
