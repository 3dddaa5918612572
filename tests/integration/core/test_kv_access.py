"""``polymq core --auth file:users.json`` with narrow grants on the key/value store: read on the
schema registry's keys only, read and write on one AMQP vhost's topology keys only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from polymq import Forbidden, NotFound
from polymq_server.auth.provider import hash_password

from ...procs import PolymqProcess, serving
from .helpers import connect

GRANTS = {
    "admin": [{"pattern": "*", "permissions": ["read", "write", "configure"]}],
    # a consumer that fetches schemas to decode records
    "schemas": [{"pattern": "kv/avro/*", "permissions": ["read"]}],
    # an AMQP frontend that serves the vhost "prod" only (and beats as an instance)
    "amqp-prod": [
        {"pattern": "kv/amqp/?/prod/*", "permissions": ["read", "write"]},
        {"pattern": "kv/amqp/i/*", "permissions": ["read", "write"]},
    ],
}

SCHEMA = "avro/schemas/0123abcd"
PROD = ["amqp/x/prod/orders", "amqp/q/prod/work", "amqp/b/prod/work/orders/d1"]
TEST = ["amqp/x/test/orders", "amqp/b/test/work/orders/d1"]


def users_file(path: Path, grants: dict[str, list[dict[str, object]]]) -> Path:
    users = {
        name: {"password_hash": hash_password("pw"), "grants": g} for name, g in grants.items()
    }
    path.write_text(json.dumps({"users": users}))
    return path


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir = tmp_path_factory.mktemp("kv-access")
    users = users_file(workdir / "users.json", GRANTS)
    with serving("core", workdir / "core", "--auth", f"file:{users}") as proc:
        yield proc


async def test_read_on_the_registry_keys_only(core: PolymqProcess) -> None:
    port = core.ports["core"]
    async with await connect(port, user="admin", password="pw") as admin:
        await admin.kv_put(SCHEMA, b'{"type": "string"}')
        await admin.kv_put("avro/subjects/orders", b"{}")
        await admin.kv_put("secrets/db", b"hunter2")
    async with await connect(port, user="schemas", password="pw") as reader:
        assert await reader.kv_get(SCHEMA) == b'{"type": "string"}'
        assert SCHEMA in await reader.kv_list("avro/schemas/")
        assert "avro/subjects/orders" in await reader.kv_list("avro/")
        with pytest.raises(NotFound):
            await reader.kv_get("avro/schemas/absent")  # allowed, and not there
        with pytest.raises(Forbidden, match="user 'schemas' has no write permission"):
            await reader.kv_put(SCHEMA, b"{}")
        with pytest.raises(Forbidden, match="no write permission"):
            await reader.kv_delete("avro/subjects/orders")
        with pytest.raises(Forbidden, match="no read permission on 'kv/secrets/db'"):
            await reader.kv_get("secrets/db")
        for prefix in ("", "a", "secrets/"):  # each would list keys outside avro/
            with pytest.raises(Forbidden, match=f"no read permission on 'kv/{prefix}\\*'"):
                await reader.kv_list(prefix)
        await reader.ping()  # refusals end no connection
    async with await connect(port, user="admin", password="pw") as admin:
        assert await admin.kv_get(SCHEMA) == b'{"type": "string"}'  # the refused put wrote nothing
        assert await admin.kv_get("avro/subjects/orders") == b"{}"


async def test_write_on_one_vhosts_amqp_topology_keys_only(core: PolymqProcess) -> None:
    port = core.ports["core"]
    async with await connect(port, user="amqp-prod", password="pw") as amqp:
        for key in PROD:
            await amqp.kv_put(key, b"{}")
            assert await amqp.kv_get(key) == b"{}"
        await amqp.kv_put("amqp/i/host-1", b'{"t": 0}')
        assert await amqp.kv_list("amqp/b/prod/work/") == ["amqp/b/prod/work/orders/d1"]
        await amqp.kv_delete("amqp/q/prod/work")
        for key in [*TEST, "amqp/q/production/work", "avro/subjects/orders"]:
            with pytest.raises(Forbidden, match="user 'amqp-prod' has no write permission"):
                await amqp.kv_put(key, b"{}")
        with pytest.raises(
            Forbidden, match="no read permission on 'kv/amqp/b/test/work/orders/d1'"
        ):
            await amqp.kv_get("amqp/b/test/work/orders/d1")
        for prefix in ("amqp/", "amqp/b/", "amqp/b/test/"):
            with pytest.raises(Forbidden, match="no read permission"):
                await amqp.kv_list(prefix)
    async with await connect(port, user="admin", password="pw") as admin:
        assert await admin.kv_list("amqp/") == sorted(
            ["amqp/x/prod/orders", "amqp/b/prod/work/orders/d1", "amqp/i/host-1"]
        )


def test_a_malformed_kv_grant_stops_the_core_with_a_hint(tmp_path: Path) -> None:
    grants = {"u": [{"pattern": "kv/avro/", "permissions": ["read"]}]}
    users = users_file(tmp_path / "users.json", grants)
    with (
        pytest.raises(RuntimeError, match="exited early") as e,
        PolymqProcess("core", tmp_path / "core", "--auth", f"file:{users}"),
    ):
        pass
    assert f"auth file {users}: user 'u', grant 1: pattern 'kv/avro/' is the one key" in str(
        e.value
    )
    assert "write 'kv/avro/*'" in str(e.value)
