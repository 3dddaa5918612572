"""The schema registry: subjects and versions, schema evolution under each compatibility rule
(decided by Apache Avro's checker), schemas by id, per-subject and server-wide rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polymq_server.messages.avro import schema_id

from ...procs import PolymqProcess
from .conftest import Avro, assert_problem, container, unique


def user(*extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "Account",
        "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}, *extra],
    }


V1 = user()
V2 = user({"name": "plan", "type": "string", "default": "free"})  # a field with a default
NO_DEFAULT = user({"name": "plan", "type": "string"})  # V2 without its default: V2's id
NEW_FIELD = user(
    {"name": "plan", "type": "string", "default": "free"}, {"name": "age", "type": "int"}
)
NAME_AS_INT = {
    "type": "record",
    "name": "Account",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "int"}],
}


def versions(api: Avro, subject: str) -> list[int]:
    r = api.get(f"/v1/schemas/subjects/{subject}/versions")
    assert r.status_code == 200, r.text
    out: list[int] = r.json()
    return out


def test_schema_evolution(api: Avro) -> None:
    subject = unique("acct")
    r = api.register(subject, V1)
    assert r.status_code == 200 and r.json() == {"id": schema_id(V1), "version": 1}
    # the same schema again (as text, spelled otherwise): the same id and version
    r = api.register(subject, json.dumps(V1, indent=2))
    assert r.status_code == 200 and r.json() == {"id": schema_id(V1), "version": 1}

    r = api.register(subject, V2)  # backward compatible: the new field has a default
    assert r.status_code == 200 and r.json() == {"id": schema_id(V2), "version": 2}
    assert versions(api, subject) == [1, 2]

    for bad in (NEW_FIELD, NAME_AS_INT):  # a field without default, a changed type
        problem = assert_problem(api.register(subject, bad), 409, "incompatible-schema")
        assert problem["messages"] and all("version 2" in m for m in problem["messages"])
        assert versions(api, subject) == [1, 2]  # nothing registered
        assert_problem(api.get(f"/v1/schemas/ids/{schema_id(bad)}"), 404, "unknown-schema")

    latest = api.get(f"/v1/schemas/subjects/{subject}/versions/latest").json()
    assert latest == {
        "subject": subject,
        "version": 2,
        "id": schema_id(V2),
        "schema": latest["schema"],
    }
    assert json.loads(latest["schema"]) == V2
    one = api.get(f"/v1/schemas/subjects/{subject}/versions/1").json()
    assert one["id"] == schema_id(V1) and json.loads(one["schema"]) == V1
    by_id = api.get(f"/v1/schemas/ids/{schema_id(V2)}").json()
    assert by_id["id"] == schema_id(V2) and json.loads(by_id["schema"]) == V2
    assert subject in api.get("/v1/schemas/subjects").json()


def test_compatibility_check(api: Avro) -> None:
    subject = unique("chk")
    api.register(subject, V1)
    path = f"/v1/schemas/compatibility/subjects/{subject}/versions/latest"
    ok = api.post(path, json={"schema": V2}).json()
    assert ok == {"is_compatible": True, "messages": []}
    bad = api.post(path, json={"schema": NO_DEFAULT}).json()
    assert bad["is_compatible"] is False and "plan" in " ".join(bad["messages"])
    assert versions(api, subject) == [1]  # checking registers nothing
    assert_problem(api.post(f"/v1/schemas/compatibility/subjects/{unique()}/versions/latest",
                            json={"schema": V1}), 404)  # fmt: skip


def test_rules_per_subject(api: Avro) -> None:
    subject = unique("rule")
    assert api.get(f"/v1/schemas/config/{subject}").json() == {"compatibility": "BACKWARD"}
    assert api.get("/v1/schemas/config").json() == {"compatibility": "BACKWARD"}
    r = api.put(f"/v1/schemas/config/{subject}", json={"compatibility": "FORWARD"})
    assert r.status_code == 200 and r.json() == {"compatibility": "FORWARD"}
    assert api.get(f"/v1/schemas/config/{subject}").json() == {"compatibility": "FORWARD"}
    assert versions(api, subject) == []  # a subject with a rule and no schema yet
    api.register(subject, V2)
    # FORWARD: the latest reads the new one; dropping a field with a default is fine...
    assert api.register(subject, V1).status_code == 200
    # ...a changed type is not
    assert_problem(api.register(subject, NAME_AS_INT), 409)
    api.put(f"/v1/schemas/config/{subject}", json={"compatibility": "NONE"})
    assert api.register(subject, NAME_AS_INT).json()["version"] == 3
    assert_problem(api.put(f"/v1/schemas/config/{subject}", json={"compatibility": "SOME"}), 400)
    assert_problem(api.put(f"/v1/schemas/config/{subject}", json={"level": "NONE"}), 400)


def test_transitive_rules(api: Avro) -> None:
    """v1 has no plan, v2 adds it with a default, v3 drops the default: v3 reads v2's data
    but not v1's; BACKWARD lets it in, BACKWARD_TRANSITIVE does not."""
    for rule, status in (("BACKWARD", 200), ("BACKWARD_TRANSITIVE", 409)):
        subject = unique("tr")
        api.put(f"/v1/schemas/config/{subject}", json={"compatibility": rule})
        api.register(subject, V1)
        api.register(subject, V2)
        assert api.register(subject, NO_DEFAULT).status_code == status


