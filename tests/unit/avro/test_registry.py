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
from polymq_avro.registry import IncompatibleSchema, Registry, Subject
from polymq_server.avro import SchemaCache, UnknownSchema, parse


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

    async def kv_list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.kv if k.startswith(prefix))

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
