"""The schema registry: schemas by id, and subjects (named, versioned lines of schemas, each
new version checked for compatibility with the earlier ones).

Nothing lives here: every schema and subject is in the core's key/value store, so any
replica of this frontend answers for all of them::

    avro/schemas/<id>          the schema's full JSON (the first one stored under that id)
    avro/fingerprints/<fingerprint>/<id>   (empty) the ids that share a Rabin fingerprint
    avro/subjects/<subject>    {"versions": [<id of version 1>, <id of version 2>, ...],
                                "compatibility": "BACKWARD" | ... | null (the server default)}
    avro/versions/<subject>/<n>  version n's own full JSON

A schema id is the SHA-256 of the schema's Parsing Canonical Form with its logical types
and their attributes kept (``polymq_server.messages.avro``): schemas that differ only in defaults,
docs or aliases share an id (their records read the same) and the first one stored under it
is what ``/ids/<id>`` shows; a logical type, a decimal's precision or scale make another
id, so no one can change how another's records read. A subject keeps each version's own
JSON, because defaults decide compatibility: dropping a field's default is a new version
(with the same id) that the rule must allow. Registering a schema that is already a version
(the same JSON, keys in any order) answers that version.

Single-object records carry only the Rabin fingerprint of the Parsing Canonical Form, which
leaves logical types out (``decimal(12,2)`` and ``decimal(12,6)`` share it), so a POST of
them finds each record's schema by :meth:`Registry.resolve`: among the ids the request
names, else the versions of the subject it names, else the one schema stored with that
fingerprint; several are refused (:class:`AmbiguousSchema`) rather than guessed between.

Schemas stored before ids were digests are under ``avro/schemas/<fingerprint>`` (and
subjects list those fingerprints as ids); they are still read (``/ids/<fingerprint>``, a
subject's versions, messages without an id in their ``avro-schema-id`` header) and never
written. A version read or registered again is stored under its id too.

Registration reads the subject, checks and writes it back. Within one process a lock per
subject serializes that; two replicas registering under one subject at the same moment can
still race (the core has no compare-and-set yet) and one version may be lost.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from polymq import Client
from polymq.errors import BadRequest, Conflict, NotFound
from polymq_server.messages.avro import (
    KV_FINGERPRINTS,
    KV_SCHEMAS,
    AvroSchema,
    InvalidSchema,
    SchemaCache,
    UnknownSchema,
    is_digest,
    parse,
)

from .compat import Compatibility, apache_schema, incompatibilities

__all__ = [
    "SUBJECTS",
    "VERSIONS",
    "AmbiguousSchema",
    "IncompatibleSchema",
    "Registry",
    "Subject",
    "check_subject",
    "parse_schema_body",
]

T = TypeVar("T")

SUBJECTS = "avro/subjects/"
VERSIONS = "avro/versions/"
_SUBJECT_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,255}\Z")


class IncompatibleSchema(Conflict):
    """409: the schema breaks the subject's compatibility rule; ``messages`` say where."""

    code = "incompatible-schema"

    def __init__(self, subject: str, rule: Compatibility, messages: list[str]) -> None:
        super().__init__(
            f"the schema is not {rule.value} compatible with subject {subject!r}: "
            + "; ".join(messages[:5])
        )
        self.messages = messages


class AmbiguousSchema(Conflict):
    """409: several registered schemas have a record's fingerprint and nothing says which."""

    code = "ambiguous-schema"

    def __init__(self, fingerprint: str, count: int) -> None:
        super().__init__(
            f"{count} registered schemas have fingerprint {fingerprint} (they differ in what "
            "the fingerprint leaves out: logical types and their attributes, defaults, docs): "
            "name yours with ?schema_id=<its id, as registering it answered> or "
            "?subject=<a subject it is a version of>, or send an object container"
        )
        self.fingerprint = fingerprint


def check_subject(name: str) -> str:
    if not _SUBJECT_RE.match(name):
        raise BadRequest(
            f"subject {name[:80]!r} must be 1..255 letters, digits, '_', '.', ':' or '-'"
        )
    return name