def test_a_dropped_default_is_a_new_version_with_the_same_id(api: Avro) -> None:
    """Defaults are not part of the canonical form, so V2 and V2-without-default share an
    id (their data is the same bytes); the subject still keeps each version's own JSON."""
    assert schema_id(NO_DEFAULT) == schema_id(V2)
    subject = unique("dd")
    api.register(subject, V2)
    r = api.register(subject, NO_DEFAULT)
    assert r.status_code == 200 and r.json() == {"id": schema_id(V2), "version": 2}
    assert api.register(subject, NO_DEFAULT).json()["version"] == 2  # again: the same version
    assert api.register(subject, V2).json()["version"] == 1
    two = api.get(f"/v1/schemas/subjects/{subject}/versions/2").json()
    assert json.loads(two["schema"]) == NO_DEFAULT
    one = api.get(f"/v1/schemas/subjects/{subject}/versions/1").json()
    assert json.loads(one["schema"]) == V2
    # the id shows the first schema stored under it
    by_id = api.get(f"/v1/schemas/ids/{schema_id(V2)}").json()
    assert json.loads(by_id["schema"]) == V2
    # the rule checks against the latest version's own JSON
    assert_problem(api.register(subject, NEW_FIELD), 409)


def test_invalid_schemas_and_requests(api: Avro) -> None:
    subject = unique("inv")
    for bad in ({"type": "record", "name": "R"}, {"type": "nope"}, "{not json", ["int", "int"],
                {"type": "record", "name": "R", "fields": [{"name": "x", "type": "int",
                                                              "default": "s"}]}):  # fmt: skip
        assert_problem(api.register(subject, bad), 422, "invalid-schema")
    assert_problem(api.post(f"/v1/schemas/subjects/{subject}/versions", json={"x": 1}), 400)
    assert_problem(api.post(f"/v1/schemas/subjects/{subject}/versions", data=b"{"), 400)
    assert_problem(api.get(f"/v1/schemas/subjects/{subject}/versions"), 404)
    assert_problem(api.register("bad subject!", V1), 400)
    api.register(subject, V1)
    assert_problem(api.get(f"/v1/schemas/subjects/{subject}/versions/2"), 404)
    assert_problem(api.get(f"/v1/schemas/subjects/{subject}/versions/two"), 400)
    assert_problem(api.get("/v1/schemas/ids/not-an-id"), 404)


def test_publishing_under_a_subject_registers_and_evolves(api: Avro) -> None:
    """``?subject=`` registers the container's schema (or checks it against the subject);
    records of both versions read back as JSON, each decoded with its own schema."""
    subject, queue = unique("pub"), f"queue/{unique('pub')}"
    one = api.published(queue, container([{"id": 1, "name": "a"}], schema=V1), subject=subject)
    assert one["subject"] == subject and one["version"] == 1
    two = api.published(
        queue, container([{"id": 2, "name": "b", "plan": "pro"}], schema=V2), subject=subject
    )
    assert two["version"] == 2 and two["schema_id"] == schema_id(V2)
    assert versions(api, subject) == [1, 2]
    r = api.get(f"/v1/{queue}/records", params={"max": 10}, headers={"Accept": "application/json"})
    values = [rec["value"] for rec in r.json()["records"]]
    assert values == [{"id": 1, "name": "a"}, {"id": 2, "name": "b", "plan": "pro"}]


@pytest.fixture(scope="module")
def lenient(server: PolymqProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Avro]:
    """``polymq avro`` on the module's core with POLYMQ_AVRO_COMPATIBILITY=NONE."""
    workdir: Path = tmp_path_factory.mktemp("avro-none")
    core = f"127.0.0.1:{server.ports['core']}"
    env = {"POLYMQ_AVRO_COMPATIBILITY": "NONE"}
    with PolymqProcess("avro", workdir, "--core", core, env=env) as proc:
        yield Avro(proc)
        assert proc.stop() == 0, proc.log()


def test_the_server_default_rule(lenient: Avro, api: Avro) -> None:
    assert lenient.get("/v1/schemas/config").json() == {"compatibility": "NONE"}
    subject = unique("dflt")
    lenient.register(subject, V1)
    assert lenient.register(subject, NAME_AS_INT).status_code == 200
    # a subject's own rule wins over either server's default
    strict = unique("strict")
    lenient.put(f"/v1/schemas/config/{strict}", json={"compatibility": "FULL"})
    lenient.register(strict, V1)
    assert_problem(lenient.register(strict, NAME_AS_INT), 409)
    assert api.get(f"/v1/schemas/config/{strict}").json() == {"compatibility": "FULL"}
