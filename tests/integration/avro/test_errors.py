"""Bad input is refused whole: a corrupt container, an unknown schema id, a record that does
not match its schema, a truncated body (and more) each get a 4xx problem, and nothing of the
request is published, not even its valid records. Limits answer 413."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import fastavro
import pytest

from polymq_server.messages.avro import encode_single, parse

from ...procs import PolymqProcess
from .conftest import USER, Avro, assert_problem, container, unique, users

SMALL = {"type": "record", "name": "Small", "fields": [{"name": "name", "type": "string"}]}


@pytest.fixture
def queue(api: Avro) -> Iterator[str]:
    """A declared, empty queue; at the end it must still be empty and never published to.
    Not durable: non-default options keep an idle queue in the core's memory, so its stats
    (``published``) are still there at the end."""
    dest = f"queue/{unique('bad')}"
    api.declare(dest, durable=False)
    yield dest
    stats = api.stats(dest)
    assert stats["messages"] == 0 and stats["published"] == 0, stats


def test_a_corrupt_container(api: Avro, queue: str) -> None:
    body = bytearray(container(users(50), codec="null"))
    body[-5] ^= 0xFF  # inside the last sync marker
    assert_problem(api.publish(queue, bytes(body)), 422, "corrupt-container")


def test_a_container_whose_block_data_is_garbage(api: Avro, queue: str) -> None:
    """The valid records before the damage are not published either."""
    records = [{"name": f"ok{i:02d}"} for i in range(99)] + [{"name": "tail"}]
    body = container(records, schema=SMALL, codec="null")
    damaged = body.replace(b"\x08tail", b"\x08\xff\xfe\xfd\xfc")  # not UTF-8
    assert damaged != body
    problem = assert_problem(api.publish(queue, damaged), 422, "invalid-record")
    assert "record 99" in problem["detail"]


def test_a_container_whose_records_do_not_match_its_schema(api: Avro, queue: str) -> None:
    """Records written with one schema, declared with another (USER wants more fields)."""
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(USER), [], codec="null")
    header = out.getvalue()  # a USER container with no blocks: its header and sync marker
    sync = header[-16:]
    data = b"\x06xxx" * 3  # three SMALL records
    block = b"\x06" + bytes([len(data) * 2]) + data + sync  # count 3, size, data, sync
    problem = assert_problem(api.publish(queue, header + block), 422)
    assert problem["code"] in ("invalid-record", "corrupt-container"), problem


def test_a_truncated_container(api: Avro, queue: str) -> None:
    body = container(users(200), codec="deflate")
    for cut in (len(body) // 2, len(body) - 3, 10, 2):
        assert_problem(api.publish(queue, body[:cut]), 422)


def test_a_record_of_an_unknown_schema_id(api: Avro, queue: str) -> None:
    never = parse({"type": "record", "name": unique("Never").replace("-", "_"), "fields": []})
    body = encode_single(never, {})
    problem = assert_problem(api.publish(queue, body, "avro/binary"), 422, "unknown-schema")
    assert never.rabin in problem["detail"]  # all the record says of its schema


def test_a_single_object_record_that_fails_to_decode(api: Avro, queue: str) -> None:
    schema = parse(SMALL)
    assert api.register(unique("subj"), SMALL).status_code == 200
    good = encode_single(schema, {"name": "fine"})
    bad = schema.header + b"\x06\xff\xfe\xfd"  # a 3-byte name that is not UTF-8
    problem = assert_problem(api.publish(queue, good * 10 + bad, "avro/binary"), 422)
    assert problem["code"] == "invalid-record" and "record 10" in problem["detail"]
    truncated = good * 3 + good[:-2]
    assert_problem(api.publish(queue, truncated, "avro/binary"), 422, "truncated")
    assert_problem(api.publish(queue, good + good[:5], "avro/binary"), 422, "truncated")
    assert_problem(api.publish(queue, good + b"\x00\x01", "avro/binary"), 422, "invalid-record")


def test_not_avro_and_wrong_content_types(api: Avro, queue: str) -> None:
    assert_problem(api.publish(queue, b'{"name": "json"}'), 422, "not-avro")
    assert_problem(api.publish(queue, b""), 422, "not-avro")
    assert_problem(api.publish(queue, container(users(1)), "application/json"), 415)
    assert_problem(api.publish(queue, container(users(1)), "text/plain"), 415)


def test_unknown_codec(api: Avro, queue: str) -> None:
    body = container(users(2), codec="null").replace(b"\x08null", b"\x08zzzz", 1)
    assert_problem(api.publish(queue, body), 422, "unsupported-codec")


def test_bad_destinations_and_options(api: Avro, queue: str) -> None:
    body = container(users(1))
    assert_problem(api.publish(f"channel/{unique()}", body), 400)
    assert_problem(api.publish("queue/bad name", body), 400)
    assert_problem(api.publish(queue, body, priority="12"), 400)
    assert_problem(api.publish(queue, body, ttl="-1"), 400)
    assert_problem(api.publish(queue, body, wat="1"), 400)
    assert_problem(api.publish(queue, body, headers={"Idempotency-Key": "x" * 300}), 400)
    assert_problem(api.get("/v1/topic/t/records"), 405)
    assert_problem(api.get("/v1/nowhere"), 404)


def test_an_incompatible_subject_publishes_nothing(api: Avro, queue: str) -> None:
    subject = unique("subj")
    assert api.register(subject, SMALL).status_code == 200
    changed = {"type": "record", "name": "Small", "fields": [{"name": "name", "type": "int"}]}
    r = api.publish(queue, container([{"name": 1}], schema=changed), subject=subject)
    problem = assert_problem(r, 409, "incompatible-schema")
    assert problem["messages"]
    assert api.get(f"/v1/schemas/subjects/{subject}/versions").json() == [1]


# ---- limits, on a `polymq avro` of its own ---------------------------------------------------
@pytest.fixture(scope="module")
def small(server: PolymqProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Avro]:
    """``polymq avro`` as its own process, on the module's core, with small limits."""
    env = {
        "POLYMQ_AVRO_MAX_RECORDS": "100",
        "POLYMQ_AVRO_MAX_BODY": "65536",
        "POLYMQ_AVRO_MAX_DECODED": "131072",
    }
    workdir: Path = tmp_path_factory.mktemp("avro-small")
    core = f"127.0.0.1:{server.ports['core']}"
    with PolymqProcess("avro", workdir, "--core", core, env=env) as proc:
        api = Avro(proc)
        api.http = server.url("http")
        yield api
        assert proc.alive, proc.log()
        assert proc.stop() == 0, proc.log()


def test_limits(small: Avro) -> None:
    dest = f"queue/{unique('lim')}"
    small.declare(dest)
    assert small.published(dest, container(users(100)))["count"] == 100
    assert_problem(small.publish(dest, container(users(101))), 413, "too-large")
    big = container([{"name": "x" * 70_000}], schema=SMALL, codec="null")
    assert_problem(small.publish(dest, big), 413)
    # a small body that inflates past the limit: stopped while inflating
    bomb = container([{"name": "y" * 60_000}] * 5, schema=SMALL, codec="deflate")
    assert len(bomb) < 65536
    assert_problem(small.publish(dest, bomb), 413, "too-large")
    assert small.stats(dest)["messages"] == 100


def test_the_standalone_frontend_serves_the_same_registry(small: Avro, api: Avro) -> None:
    """Schemas live in the core: one registered through one frontend is there for all."""
    subject = unique("shared")
    r = api.register(subject, SMALL)
    assert r.status_code == 200
    got = small.get(f"/v1/schemas/subjects/{subject}/versions/latest")
    assert got.status_code == 200 and got.json()["id"] == r.json()["id"]
