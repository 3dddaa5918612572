"""Tests for polymq_amqp.wire.tables and polymq_amqp.properties: AMQP properties and polymq
messages both ways, read back with pamqp (the client's decoder)."""

from __future__ import annotations

import datetime
import decimal
import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, decode

from polymq.types import Message
from polymq_amqp.errors import ChannelException
from polymq_amqp.properties import (
    H_TYPED,
    PublishTemplate,
    delivery_properties,
    from_publish,
    route_of,
)
from polymq_amqp.wire.tables import encode_table, from_tagged, to_tagged, to_text
from polymq_server.names import VhostNames

NAMES = VhostNames("/")


def decoded(props: bytes) -> commands.Basic.Properties:
    """Our encoded properties as a client reads them."""
    (flags,) = decode.short_int(props[:2])[1:]
    p = commands.Basic.Properties()
    p.unmarshal(flags, props[2:])
    return p


def through(props: commands.Basic.Properties, body: bytes = b"x") -> commands.Basic.Properties:
    message = from_publish(props, body, "ex", "k", NAMES)
    message.validate(1 << 20)  # a message the core accepts
    return decoded(delivery_properties(message, NAMES))


# ---- tables --------------------------------------------------------------------------------
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20).map(bytearray),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@given(values)
def test_tagged_values_come_back(v: Any) -> None:
    assert from_tagged(json.loads(json.dumps(to_tagged(v)))) == v


@given(st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=5))
def test_our_tables_are_read_by_pamqp(table: dict[str, Any]) -> None:
    _, got = decode.field_table(encode_table(table))
    assert got == table


def test_table_specials() -> None:
    t = {
        "d": decimal.Decimal("3.14"),
        "ts": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
        "raw": b"\xff\xfe",
    }
    _, got = decode.field_table(encode_table(t))
    assert got["d"] == decimal.Decimal("3.14")
    assert got["ts"] == t["ts"]
    assert got["raw"] == b"\xff\xfe"


def test_text_of_values() -> None:
    assert to_text(42) == "42"
    assert to_text(True) == "true"
    assert to_text(None) == ""
    assert to_text(b"ok") == "ok"
    assert to_text(b"\xff") == "/w=="
    assert to_text({"a": [1, "b"]}) == '{"a":[1,"b"]}'
    assert to_text(datetime.datetime(1970, 1, 1, 0, 1, tzinfo=datetime.UTC)) == "60"


# ---- properties ----------------------------------------------------------------------------
def test_every_property_comes_back() -> None:
    sent = commands.Basic.Properties(
        content_type="text/plain",
        content_encoding="gzip",
        headers={"s": "v", "n": 7, "f": 0.5, "t": True, "nested": {"a": [1, 2]}},
        delivery_mode=2,
        priority=5,
        correlation_id="c",
        reply_to="answers",
        expiration="60000",
        message_id="m",
        timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
        message_type="t",
        user_id="u",
        app_id="a",
    )
    got = through(sent)
    for attr in (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "message_type",
        "user_id",
        "app_id",
    ):
        assert getattr(got, attr) == getattr(sent, attr), attr
    assert got.timestamp == sent.timestamp


def test_absent_properties_stay_absent() -> None:
    got = through(commands.Basic.Properties())
    assert got.content_type is None
    assert got.headers is None
    assert (got.delivery_mode, got.priority) == (1, None)  # no priority invented


@pytest.mark.parametrize("priority", [None, 0, 1, 9, 10, 200, 255])
def test_the_priority_property_is_delivered_as_published(priority: int | None) -> None:
    message = from_publish(commands.Basic.Properties(priority=priority), b"x", "", "q", NAMES)
    assert message.priority == min(priority or 0, 9)  # what orders a priority queue
    got = decoded(delivery_properties(message, NAMES))
    assert got.priority == priority  # 0 included, none where none was set


def test_a_priority_from_another_protocol_is_shown_above_zero() -> None:
    assert decoded(delivery_properties(Message(b"x", priority=0), NAMES)).priority is None
    assert decoded(delivery_properties(Message(b"x", priority=6), NAMES)).priority == 6


def test_the_message_other_protocols_see() -> None:
    props = commands.Basic.Properties(
        content_type="application/json",
        headers={"x-n": 1, "x-s": "s"},
        priority=200,
        delivery_mode=2,
        reply_to="answers",
        expiration="1000",
    )
    m = from_publish(props, b"{}", "ex", "a.b", NAMES)
    assert (m.content_type, m.priority, m.persistent) == ("application/json", 9, True)
    assert m.headers["x-n"] == "1" and m.headers["x-s"] == "s"
    assert (m.headers["x-amqp-exchange"], m.headers["x-amqp-routing-key"]) == ("ex", "a.b")
    assert m.reply_to == "queue/answers"
    assert m.expires is not None and 0 < m.expires - time.time() <= 1


def test_a_typed_header_changed_by_another_protocol_keeps_the_new_text() -> None:
    m = from_publish(commands.Basic.Properties(headers={"n": 1, "m": 2}), b"", "", "q", NAMES)
    m.headers["n"] = "changed"
    got = decoded(delivery_properties(m, NAMES))
    assert got.headers == {"n": "changed", "m": 2}


