"""Avro records POSTed over HTTP are ordinary messages: stomp.py receives all 2,000 of a
container, each body in the single-object encoding that fastavro decodes with the schema
the registry holds under the id in the ``avro-schema-id`` header (the body carries its
fingerprint). 2,000, not the 10,000 it once was: the count is not the point here (a
10,000-record container goes through a queue in test_records.py), and 10,000 STOMP frames
took most of a minute of the suite."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro

from polymq_server.messages.avro import parse

from ...procs import PolymqProcess
from ..stomp.helpers import clients
from .conftest import USER, Avro, container, unique, users

N = 2_000


def test_a_containers_records_read_over_stomp(server: PolymqProcess, api: Avro) -> None:
    queue = unique("stomp")
    records = users(N)
    out = api.published(f"queue/{queue}", container(records, codec="snappy"))
    sid = out["schema_id"]
    schema: Any = json.loads(api.get(f"/v1/schemas/ids/{sid}").json()["schema"])
    assert schema["name"].endswith("User") and schema["fields"] == USER["fields"]
    parsed = fastavro.parse_schema(schema)

    with clients(server, "tcp") as make:
        consumer = make(ctor={"auto_decode": False})
        consumer.subscribe(f"/queue/{queue}", ack="auto")
        frames = consumer.listener.wait_messages(N, timeout=60)
    got = []
    for frame in frames[:N]:
        body = frame.body
        assert isinstance(body, bytes)
        assert frame.headers["content-type"] == "avro/binary"
        assert frame.headers["avro-schema-id"] == sid
        assert body[:2] == b"\xc3\x01" and body[2:10].hex() == parse(schema).rabin
        got.append(fastavro.schemaless_reader(io.BytesIO(body[10:]), parsed, None))
    assert len(frames) == N
    assert got == records
    assert api.depth(f"queue/{queue}") == 0  # every record was acked (auto) and none is left
