"""The JSON checks of the HTTP frontend (no sockets)."""

from __future__ import annotations

import base64
import re
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polymq import Lease, Message
from polymq.types import Destination
from polymq_server.web.payloads import (
    BASE64_PATTERN,
    lease_json,
    parse_declare,
    parse_message,
    parse_metadata,
    parse_publish,
    parse_settle,
    receipt_destination,
)
from polymq_server.web.problems import Problem

QUEUE = Destination.parse("queue/q")
CHANNEL = Destination.parse("channel/c")


def test_single_message_defaults() -> None:
    [m], role = parse_publish({"body": "hi"}, QUEUE, 10)
    assert role is None
    assert m.body == b"hi" and m.content_type == "text/plain; charset=utf-8"
    assert m.priority == 4 and m.persistent is False and m.expires is None and m.headers == {}


def test_message_fields() -> None:
    m = parse_message(
        {
            "body": base64.b64encode(b"\x00\xff").decode(),
            "encoding": "base64",
            "priority": 9.0,
            "persistent": True,
            "ttl": 10,
            "ack_timeout": 2.5,
            "headers": {"a": "b"},
            "correlation_id": "c",
            "reply_to": "queue/r",
            "content_type": None,
        },
        "",
    )
    assert m.body == b"\x00\xff" and m.content_type == "application/octet-stream"
    assert m.priority == 9 and m.persistent and m.ack_timeout == 2.5 and m.headers == {"a": "b"}
    assert m.expires is not None and 9 < m.expires - time.time() <= 10
    assert (m.correlation_id, m.reply_to) == ("c", "queue/r")


def test_batch_and_roles() -> None:
    msgs, role = parse_publish(
        {"messages": [{"body": "a"}, {"body": "b"}], "role": "server"}, CHANNEL, 2
    )
    assert [m.body for m in msgs] == [b"a", b"b"] and role == "server"
    # roles mean nothing outside channels: ignored
    assert parse_publish({"body": "a", "role": "server"}, QUEUE, 1)[1] is None


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        "x",
        {},
        {"body": None},
        {"body": "x", "extra": 1},
        {"messages": []},
        {"messages": [{"body": "a"}] * 3},
        {"messages": "a"},
        {"messages": [{"body": "a"}], "body": "b"},
        {"body": "x", "role": "both"},
        {"body": "x", "priority": 4.5},
        {"body": "x", "priority": -1},
        {"body": "x", "ttl": 0},
        {"body": "x", "ttl": True},
        {"body": "x", "ttl": 1e10},
        {"body": "x", "content_type": "x" * 256},
        {"body": "x", "reply_to": "r" * 1025},
        {"body": "abc", "encoding": "base64"},
        {"body": "YQ==\n", "encoding": "base64"},
    ],
)
def test_bad_publish_bodies(data: Any) -> None:
    with pytest.raises(Problem) as info:
        parse_publish(data, QUEUE, 2)
    assert info.value.status == 400


@given(
    st.text(alphabet="ABCab+/=\n 0-", max_size=12)
    | st.binary().map(lambda b: base64.b64encode(b).decode())
)
def test_base64_bodies_are_what_the_document_says(text: str) -> None:
    """The service accepts a base64 body exactly when the document's pattern matches it
    (canonical RFC 4648 padding: stricter than Python's decoder, which takes '0000=')."""
    documented = re.fullmatch(BASE64_PATTERN.removeprefix("^").removesuffix("$"), text)
    try:
        m = parse_message({"body": text, "encoding": "base64"}, "")
    except Problem:
        assert not documented
    else:
        assert documented and m.body == base64.b64decode(text)


def test_settle_bodies() -> None:
    assert parse_settle({"receipts": ["a"]}, 5, nack=False) == (["a"], True)
    assert parse_settle({"receipts": ["a"], "requeue": False}, 5, nack=True) == (["a"], False)
    for bad in (
        {"receipts": []},
        {"receipts": [1]},
        {"receipts": ["a"], "requeue": False},
        {"receipts": ["a"] * 6},
        {"receipts": [""]},
    ):
        with pytest.raises(Problem):
            parse_settle(bad, 5, nack=False)


def test_receipt_destination() -> None:
    assert receipt_destination("queue/orders.eu|12|7") == "queue/orders.eu"
    for bad in (
        "garbage",
        "queue/x|1",
        "queue/x|a|1",
        "topic/x|1|1",
        "queue/a..b|1|1",
        "queue/x|1|1|1",
        "queue/x|\u0661|1",
    ):
        assert receipt_destination(bad) is None


def test_declare_options() -> None:
    assert parse_declare({}) == {}
    assert parse_declare({"durable": None, "max_length": 5.0, "overflow": "drop-oldest"}) == {
        "max_length": 5,
        "overflow": "drop-oldest",
    }
    assert parse_declare({"max_priority": 0}) == {"max_priority": 0}  # a FIFO queue
    for bad in (
        {"max_priority": -1},
        {"max_priority": 10},
        {"max_priority": True},
        None,
        [],
        {"colour": 1},
        {"max_length": 0},
        {"dead_letter": "channel/x"},
        {"dead_letter": 5},
        {"idle_ttl": -1},
        {"durable": 1},
    ):
        with pytest.raises(Exception) as info:
            parse_declare(bad)
        assert getattr(info.value, "status", None) == 400


def test_metadata() -> None:
    assert parse_metadata({"a": "b"}) == {"a": "b"}
    for bad in (None, {"a": 1}, {str(i): "" for i in range(257)}, {"k": "v" * 70000}):
        with pytest.raises(Problem):
            parse_metadata(bad)


def test_lease_json_picks_the_encoding() -> None:
    text = lease_json(Lease("r", Message(b"caf\xc3\xa9", seq=3, delivery_count=2)))
    assert text["body"] == "café" and text["encoding"] == "utf8" and text["redelivered"]
    binary = lease_json(Lease("r", Message(b"\xff")))
    assert binary["encoding"] == "base64" and base64.b64decode(binary["body"]) == b"\xff"
