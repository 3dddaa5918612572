"""A long poll's answer as bytes (``polymq_longpoll.answers``): the same bytes as
``json.dumps`` of the answer built message by message, however many answers share a
message's JSON text."""

from __future__ import annotations

import json
from typing import Any

from polymq import CursorPage, Message
from polymq.errors import NotFound
from polymq.types import Destination
from polymq_longpoll.answers import Shown, answer_bytes
from polymq_longpoll.api import answer_json
from polymq_longpoll.subscriptions import AckMode, SubscriptionRef
from polymq_server.messages.avro import SchemaCache, encode_single, parse


def ref(destination: str) -> SubscriptionRef:
    dest = Destination.parse(destination, pattern=True)
    return SubscriptionRef("core-id", dest, AckMode.CLIENT, 10)


def message(body: bytes = b'{"t": 1}', **fields: Any) -> Message:
    base: dict[str, Any] = {
        "id": "m-1",
        "seq": 7,
        "destination": "topic/news",
        "timestamp": 1700000000.25,
        "headers": {"h": "v\u00e9"},
    }
    return Message(body=body, **{**base, **fields})


async def as_before(sub: SubscriptionRef, result: CursorPage, schemas: SchemaCache) -> bytes:
    """What the poll handler wrote before: ``web.json_response(answer_json(...))``."""
    return json.dumps(await answer_json(sub, result, schemas)).encode()


async def _no_schemas(key: str) -> bytes:
    raise NotFound(key)


async def test_topic_answers_are_the_bytes_json_dumps_gives() -> None:
    schemas, shown = SchemaCache(_no_schemas), Shown()
    sub = ref("topic/news.*")
    cases = [
        CursorPage(3, [message(), message(b"\xff", id="m-2")], ["", ""]),
        CursorPage(9, [message("\u00e9t\u00e9 \u2603".encode())], [""]),
        CursorPage(4, [], []),
        CursorPage(None, [], []),
    ]
    for result in cases:
        first = answer_bytes(sub, result, schemas, shown)
        again = answer_bytes(sub, result, schemas, shown)  # from what Shown remembers
        assert first == again == await as_before(sub, result, schemas)
        json.loads(first)


async def test_queue_receipts_and_stream_cursors_are_each_answers_own() -> None:
    schemas, shown = SchemaCache(_no_schemas), Shown()
    leased = CursorPage(0, [message(seq=5)], ['queue/q|5|"1'])
    sub = ref("queue/q")
    assert answer_bytes(sub, leased, schemas, shown) == await as_before(sub, leased, schemas)
    read = CursorPage(12, [message(seq=11), message(seq=12)], ["", ""])
    sub = ref("stream/s")
    assert answer_bytes(sub, read, schemas, shown) == await as_before(sub, read, schemas)
    cursors = [m["cursor"] for m in json.loads(answer_bytes(sub, read, schemas, shown))["messages"]]
    assert cursors == ["11", "12"]


async def test_a_message_with_the_same_id_but_other_content_is_encoded_afresh() -> None:
    schemas, shown = SchemaCache(_no_schemas), Shown()
    sub = ref("topic/news")
    one = CursorPage(1, [message(b"one")], [""])
    other = CursorPage(1, [message(b"other")], [""])
    assert json.loads(answer_bytes(sub, one, schemas, shown))["messages"][0]["body"] == "one"
    got = json.loads(answer_bytes(sub, other, schemas, shown))["messages"][0]["body"]
    assert got == "other"


async def test_an_avro_record_shows_its_value_once_its_schema_is_known() -> None:
    schema = parse({"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]})
    stored: dict[str, bytes] = {}

    async def fetch(key: str) -> bytes:
        if key not in stored:
            raise NotFound(key)
        return stored[key]

    schemas, shown = SchemaCache(fetch), Shown()
    record = message(
        encode_single(schema, {"n": 5}),
        content_type="application/avro",
        headers={"avro-schema-id": schema.id},
    )
    result = CursorPage(1, [record], [""])
    sub = ref("topic/avro")
    unknown = answer_bytes(sub, result, schemas, shown)
    assert unknown == await as_before(sub, result, schemas)
    assert json.loads(unknown)["messages"][0]["value"] is None
    stored[f"avro/schemas/{schema.id}"] = schema.json.encode()  # registered meanwhile
    assert (await as_before(sub, result, schemas)) == answer_bytes(sub, result, schemas, shown)
    assert json.loads(answer_bytes(sub, result, schemas, shown))["messages"][0]["value"] == {"n": 5}


def test_shown_is_bounded_in_entries_and_in_text() -> None:
    shown = Shown(entries=3, chars=2000)
    for i in range(10):
        shown.inner(message(id=f"m-{i}"), None)
    assert len(shown._memo) == 3 and shown.held == sum(len(t) for _, t in shown._memo.values())
    big = message(b"x" * 1500, id="big")
    shown.inner(big, None)
    assert len(shown._memo) == 1 and shown.held <= 2000
    shown.inner(message(b"y" * 5000, id="huge"), None)  # longer than all it may hold
    assert "huge" not in {k[0] for k in shown._memo}