def test_messages_from_other_protocols() -> None:
    m = Message(
        b"hi",
        content_type="text/plain",
        headers={"x-k": "v", "content-encoding": "br"},
        priority=4,
        reply_to="queue/replies",
        expires=time.time() + 30,
        timestamp=1_700_000_000.5,
        destination="queue/orders",
    )
    got = decoded(delivery_properties(m, NAMES))
    assert got.headers == {"x-k": "v"}
    assert (got.content_encoding, got.reply_to, got.priority) == ("br", "replies", 4)
    assert 25_000 < int(got.expiration) <= 30_000
    assert int(got.timestamp.timestamp()) == 1_700_000_000
    assert route_of(m, NAMES) == ("", "orders")
    m.destination = "topic/amqp.logs.a.b"
    assert route_of(m, NAMES) == ("logs", "a.b")


def test_dead_lettered_messages_carry_x_death() -> None:
    m = from_publish(commands.Basic.Properties(), b"x", "", "src", NAMES)
    m.headers.update({"x-death-reason": "expired", "x-original-destination": "queue/src"})
    m.destination = "topic/amqp.dlx.gone"
    assert route_of(m, NAMES) == ("dlx", "gone")
    got = decoded(delivery_properties(m, NAMES)).headers
    assert got["x-first-death-reason"] == "expired"
    assert got["x-death"][0]["queue"] == "src"
    assert got["x-death"][0]["routing-keys"] == ["src"]


@pytest.mark.parametrize("expiration", ["soon", "-1", "1.5", "9" * 20])
def test_a_bad_expiration_is_406(expiration: str) -> None:
    with pytest.raises(ChannelException) as info:
        from_publish(commands.Basic.Properties(expiration=expiration), b"", "", "q", NAMES)
    assert info.value.reply_code == 406


def test_internal_headers_from_clients_are_not_trusted() -> None:
    props = commands.Basic.Properties(
        content_type="text/plain", headers={"x-amqp-exchange": "spoof", H_TYPED: "{"}
    )
    m = from_publish(props, b"", "real", "k", NAMES)
    assert m.headers["x-amqp-exchange"] == "real"
    assert H_TYPED not in m.headers


# ---- PublishTemplate ------------------------------------------------------------------------
def _fields(m: Message) -> tuple[Any, ...]:
    t = m.to_wire()
    return t[:5] + t[6:]  # all but expires


@pytest.mark.parametrize(
    "props",
    [
        commands.Basic.Properties(),
        commands.Basic.Properties(
            content_type="text/plain",
            content_encoding="gzip",
            delivery_mode=2,
            priority=12,
            correlation_id="c",
            reply_to="rq",
            message_id="m",
            message_type="t",
            user_id="u",
            app_id="a",
        ),
        commands.Basic.Properties(headers={"n": 1, "s": "x"}, expiration="1000"),
    ],
)
def test_template_gives_what_from_publish_gives(props: commands.Basic.Properties) -> None:
    template = PublishTemplate()
    names = VhostNames("v")
    for body, exchange, key, vhost in [
        (b"a", "", "q", NAMES),
        (b"bb", "", "q", NAMES),  # kept
        (b"c", "", "q2", NAMES),
        (b"d", "ex", "q2", NAMES),
        (b"e", "ex", "q2", names),
        (b"f", "ex", "q2", names),
    ]:
        got = template.message(props, body, exchange, key, vhost)
        want = from_publish(props, body, exchange, key, vhost)
        assert _fields(got) == _fields(want)
        assert list(got.headers) == list(want.headers)
        assert (got.expires is None) == (want.expires is None)


def test_template_never_shares_headers_and_times_each_expiration() -> None:
    template = PublishTemplate()
    props = commands.Basic.Properties(expiration="60000", message_id="m")
    a = template.message(props, b"a", "", "q", NAMES)
    a.headers["changed"] = "yes"
    b = template.message(props, b"b", "", "q", NAMES)
    c = template.message(props, b"c", "", "q", NAMES)
    assert "changed" not in b.headers and b.headers is not c.headers
    assert b.headers == c.headers == from_publish(props, b"", "", "q", NAMES).headers
    assert b.expires is not None and abs(b.expires - (time.time() + 60.0)) < 5
    assert b.body == b"b" and c.body == b"c"


def test_template_keeps_no_properties_with_a_table() -> None:
    template = PublishTemplate()
    props = commands.Basic.Properties(headers={"k": "1"})
    template.message(props, b"a", "", "q", NAMES)
    props.headers["k"] = "2"  # (a table could change: it is read again)
    assert template.message(props, b"b", "", "q", NAMES).headers["k"] == "2"


def test_template_bad_expiration_raises_as_from_publish() -> None:
    template = PublishTemplate()
    with pytest.raises(ChannelException):
        template.message(commands.Basic.Properties(expiration="soon"), b"", "", "q", NAMES)


def test_a_timestamp_is_the_publisher_s_over_amqp_and_the_core_s_from_elsewhere() -> None:
    """As RabbitMQ: a message published over AMQP is delivered with the properties its
    publisher set, and no timestamp is added; one from STOMP or HTTP shows the core's time."""
    message = from_publish(commands.Basic.Properties(delivery_mode=1), b"x", "", "k", NAMES)
    message.timestamp = 1_700_000_123.5  # as the core sets it
    assert decoded(delivery_properties(message, NAMES)).timestamp is None
    stamped = commands.Basic.Properties(
        timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    )
    message = from_publish(stamped, b"x", "", "k", NAMES)
    message.timestamp = 1_700_000_123.5
    assert decoded(delivery_properties(message, NAMES)).timestamp == stamped.timestamp
    other = Message(b"x", destination="queue/k", timestamp=1_700_000_123.5)
    got = decoded(delivery_properties(other, NAMES)).timestamp
    assert got == datetime.datetime.fromtimestamp(1_700_000_123, tz=datetime.UTC)
