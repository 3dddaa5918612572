"""The schema registry: schemas by id, and subjects (named, versioned lines of schemas, each
new version checked for compatibility with the earlier ones).

Nothing lives here: every schema and subject is in the core's key/value store, so any
replica of this frontend answers for all of them::

    avro/schemas/<id>          the schema's full JSON (the first one stored under that id)
    avro/subjects/<subject>    {"versions": [<id of version 1>, <id of version 2>, ...],
                                "compatibility": "BACKWARD" | ... | null (the server default)}
    avro/versions/<subject>/<n>  version n's own full JSON

A schema id is the fingerprint of the Parsing Canonical Form, which leaves out defaults,
docs, aliases and logical types: schemas that differ only in those share an id (their binary
data is the same), and the first one stored under it is what ``/ids/<id>`` and readers see.
A subject keeps each version's own JSON, because defaults decide compatibility: dropping a
field's default is a new version (with the same id) that the rule must allow. Registering a
schema that is already a version (the same JSON, keys in any order) answers that version.

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
from polymq_server.avro import KV_SCHEMAS, AvroSchema, InvalidSchema, SchemaCache, parse

from .compat import Compatibility, apache_schema, incompatibilities

__all__ = [
    "SUBJECTS",
    "VERSIONS",
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
        """Make sure a schema is stored under its id; the stored one (the first wins)."""
        held = self.cache.cached(schema.id)
        if held is not None:
            return held
        try:
            raw: bytes = await self.call(lambda c: c.kv_get(KV_SCHEMAS + schema.id))
        except NotFound:
            await self.call(lambda c: c.kv_put(KV_SCHEMAS + schema.id, schema.json.encode()))
            self.cache.put(schema)
            return schema
        stored = parse(raw)
        if stored.id != schema.id:  # somebody wrote the key by hand: keep what is right
            await self.call(lambda c: c.kv_put(KV_SCHEMAS + schema.id, schema.json.encode()))
            stored = schema
        self.cache.put(stored)
        return stored

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
        return n, parse(await self.version_json(name, n, subject.versions[n - 1]))

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
        same = [n for n, sid in enumerate(subject.versions, 1) if sid == schema.id]
        if not same:
            return 0
        texts = await asyncio.gather(*(self.version_json(name, n, schema.id) for n in same))
        wanted = _normal(schema.json)
        return next((n for n, t in zip(same, texts, strict=True) if _normal(t) == wanted), 0)

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