@dataclass
class Subject:
    versions: list[str] = field(default_factory=list)  # schema ids, version n at [n - 1]
    compatibility: Compatibility | None = None

    def encode(self) -> bytes:
        level = None if self.compatibility is None else self.compatibility.value
        return json.dumps({"versions": self.versions, "compatibility": level}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Subject:
        data = json.loads(raw)
        level = data.get("compatibility")
        return cls(
            [str(v) for v in data.get("versions", [])],
            None if level is None else Compatibility(level),
        )


Call = Callable[[Callable[[Client], Awaitable[Any]]], Awaitable[Any]]


class Registry:
    """Schemas and subjects in the core's key/value store (``call`` runs a request on the
    shared client, as ``CoreLink.call``)."""

    def __init__(self, call: Call, cache: SchemaCache, default: Compatibility) -> None:
        self.call = call
        self.cache = cache
        self.default = default
        self._locks: dict[str, asyncio.Lock] = {}

    # ---- schemas by id -------------------------------------------------------------------
    async def schema(self, sid: str) -> AvroSchema:
        """The schema stored under ``sid`` (UnknownSchema, a 404, if none)."""
        return await self.cache.get(sid)

    async def store(self, schema: AvroSchema) -> AvroSchema:
        """Make sure a schema is stored under its id and listed under its fingerprint; the
        stored one (the first wins: it reads records as ``schema`` does)."""
        held = self.cache.cached(schema.id)
        if held is not None:
            return held
        key = KV_SCHEMAS + schema.id
        stored: AvroSchema | None
        try:
            stored = parse(await self.call(lambda c: c.kv_get(key)))
        except (NotFound, InvalidSchema):
            stored = None
        if stored is None or stored.id != schema.id:  # absent, or written by hand
            await self.call(lambda c: c.kv_put(key, schema.json.encode()))
            stored = schema
        listed = f"{KV_FINGERPRINTS}{schema.rabin}/{schema.id}"
        await self.call(lambda c: c.kv_put(listed, b""))  # after the schema: never dangling
        self.cache.put(stored)
        return stored

    async def resolve(
        self, fingerprint: str, named: tuple[str, ...] = (), subject: str | None = None
    ) -> AvroSchema:
        """The schema of a single-object record with this fingerprint: the first of the ids
        ``named`` with it, else the latest version of ``subject`` with it, else the one
        stored schema with it (UnknownSchema if none, AmbiguousSchema if several)."""
        for sid in named:
            schema = await self.schema(sid)
            if schema.rabin == fingerprint:
                return schema
        if subject is not None:
            found = await self.subject(subject)
            for n, sid in reversed(list(enumerate(found.versions if found else [], 1))):
                if is_digest(sid):
                    schema = await self.schema(sid)
                elif sid == fingerprint:  # a version registered before ids were digests
                    schema = parse(await self.version_json(subject, n, sid))
                else:
                    continue
                if schema.rabin == fingerprint:
                    return await self.store(schema)
        candidates = await self.with_fingerprint(fingerprint)
        if len(candidates) > 1:
            raise AmbiguousSchema(fingerprint, len(candidates))
        if not candidates:
            raise UnknownSchema(fingerprint, f"no registered schema has fingerprint {fingerprint}")
        return candidates[0]

    async def with_fingerprint(self, fingerprint: str) -> list[AvroSchema]:
        """Every stored schema with this fingerprint (by id, and the one stored under the
        fingerprint before ids were digests), each once."""
        prefix = f"{KV_FINGERPRINTS}{fingerprint}/"
        keys: list[str] = await self.call(lambda c: c.kv_list(prefix, 100))
        found: dict[str, AvroSchema] = {}
        for sid in [k[len(prefix) :] for k in keys] + [fingerprint]:
            try:
                schema = await self.schema(sid)
            except (UnknownSchema, InvalidSchema):
                continue
            if schema.rabin == fingerprint:
                found.setdefault(schema.id, schema)
        return list(found.values())

    # ---- subjects ------------------------------------------------------------------------
    async def subjects(self) -> list[str]:
        keys: list[str] = await self.call(lambda c: c.kv_list(SUBJECTS))
        return [k[len(SUBJECTS) :] for k in keys]

    async def subject(self, name: str) -> Subject | None:
        check_subject(name)
        try:
            raw: bytes = await self.call(lambda c: c.kv_get(SUBJECTS + name))
        except NotFound:
            return None
        try:
            return Subject.decode(raw)
        except (ValueError, TypeError, AttributeError):
            raise Conflict(f"subject {name!r} is stored damaged in the core") from None

    async def existing(self, name: str) -> Subject:
        subject = await self.subject(name)
        if subject is None:
            raise NotFound(f"no subject {name!r}")
        return subject

    async def _save(self, name: str, subject: Subject) -> None:
        await self.call(lambda c: c.kv_put(SUBJECTS + name, subject.encode()))

    def rule(self, subject: Subject | None) -> Compatibility:
        if subject is None or subject.compatibility is None:
            return self.default
        return subject.compatibility

    async def version_json(self, name: str, n: int, sid: str) -> str:
        """The JSON of version ``n`` (of id ``sid``) of a subject."""
        try:
            raw: bytes = await self.call(lambda c: c.kv_get(f"{VERSIONS}{name}/{n}"))
        except NotFound:  # written by hand, or lost: the schema stored under its id
            return (await self.schema(sid)).json
        return raw.decode("utf-8")

    async def version(self, name: str, ref: str) -> tuple[int, AvroSchema]:
        """Version ``ref`` (a number from 1, or ``latest``) of a subject and its schema."""
        subject = await self.existing(name)
        if ref == "latest":
            n = len(subject.versions)
        elif ref.isascii() and ref.isdigit() and len(ref) < 10:
            n = int(ref)
        else:
            raise BadRequest("a version is a number from 1, or 'latest'")
        if not 1 <= n <= len(subject.versions):
            raise NotFound(f"subject {name!r} has no version {ref[:20]}")
        schema = parse(await self.version_json(name, n, subject.versions[n - 1]))
        if not is_digest(subject.versions[n - 1]):  # from before ids were digests
            await self.store(schema)  # so that /ids/<the id answered> finds it
        return n, schema

    async def problems(self, name: str, schema: AvroSchema, subject: Subject | None) -> list[str]:
        """Why ``schema`` may not be the next version of ``subject``, under its rule."""
        rule = self.rule(subject)
        apache_schema(schema.json)
        if subject is None or rule is Compatibility.NONE or not subject.versions:
            return []
        numbered = list(enumerate(subject.versions, 1))
        needed = numbered if rule.transitive else numbered[-1:]
        texts = await asyncio.gather(*(self.version_json(name, n, sid) for n, sid in needed))
        versions = [n for n, _ in needed]
        return incompatibilities(rule, schema.json, list(zip(versions, texts, strict=True)))

    async def existing_version(self, name: str, schema: AvroSchema, subject: Subject) -> int:
        """The version of ``subject`` that is ``schema`` (its JSON, keys in any order), or 0."""
        ids = (schema.id, schema.rabin)  # the fingerprint: a version from before digests
        same = [(n, sid) for n, sid in enumerate(subject.versions, 1) if sid in ids]
        if not same:
            return 0
        texts = await asyncio.gather(*(self.version_json(name, n, sid) for n, sid in same))
        wanted = _normal(schema.json)
        return next((n for (n, _), t in zip(same, texts, strict=True) if _normal(t) == wanted), 0)

    async def check(self, name: str, schema: AvroSchema) -> list[str]:
        return await self.problems(name, schema, await self.existing(name))

    async def register(self, name: str, schema: AvroSchema) -> tuple[int, bool]:
        """Add ``schema`` to a subject (made if new): its version, and whether it is new.
        IncompatibleSchema (409) if the subject's rule refuses it; nothing changes then."""
        check_subject(name)
        apache_schema(schema.json)  # InvalidSchema before anything is stored
        async with self._lock(name):
            subject = await self.subject(name)
            if subject is not None:
                n = await self.existing_version(name, schema, subject)
                if n:
                    await self.store(schema)  # a version from before digests: under its id
                    return n, False
            messages = await self.problems(name, schema, subject)
            if messages:
                raise IncompatibleSchema(name, self.rule(subject), messages)
            await self.store(schema)
            subject = subject if subject is not None else Subject()
            n = len(subject.versions) + 1
            text = schema.json.encode()
            await self.call(lambda c: c.kv_put(f"{VERSIONS}{name}/{n}", text))
            subject.versions.append(schema.id)
            await self._save(name, subject)  # last: a version is listed once its JSON is there
            return n, True

    async def set_rule(self, name: str, rule: Compatibility) -> None:
        check_subject(name)
        async with self._lock(name):
            subject = await self.subject(name) or Subject()
            subject.compatibility = rule
            await self._save(name, subject)

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            if len(self._locks) > 10_000:  # drop the idle ones
                for k in [k for k, v in self._locks.items() if not v.locked()]:
                    del self._locks[k]
            lock = self._locks[name] = asyncio.Lock()
        return lock


def _normal(text: str) -> str:
    """Schema JSON with object keys sorted (field and symbol order stay: they matter)."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def parse_schema_body(data: Any) -> AvroSchema:
    """``{"schema": <JSON text or the schema itself>}`` as a parsed schema (422 if no schema
    both fastavro and Apache Avro accept)."""
    if not isinstance(data, dict) or "schema" not in data:
        raise BadRequest('the body must be {"schema": <the schema, as JSON text or JSON>}')
    unknown = sorted(set(data) - {"schema", "schemaType"})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(repr(k[:40]) for k in unknown[:5])}")
    kind = data.get("schemaType", "AVRO")
    if kind != "AVRO":
        raise BadRequest("schemaType must be AVRO (the only kind this registry keeps)")
    raw = data["schema"]
    if not isinstance(raw, str | dict | list):
        raise InvalidSchema("schema must be JSON text, an object or a list")
    schema = parse(raw)
    apache_schema(schema.json)
    return schema
