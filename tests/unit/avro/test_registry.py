"""The registry's logic (``polymq_avro.registry``) over an in-memory key/value store that
answers as the core does (no sockets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polymq.errors import BadRequest, NotFound
from polymq_avro.compat import Compatibility
from polymq_avro.registry import AmbiguousSchema, IncompatibleSchema, Registry, Subject
from polymq_server.messages.avro import SchemaCache, UnknownSchema, parse


class FakeCore:
    """``kv_get``, ``kv_put``, ``kv_list`` as the core answers them."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.puts: list[str] = []

    async def kv_get(self, key: str) -> bytes:
        await asyncio.sleep(0)
        if key not in self.kv:
            raise NotFound(f"no value under {key!r}")
        return self.kv[key]

    async def kv_put(self, key: str, value: bytes) -> None:
        await asyncio.sleep(0)
        self.kv[key] = value
        self.puts.append(key)

    async def kv_list(self, prefix: str = "", limit: int = 10_000) -> list[str]:
        return sorted(k for k in self.kv if k.startswith(prefix))[:limit]

    async def call(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        return await fn(self)


def registry(default: Compatibility = Compatibility.BACKWARD) -> tuple[Registry, FakeCore]:
    core = FakeCore()
    return Registry(core.call, SchemaCache(core.kv_get), default), core


def record(*fields: dict[str, Any], name: str = "R") -> Any:
    return parse({"type": "record", "name": name, "fields": list(fields)})


A = {"name": "a", "type": "long"}
V1 = record(A)
V2 = record(A, {"name": "b", "type": "string", "default": ""})
V2_NO_DEFAULT = record(A, {"name": "b", "type": "string"})


async def test_register_stores_the_layout_the_other_frontends_read() -> None:
    reg, core = registry()
    assert await reg.register("s", V1) == (1, True)
    assert await reg.register("s", V2) == (2, True)
    assert json.loads(core.kv["avro/subjects/s"]) == {
        "versions": [V1.id, V2.id],
        "compatibility": None,
    }
    assert core.kv[f"avro/schemas/{V1.id}"] == V1.json.encode()
    assert core.kv["avro/versions/s/2"] == V2.json.encode()
    assert core.puts.index("avro/versions/s/2") < len(core.puts) - 1  # the subject is last
    assert core.puts[-1] == "avro/subjects/s"
    assert await reg.subjects() == ["s"]


async def test_the_same_schema_again_is_the_same_version() -> None:
    reg, core = registry()
    await reg.register("s", V1)
    again = parse(json.dumps({"fields": [A], "name": "R", "type": "record"}))  # other key order
    assert await reg.register("s", again) == (1, False)
    assert json.loads(core.kv["avro/subjects/s"])["versions"] == [V1.id]


async def test_a_schema_sharing_an_id_is_a_version_of_its_own() -> None:
    reg, _ = registry()
    assert V2.id == V2_NO_DEFAULT.id
    await reg.register("s", V2)
    assert await reg.register("s", V2_NO_DEFAULT) == (2, True)
    n, got = await reg.version("s", "2")
    assert n == 2 and "default" not in got.json
    n, got = await reg.version("s", "1")
    assert n == 1 and '"default"' in got.json
    assert (await reg.schema(V2.id)).json == V2.json  # the id: the first stored


def _decimal(scale: int, name: str = "Price") -> Any:
    d = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": scale}
    return record({"name": "amount", "type": d}, name=name)


async def test_a_fingerprint_resolves_to_the_schema_named_else_the_one_stored() -> None:
    """Single-object records carry a fingerprint that decimal(12,2) and decimal(12,6) share:
    the schema is the one the request names (by id, or by subject), else the only one
    stored with that fingerprint; with two stored and none named, nothing is guessed."""
    reg, _ = registry()
    two, six = _decimal(2), _decimal(6)
    fp = two.rabin
    assert six.rabin == fp and two.id != six.id
    with pytest.raises(UnknownSchema):
        await reg.resolve(fp)
    await reg.register("six-value", six)
    assert (await reg.resolve(fp)).id == six.id  # the only one
    await reg.register("two-value", two)
    with pytest.raises(AmbiguousSchema) as info:
        await reg.resolve(fp)
    assert info.value.status == 409 and "?schema_id=" in info.value.message
    assert (await reg.resolve(fp, (two.id,))).id == two.id
    await reg.register("other", V1)
    assert (await reg.resolve(fp, (V1.id, six.id))).id == six.id  # the first with it
    assert (await reg.resolve(fp, subject="two-value")).id == two.id
    assert (await reg.resolve(fp, subject="six-value")).id == six.id
    with pytest.raises(AmbiguousSchema):
        await reg.resolve(fp, subject="no-such-subject")
    with pytest.raises(UnknownSchema):
        await reg.resolve(fp, (V2.id,))  # named but never stored


async def test_what_was_stored_before_ids_were_digests_still_reads() -> None:
    """The layout of before: the schema under its fingerprint, the subject listing the
    fingerprint. Its versions read (and are then stored under their id), registering it
    again is the same version, and a record with its fingerprint resolves to it."""
    reg, core = registry()
    six = _decimal(6)
    core.kv[f"avro/schemas/{six.rabin}"] = six.json.encode()
    core.kv["avro/subjects/old"] = json.dumps({"versions": [six.rabin]}).encode()
    core.kv["avro/versions/old/1"] = six.json.encode()
    assert (await reg.schema(six.rabin)).id == six.id
    assert (await reg.resolve(six.rabin)).id == six.id
    n, got = await reg.version("old", "latest")
    assert n == 1 and got.id == six.id
    assert core.kv[f"avro/schemas/{six.id}"] == six.json.encode()  # now under its id too
    assert await reg.register("old", six) == (1, False)
    assert (await reg.resolve(six.rabin, subject="old")).id == six.id
    await reg.register("new", _decimal(2))
    with pytest.raises(AmbiguousSchema):  # the old one and a new one share the fingerprint
        await reg.resolve(six.rabin)


async def test_an_incompatible_schema_changes_nothing() -> None:
    reg, core = registry()
    await reg.register("s", V1)
    before = dict(core.kv)
    bad = record(A, {"name": "c", "type": "int"})
    with pytest.raises(IncompatibleSchema) as info:
        await reg.register("s", bad)
    assert info.value.status == 409 and info.value.messages
    assert core.kv == before
    with pytest.raises(UnknownSchema):
        await reg.schema(bad.id)


async def test_rules() -> None:
    reg, _ = registry(Compatibility.NONE)
    await reg.register("s", V1)
    changed = record({"name": "a", "type": "string"})
    assert await reg.check("s", changed) == []
    await reg.set_rule("s", Compatibility.FULL)
    assert reg.rule(await reg.subject("s")) is Compatibility.FULL
    assert await reg.check("s", changed) != []
    await reg.set_rule("fresh", Compatibility.FORWARD)
    fresh = await reg.existing("fresh")
    assert fresh == Subject([], Compatibility.FORWARD)


async def test_versions_and_subjects_that_do_not_exist() -> None:
    reg, _ = registry()
    with pytest.raises(NotFound):
        await reg.version("nope", "latest")
    await reg.register("s", V1)
    for ref, error in (("2", NotFound), ("0", NotFound), ("x", BadRequest), ("-1", BadRequest)):
        with pytest.raises(error):
            await reg.version("s", ref)
    with pytest.raises(BadRequest):
        await reg.register("bad/name", V1)


async def test_concurrent_registrations_in_one_process_are_serialized() -> None:
    reg, core = registry(Compatibility.NONE)
    schemas = [record({"name": f"f{i}", "type": "int"}) for i in range(10)]
    got = await asyncio.gather(*(reg.register("s", s) for s in schemas))
    assert sorted(n for n, _ in got) == list(range(1, 11))
    assert len(json.loads(core.kv["avro/subjects/s"])["versions"]) == 10
