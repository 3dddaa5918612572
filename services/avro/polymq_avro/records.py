"""A POSTed body as validated records, and records as messages (sans-IO).

A body is sniffed by its first bytes: ``Obj`` 0x01 is an object container file (its
schema travels in it), ``C3 01`` a run of single-object encoded records, each naming its
schema by fingerprint (whose schema the caller finds among the registered ones, see
:class:`NeedSchema`). Every record is decoded against its schema before anything is
published, and each becomes one message whose body is the record in the single-object
encoding and whose ``avro-schema-id`` header is its schema's id (the fingerprint alone does
not tell schemas apart that differ in logical types).
Records of a schema that could nest without bound (a recursive one) are walked with a depth
bound before fastavro reads them (``polymq_server.messages.avro.check_bounds``): one nested too
deeply is refused, 422.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastavro import schemaless_reader

from polymq import Message
from polymq_server.messages.avro import (
    CONTENT_TYPE,
    HEADER_SIZE,
    MAGIC,
    SCHEMA_ID_HEADER,
    AvroError,
    AvroSchema,
    DecodeError,
    check_bounds,
    parse,
    read_header,
)

from . import container
from .compat import apache_schema
from .container import TooLarge, Truncated

__all__ = [
    "BodyKind",
    "NeedSchema",
    "NotAvro",
    "Records",
    "batch_digest",
    "decode_container",
    "messages",
    "sniff",
    "split_single",
]


class BodyKind(enum.Enum):
    CONTAINER = "container"
    SINGLE = "single"


class NotAvro(AvroError):
    code = "not-avro"
    status = 422


class NeedSchema(Exception):
    """A record has a fingerprint that ``lookup`` has no schema for: find it, try again."""

    def __init__(self, fingerprint: str) -> None:
        super().__init__(fingerprint)
        self.fingerprint = fingerprint


@dataclass(eq=False)
class Records:
    """Validated records: each one's single-object body and schema id, and the schemas."""

    kind: BodyKind
    bodies: list[bytes] = field(repr=False)
    ids: list[str] = field(repr=False)
    schemas: dict[str, AvroSchema]  # in the order of first use

    @property
    def count(self) -> int:
        return len(self.bodies)

    @property
    def size(self) -> int:
        return sum(map(len, self.bodies))


def sniff(body: bytes) -> BodyKind:
    if body.startswith(container.MAGIC):
        return BodyKind.CONTAINER
    if body.startswith(MAGIC):
        return BodyKind.SINGLE
    if not body:
        raise NotAvro("the body is empty: send an Avro object container or single-object records")
    if container.MAGIC.startswith(body) or MAGIC.startswith(body):
        raise Truncated("the body ends inside its magic bytes")
    raise NotAvro(
        "the body is neither an Avro object container file (magic 'Obj' 0x01) nor "
        "single-object encoded records (magic C3 01)"
    )


def decode_container(body: bytes, *, max_records: int, max_decoded: int) -> Records:
    """Every record of a container, checked against the container's schema."""
    c = container.read_container(body, max_records=max_records, max_decoded=max_decoded)
    text = c.schema_json
    schema = _parse_writer(text) if len(text) <= _CACHED_SCHEMA_SIZE else _check_writer(text)
    datums = container.split_records(c, schema)
    header = schema.header
    return Records(
        BodyKind.CONTAINER,
        [header + d for d in datums],
        [schema.id] * len(datums),
        {schema.id: schema},
    )


_CACHED_SCHEMA_SIZE = 64 * 1024  # characters: longer schema texts are parsed every time


def _check_writer(text: str) -> AvroSchema:
    schema = parse(text)
    apache_schema(schema.json)  # the registry keeps only schemas both parsers accept
    return schema


# A container's schema, parsed once a text: a writer sends the same one again and again, and
# parsing and fingerprinting it costs as much as splitting a few hundred small records.
_parse_writer = functools.lru_cache(maxsize=256)(_check_writer)


def split_single(
    body: bytes,
    lookup: Callable[[str], AvroSchema | None],
    *,
    max_records: int,
) -> Records:
    """Single-object records laid end to end, each decoded with the schema ``lookup`` gives
    for its header's fingerprint; NeedSchema for a fingerprint ``lookup`` has no schema for
    (find it, then call again)."""
    bodies: list[bytes] = []
    ids: list[str] = []
    schemas: dict[str, AvroSchema] = {}
    by_fingerprint: dict[str, AvroSchema] = {}
    stream = io.BytesIO(body)
    pos = 0
    while pos < len(body):
        if len(bodies) >= max_records:
            raise TooLarge(f"more than {max_records} records in one request; send fewer")
        try:
            sid = read_header(body, pos)
        except DecodeError as exc:
            rest = body[pos : pos + 2]
            if rest == MAGIC or MAGIC.startswith(rest):
                raise Truncated(f"record {len(bodies)}: {exc.message}") from None
            raise DecodeError(f"record {len(bodies)}: {exc.message}") from None
        schema = by_fingerprint.get(sid) or lookup(sid)
        if schema is None:
            raise NeedSchema(sid)
        by_fingerprint[sid] = schema
        schemas.setdefault(schema.id, schema)
        stream.seek(pos + HEADER_SIZE)
        try:
            check_bounds(body, pos + HEADER_SIZE, schema)  # before fastavro's C reader
            schemaless_reader(stream, schema.plain, None)
        except EOFError:
            raise Truncated(
                f"the body ends inside record {len(bodies)} (at byte {pos}, schema {schema.id})"
            ) from None
        except Exception as exc:
            detail = str(exc).strip() or type(exc).__name__
            raise DecodeError(
                f"record {len(bodies)} (at byte {pos}) is not valid for schema {schema.id}: "
                f"{detail[:200]}"
            ) from None
        end = stream.tell()
        bodies.append(body[pos:end])
        ids.append(schema.id)
        pos = end
    return Records(BodyKind.SINGLE, bodies, ids, schemas)


def messages(
    records: Records,
    *,
    persistent: bool = False,
    priority: int | None = None,
    ttl: float | None = None,
) -> list[Message]:
    """One message per record: the single-object body, ``avro/binary`` and its id."""
    headers = {sid: {SCHEMA_ID_HEADER: sid} for sid in records.schemas}
    expires = time.time() + ttl if ttl is not None else None
    prio = Message(b"").priority if priority is None else priority
    if len(headers) == 1:
        [shared] = headers.values()  # shared, never changed: the codec only reads it
        return [Message(b, CONTENT_TYPE, shared, prio, persistent, expires) for b in records.bodies]
    return [
        Message(b, CONTENT_TYPE, headers[sid], prio, persistent, expires)
        for b, sid in zip(records.bodies, records.ids, strict=True)
    ]


def batch_digest(records: Records, persistent: bool, priority: int | None) -> str:
    """What a retry repeats: the records (whatever container or codec carried them) and the
    options that shape their messages. 32 hex characters."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{int(persistent)}:{priority}:{records.count}\n".encode())
    for b in records.bodies:
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()
