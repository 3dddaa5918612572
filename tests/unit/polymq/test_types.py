"""Tests for polymq.types: destinations, messages and the options of each operation."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polymq.errors import BadRequest, PayloadTooLarge
from polymq.types import (
    MAX_NAME_LENGTH,
    MAX_PRIORITY,
    WIRE_FIELDS,
    AckMode,
    ChannelRole,
    DeclareOptions,
    Destination,
    Kind,
    Message,
    Overflow,
    SlowPolicy,
    SubscribeOptions,
    parse_offset,
)

# ---- Destination -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "name"),
    [
        ("queue/orders", Kind.QUEUE, "orders"),
        ("topic/news.sport", Kind.TOPIC, "news.sport"),
        ("stream/log-2024:01_a", Kind.STREAM, "log-2024:01_a"),
        ("channel/rpc", Kind.CHANNEL, "rpc"),
        ("queue/A-Z_a-z.0-9:x", Kind.QUEUE, "A-Z_a-z.0-9:x"),
        ("queue/" + "x" * MAX_NAME_LENGTH, Kind.QUEUE, "x" * MAX_NAME_LENGTH),
    ],
)
def test_destination_parse_accepts(text: str, kind: Kind, name: str) -> None:
    dest = Destination.parse(text)
    assert dest == Destination(kind, name)
    assert str(dest) == text
    assert not dest.is_pattern


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("orders", "must be 'queue/<name>'"),
        ("", "must be 'queue/<name>'"),
        ("exchange/orders", "unknown destination kind 'exchange'"),
        ("Queue/orders", "unknown destination kind"),
        ("/orders", "unknown destination kind"),
        ("queue/", "name is empty"),
        ("topic/", "name is empty"),
        ("queue/" + "x" * (MAX_NAME_LENGTH + 1), "longer than 255 bytes"),
        ("queue/" + "é" * 128, "longer than 255 bytes"),  # 128 characters, 256 bytes
        ("queue/é", "illegal characters"),  # short, multibyte: not a legal character
        ("queue/a b", "illegal characters"),
        ("queue/a/b", "illegal characters"),
        ("queue/a\x00", "illegal characters"),
        ("queue/a\n", "illegal characters"),
        ("queue/a\ud800", "illegal characters"),  # a lone surrogate, as JSON can carry
        ("queue/a*", "illegal characters"),
        ("queue/#", "illegal characters"),
        ("topic/news.*", "illegal characters"),  # a pattern, without pattern=True
        ("queue/a..b", "empty segment"),
        ("queue/.a", "empty segment"),
        ("queue/a.", "empty segment"),
        ("queue/.", "empty segment"),
    ],
)
def test_destination_parse_rejects(text: str, error: str) -> None:
    with pytest.raises(BadRequest, match=error.replace("*", r"\*").replace("(", r"\(")):
        Destination.parse(text)


@pytest.mark.parametrize("value", [None, 1, b"queue/a", ["queue/a"]])
def test_destination_parse_rejects_non_strings(value: Any) -> None:
    with pytest.raises(BadRequest, match="must be a string"):
        Destination.parse(value)


@pytest.mark.parametrize("text", ["topic/news.*", "topic/news.#", "topic/*.sport", "topic/#"])
def test_topic_patterns_need_pattern_true(text: str) -> None:
    with pytest.raises(BadRequest):
        Destination.parse(text)
    dest = Destination.parse(text, pattern=True)
    assert dest.kind is Kind.TOPIC
    assert dest.is_pattern


@pytest.mark.parametrize("text", ["queue/a.*", "stream/#", "channel/*", "queue/x#"])
def test_patterns_only_for_topics(text: str) -> None:
    with pytest.raises(BadRequest, match="illegal characters"):
        Destination.parse(text, pattern=True)


@pytest.mark.parametrize("text", ["topic/news..#", "topic/.#", "topic/*.", "topic/a b.*"])
def test_patterns_are_still_validated(text: str) -> None:
    with pytest.raises(BadRequest):
        Destination.parse(text, pattern=True)


def test_plain_topic_with_pattern_true_is_not_a_pattern() -> None:
    dest = Destination.parse("topic/news", pattern=True)
    assert not dest.is_pattern


def test_destination_is_frozen_and_hashable() -> None:
    dest = Destination.parse("queue/a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        dest.name = "b"  # type: ignore[misc]
    assert {dest: 1}[Destination(Kind.QUEUE, "a")] == 1


@given(st.from_regex(r"[A-Za-z0-9_:\-]{1,20}(\.[A-Za-z0-9_:\-]{1,20}){0,5}", fullmatch=True))
def test_legal_names_parse_for_every_kind(name: str) -> None:
    for kind in Kind:
        dest = Destination.parse(f"{kind.value}/{name}")
        assert dest == Destination(kind, name)
        assert Destination.parse(str(dest)) == dest


@given(st.text(max_size=40))
def test_parse_accepts_or_raises_bad_request(text: str) -> None:
    try:
        dest = Destination.parse(text)
    except BadRequest:
        return
    assert str(dest) == text
    assert 0 < len(dest.name.encode()) <= MAX_NAME_LENGTH


# ---- Message ---------------------------------------------------------------------------------


def test_message_defaults() -> None:
    m = Message(b"x")
    assert m.content_type == "application/octet-stream"
    assert m.headers == {}
    assert m.priority == 4
    assert m.persistent is False
    assert (m.expires, m.ack_timeout, m.correlation_id, m.reply_to) == (None, None, None, None)
    assert (m.id, m.seq, m.timestamp, m.delivery_count, m.destination) == ("", 0, 0.0, 0, "")
    assert not m.redelivered
    assert Message(b"", delivery_count=1).redelivered is False
    assert Message(b"", delivery_count=2).redelivered is True
    assert Message(b"").headers is not Message(b"").headers  # no shared mutable default


@pytest.mark.parametrize(
    "message",
    [
        Message(b""),
        Message(b"x" * 100),  # exactly max_body
        Message(bytearray(b"x")),  # type: ignore[arg-type]
        Message(b"\x00", priority=0),
        Message(b"\x00", priority=MAX_PRIORITY),
        Message(b"", headers={"ü": "✓", "": ""}),
        Message(b"", content_type="c" * 255),
        Message(b"", ack_timeout=0.001),
        Message(b"", ack_timeout=5),
        Message(b"", expires=0),
        Message(b"", expires=1.7e9),
    ],
)
def test_message_validate_accepts(message: Message) -> None:
    message.validate(max_body=100)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("text"), "body must be bytes"),  # type: ignore[arg-type]
        (Message(None), "body must be bytes"),  # type: ignore[arg-type]
        (Message(memoryview(b"x")), "body must be bytes"),  # type: ignore[arg-type]
        (Message(b"", priority=-1), "priority must be an integer 0..9"),
        (Message(b"", priority=MAX_PRIORITY + 1), "priority"),
        (Message(b"", priority=4.0), "priority"),  # type: ignore[arg-type]
        (Message(b"", priority="4"), "priority"),  # type: ignore[arg-type]
        (Message(b"", priority=True), "priority"),  # a bool is not a priority
        (Message(b"", priority=None), "priority"),  # type: ignore[arg-type]
        (Message(b"", content_type="c" * 256), "content_type"),
        (Message(b"", content_type=None), "content_type"),  # type: ignore[arg-type]
        (Message(b"", headers=[("a", "b")]), "headers"),  # type: ignore[arg-type]
        (Message(b"", headers={"a": 1}), "headers"),  # type: ignore[dict-item]
        (Message(b"", headers={1: "a"}), "headers"),  # type: ignore[dict-item]
        (Message(b"", headers={"a": b"b"}), "headers"),  # type: ignore[dict-item]
        (Message(b"", headers={"a": None}), "headers"),  # type: ignore[dict-item]
        (Message(b"", ack_timeout=0), "ack_timeout"),
        (Message(b"", ack_timeout=-1.5), "ack_timeout"),
        (Message(b"", ack_timeout="5"), "ack_timeout"),  # type: ignore[arg-type]
        (Message(b"", ack_timeout=True), "ack_timeout"),
        (Message(b"", ack_timeout=math.nan), "ack_timeout"),
        (Message(b"", ack_timeout=math.inf), "ack_timeout"),
        (Message(b"", expires="tomorrow"), "expires"),  # type: ignore[arg-type]
        (Message(b"", expires=True), "expires"),
        (Message(b"", expires=math.nan), "expires"),
        # what a native client may send and no frontend could deliver (fuzzing found it)
        (Message(b"", correlation_id=b"\xff"), "correlation_id"),  # type: ignore[arg-type]
        (Message(b"", correlation_id={"a": 1}), "correlation_id"),  # type: ignore[arg-type]
        (Message(b"", reply_to=5), "reply_to"),  # type: ignore[arg-type]
        (Message(b"", reply_to=["queue/b"]), "reply_to"),  # type: ignore[arg-type]
    ],
)
def test_message_validate_rejects(message: Message, error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        message.validate(max_body=100)


def test_message_body_too_large() -> None:
    with pytest.raises(PayloadTooLarge, match="101 bytes exceeds 100") as info:
        Message(b"x" * 101).validate(max_body=100)
    assert info.value.status == 413
    assert info.value.code == "too-large"
    assert not isinstance(info.value, BadRequest)


FULL = Message(
    body=b"\x00\xffbody\x00",
    content_type="application/json",
    headers={"ü": "✓", "k": ""},
    priority=7,
    persistent=True,
    expires=1.7e9,
    ack_timeout=30.0,
    correlation_id="c",
    reply_to="queue/r",
    id="m1",
    seq=123,
    timestamp=1.5,
    delivery_count=2,
    destination="queue/q",
)


def test_to_wire_is_every_field_in_order() -> None:
    assert FULL.to_wire() == tuple(getattr(FULL, f.name) for f in dataclasses.fields(Message)[:14])
    assert len(FULL.to_wire()) == 14
    assert WIRE_FIELDS == tuple(f.name for f in dataclasses.fields(Message)[:14])


def test_the_cores_stored_mark_is_not_on_the_wire_nor_in_a_copy() -> None:
    """``stored`` (the core's: a transient message with a row in its store, paging.py) is the
    one field after the 14 of the wire; a copy, and a message from the wire, start without it."""
    assert [f.name for f in dataclasses.fields(Message)][14:] == ["stored"]
    m = Message(b"x")
    m.stored = True
    assert m.to_wire() == Message(b"x").to_wire()
    assert not m.copy().stored and not Message.from_wire(m.to_wire()).stored
    assert m == Message(b"x")  # not compared


@pytest.mark.parametrize("message", [FULL, Message(b"")])
def test_to_wire_from_wire_round_trip(message: Message) -> None:
    assert Message.from_wire(message.to_wire()) == message
    assert Message.from_wire(tuple(message.to_wire())) == message
    # and through msgpack, as the codec and the store carry it
    packed = msgpack.packb(message.to_wire(), use_bin_type=True)
    assert Message.from_wire(msgpack.unpackb(packed, raw=False)) == message


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (None, "14 fields"),
        ("x" * 14, "14 fields"),
        ({"body": b""}, "14 fields"),
        (FULL.to_wire()[:13], "14 fields"),
        ([*FULL.to_wire(), None], "14 fields"),
        ([*FULL.to_wire()[:4], 1, *FULL.to_wire()[5:]], "malformed"),  # persistent
        ([*FULL.to_wire()[:4], None, *FULL.to_wire()[5:]], "malformed"),
        ([*FULL.to_wire()[:9], None, *FULL.to_wire()[10:]], "malformed"),  # id
        ([*FULL.to_wire()[:9], b"m1", *FULL.to_wire()[10:]], "malformed"),
    ],
)
def test_from_wire_rejects(fields: Any, error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        Message.from_wire(fields)


# ---- DeclareOptions --------------------------------------------------------------------------


def test_declare_options_defaults() -> None:
    assert DeclareOptions.from_dict(None) == DeclareOptions()
    assert DeclareOptions.from_dict({}) == DeclareOptions()
    d = DeclareOptions()
    assert d.durable is True
    assert d.overflow is Overflow.REJECT
    unset = ("max_length", "max_bytes", "idle_ttl", "dead_letter", "max_deliveries")
    assert all(getattr(d, k) is None for k in (*unset, "ack_timeout", "message_ttl"))
    assert d.max_priority is None  # every priority level


ALL_DECLARE = {
    "durable": False,
    "max_length": 10,
    "max_bytes": 1 << 20,
    "overflow": "drop-oldest",
    "idle_ttl": 60,
    "dead_letter": "queue/dlq",
    "max_deliveries": 5,
    "ack_timeout": 2.5,
    "message_ttl": 3600.0,
    "max_priority": 0,
}


def test_declare_options_every_key() -> None:
    d = DeclareOptions.from_dict(ALL_DECLARE)
    assert d == DeclareOptions(
        durable=False,
        max_length=10,
        max_bytes=1 << 20,
        overflow=Overflow.DROP_OLDEST,
        idle_ttl=60.0,
        dead_letter="queue/dlq",
        max_deliveries=5,
        ack_timeout=2.5,
        message_ttl=3600.0,
        max_priority=0,
    )
    assert type(d.idle_ttl) is float
    assert DeclareOptions.KEYS == set(ALL_DECLARE) | {"dead_letter_by"}
    by = DeclareOptions.from_dict({**ALL_DECLARE, "dead_letter_by": "alice"})
    assert by == d and by.dead_letter_by == "alice"  # (not part of the queue's identity)
    assert by.to_dict()["dead_letter_by"] == "alice"


@pytest.mark.parametrize(
    "options",
    [
        {},
        ALL_DECLARE,
        {"overflow": "reject", "max_length": 1},
        {"dead_letter": "topic/dead.letters"},
        {"dead_letter": "stream/dead"},
    ],
)
def test_declare_options_dict_round_trip(options: dict[str, Any]) -> None:
    d = DeclareOptions.from_dict(options)
    assert DeclareOptions.from_dict(d.to_dict()) == d
    assert d.to_dict()["overflow"] == d.overflow.value  # plain data, fit for JSON and msgpack
    assert msgpack.unpackb(msgpack.packb(d.to_dict()), raw=False) == d.to_dict()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"durable": True, "bogus": 1}, "unknown declare option: bogus"),
        ({"b": 1, "a": 2}, "unknown declare option: a, b"),
        ({1: 2}, "unknown declare option: 1"),
        ([], "declare option must be an object"),
        ([("durable", True)], "declare option must be an object"),
        ("durable", "declare option must be an object"),
        (0, "declare option must be an object"),
        ({"durable": 1}, "durable must be true or false"),
        ({"durable": "yes"}, "durable must be true or false"),
        ({"durable": None}, "durable must be true or false"),
        ({"max_length": 0}, "max_length must be an integer >= 1"),
        ({"max_length": -1}, "max_length"),
        ({"max_length": 1.5}, "max_length"),
        ({"max_length": "10"}, "max_length"),
        ({"max_length": True}, "max_length"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"max_deliveries": False}, "max_deliveries"),
        ({"overflow": "drop"}, "overflow must be one of 'reject', 'drop-oldest'"),
        ({"overflow": "REJECT"}, "overflow must be one of"),
        ({"overflow": 1}, "overflow must be one of"),
        ({"overflow": ["reject"]}, "overflow must be one of"),
        ({"idle_ttl": 0}, "idle_ttl must be a positive number"),
        ({"idle_ttl": -1}, "idle_ttl"),
        ({"idle_ttl": "60"}, "idle_ttl"),
        ({"idle_ttl": True}, "idle_ttl"),
        ({"idle_ttl": math.nan}, "idle_ttl"),
        ({"idle_ttl": math.inf}, "idle_ttl"),
        ({"ack_timeout": 10**400}, "ack_timeout"),  # too large for a float
        ({"message_ttl": -0.5}, "message_ttl"),
        ({"dead_letter": "dlq"}, "must be 'queue/<name>'"),
        ({"dead_letter": "queue/"}, "name is empty"),
        ({"dead_letter": "queue/a b"}, "illegal characters"),
        ({"dead_letter": "channel/rpc"}, "dead_letter must be a queue, topic or stream"),
        ({"dead_letter": "topic/dead.*"}, "illegal characters"),  # not a pattern
        ({"dead_letter": 5}, "must be a string"),
    ],
)
def test_declare_options_reject(options: Any, error: str) -> None:
    with pytest.raises(BadRequest, match=error.replace("*", r"\*")):
        DeclareOptions.from_dict(options)


def test_declare_options_to_dict_leaves_out_unset() -> None:
    assert DeclareOptions().to_dict() == {"durable": True, "overflow": "reject"}


# ---- offsets and SubscribeOptions ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "next"),
        ("first", "first"),
        ("last", "last"),
        ("next", "next"),
        (0, 0),
        (123, 123),
        (2**63 - 1, 2**63 - 1),  # a stream's sequences are signed 64-bit
        ("0", 0),
        ("123", 123),
        ("9223372036854775807", 2**63 - 1),
        ("00000000000000000000009223372036854775807", 2**63 - 1),
        ({"timestamp": 1700000000}, 1700000000.0),
        ({"timestamp": 1.5}, 1.5),
        ("@1700000000", 1700000000.0),
        ("@1.5", 1.5),
        ("@0", 0.0),
    ],
)
def test_parse_offset_accepts(value: Any, expected: str | int | float) -> None:
    got = parse_offset(value)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        -1,
        2**63,  # past a stream's last sequence: refused, not an overflow in msgpack or SQLite
        2**64,  # past what msgpack carries
        "9223372036854775808",
        "9" * 25,
        "9" * 5000,  # more digits than int() takes
        1.5,  # a bare float is neither a sequence nor (without a marker) a timestamp
        "",
        "FIRST",
        "earliest",
        "-1",
        "+1",
        "1.5",
        " 1",
        "1e3",
        "²",  # isdigit(), but no number
        "١٢",  # digits, but not ASCII ones
        "@",
        "@now",
        "@nan",
        "@inf",
        {"timestamp": "1"},
        {"timestamp": True},
        {"timestamp": None},
        {"timestamp": math.nan},
        {"timestamp": 1, "seq": 2},
        {},
        {"seq": 1},
        [1],
        b"1",
    ],
)
def test_parse_offset_rejects(value: Any) -> None:
    with pytest.raises(BadRequest, match="offset"):
        parse_offset(value)


def test_subscribe_options_defaults() -> None:
    s = SubscribeOptions.from_dict(None)
    assert s == SubscribeOptions.from_dict({}) == SubscribeOptions()
    assert s.ack_mode is AckMode.AUTO
    assert s.prefetch == 100
    assert s.buffer_messages == 10_000
    assert s.buffer_bytes == 16 * 1024 * 1024
    assert s.slow_policy is SlowPolicy.DISCONNECT
    assert s.ack_timeout is None
    assert s.offset == "next"
    assert s.role is None


ALL_SUBSCRIBE = {
    "ack_mode": "client-individual",
    "prefetch": 0,
    "buffer_messages": 5,
    "buffer_bytes": 4096,
    "slow_policy": "drop",
    "ack_timeout": 1,
    "offset": "@1700000000.5",
    "role": "server",
    "priority": -3,
}


def test_subscribe_options_every_key() -> None:
    s = SubscribeOptions.from_dict(ALL_SUBSCRIBE)
    assert s == SubscribeOptions(
        ack_mode=AckMode.CLIENT_INDIVIDUAL,
        prefetch=0,  # 0 = unlimited, kept as given
        buffer_messages=5,
        buffer_bytes=4096,
        slow_policy=SlowPolicy.DROP,
        ack_timeout=1.0,
        offset=1700000000.5,
        role="server",
        priority=-3,
    )
    assert SubscribeOptions.KEYS == set(ALL_SUBSCRIBE)
    for bad in (1.5, True, "1", 2**31):
        with pytest.raises(BadRequest):
            SubscribeOptions.from_dict({"priority": bad})


@pytest.mark.parametrize(
    "options",
    [
        {},
        ALL_SUBSCRIBE,
        {"ack_mode": "client", "role": "client"},
        {"offset": "first"},
        {"offset": "last"},
        {"offset": 42},
        {"offset": "42"},
        {"offset": {"timestamp": 12}},
        {"offset": "@12.25"},
    ],
)
def test_subscribe_options_dict_round_trip(options: dict[str, Any]) -> None:
    s = SubscribeOptions.from_dict(options)
    assert SubscribeOptions.from_dict(s.to_dict()) == s
    assert msgpack.unpackb(msgpack.packb(s.to_dict()), raw=False) == s.to_dict()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"ackmode": "auto"}, "unknown subscribe option: ackmode"),
        ([], "subscribe option must be an object"),
        ("auto", "subscribe option must be an object"),
        ({"ack_mode": "manual"}, "ack_mode must be one of 'auto', 'client', 'client-individual'"),
        ({"ack_mode": True}, "ack_mode"),
        ({"prefetch": -1}, "prefetch must be an integer >= 0"),
        ({"prefetch": 1.0}, "prefetch"),
        ({"prefetch": False}, "prefetch"),
        ({"buffer_messages": 0}, "buffer_messages must be an integer >= 1"),
        ({"buffer_bytes": 0}, "buffer_bytes"),
        ({"buffer_bytes": "1M"}, "buffer_bytes"),
        ({"slow_policy": "block"}, "slow_policy must be one of 'disconnect', 'drop'"),
        ({"ack_timeout": 0}, "ack_timeout must be a positive number"),
        ({"ack_timeout": math.inf}, "ack_timeout"),
        ({"offset": -1}, "offset"),
        ({"offset": "yesterday"}, "offset"),
        ({"offset": True}, "offset"),
        ({"role": "peer"}, "role must be 'server' or 'client'"),
        ({"role": 1}, "role"),
    ],
)
def test_subscribe_options_reject(options: Any, error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        SubscribeOptions.from_dict(options)


def test_subscribe_options_to_dict_leaves_out_defaults() -> None:
    assert SubscribeOptions().to_dict() == {
        "ack_mode": "auto",
        "prefetch": 100,
        "buffer_messages": 10_000,
        "buffer_bytes": 16 * 1024 * 1024,
        "slow_policy": "disconnect",
    }
    assert SubscribeOptions(offset=1.5).to_dict()["offset"] == {"timestamp": 1.5}
    assert SubscribeOptions(offset=7).to_dict()["offset"] == 7


@given(
    st.one_of(
        st.sampled_from(["first", "last", "next"]),
        st.integers(0, 2**63 - 1),  # a stream's sequences
        st.floats(0, 4e9),
    )
)
def test_offsets_survive_to_dict_from_dict(offset: str | int | float) -> None:
    s = SubscribeOptions(offset=offset)
    again = SubscribeOptions.from_dict(s.to_dict())
    assert again.offset == offset
    assert type(again.offset) is type(offset)


def test_equal_subscribe_options_are_shared_but_offsets_keep_their_kind() -> None:
    a = SubscribeOptions.from_dict({"ack_mode": "client", "prefetch": 7})
    b = SubscribeOptions.from_dict({"prefetch": 7, "ack_mode": "client"})
    assert a is b  # a million alike subscriptions hold one options object
    seq = SubscribeOptions.from_dict({"offset": 5})
    ts = SubscribeOptions.from_dict({"offset": {"timestamp": 5.0}})
    assert isinstance(seq.offset, int) and isinstance(ts.offset, float)


def test_dead_letter_by_names_a_user_and_needs_a_dead_letter() -> None:
    for bad in ({"dead_letter_by": "alice"}, {"dead_letter": "queue/d", "dead_letter_by": 3}):
        with pytest.raises(BadRequest):
            DeclareOptions.from_dict(bad)
    assert (
        DeclareOptions.from_dict({"dead_letter": "queue/d", "dead_letter_by": ""}).dead_letter_by
        == ""
    )


def test_a_channel_role_is_its_string_on_the_wire_and_knows_the_other_side() -> None:
    assert ChannelRole.SERVER == "server" and ChannelRole.CLIENT == "client"
    assert ChannelRole.SERVER.other is ChannelRole.CLIENT
    assert ChannelRole.CLIENT.other is ChannelRole.SERVER
    assert ChannelRole.of(None, ChannelRole.CLIENT) is ChannelRole.CLIENT
    assert ChannelRole.of("server", ChannelRole.CLIENT) is ChannelRole.SERVER
    assert ChannelRole.named("client") and not ChannelRole.named("peer")
    assert not ChannelRole.named(None) and not ChannelRole.named(1)
    for bad in ("peer", "", 1):
        with pytest.raises(BadRequest, match="role must be 'server' or 'client'"):
            ChannelRole.of(bad, ChannelRole.SERVER)
    with pytest.raises(BadRequest, match="role must be"):
        SubscribeOptions.from_dict({"role": "peer"})
    assert SubscribeOptions.from_dict({"role": "client"}).role == "client"


def test_a_message_copy_has_every_field_and_shares_nothing_mutable() -> None:
    """Message.copy sets each field by hand: a field added to Message and not to copy()
    fails here."""
    values: dict[str, Any] = {
        "body": b"b", "content_type": "text/plain", "headers": {"k": "v"}, "priority": 7,
        "persistent": True, "expires": 1e9, "ack_timeout": 3.0, "correlation_id": "c",
        "reply_to": "queue/r", "id": "i", "seq": 9, "timestamp": 2.5, "delivery_count": 2,
        "destination": "queue/d",
    }  # fmt: skip
    assert set(values) == set(WIRE_FIELDS)  # (and ``stored``, which a copy starts without)
    original = Message(**values)
    copy = original.copy()
    assert copy == original and copy is not original
    assert copy.headers is not original.headers
    assert Message(bytearray(b"x")).copy().body == b"x"  # type: ignore[arg-type]
    assert type(Message(memoryview(b"x")).copy().body) is bytes  # type: ignore[arg-type]
