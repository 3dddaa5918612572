"""polymq messages and AMQP messages, both ways (no sockets: aio-pika's message objects)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import aio_pika
import pytest
from aio_pika import DeliveryMode

from polymq import Message
from polymq_bridge.props import header_text, to_amqp, to_polymq

NOW = 1_700_000_000.0


def test_polymq_to_amqp_carries_every_field() -> None:
    m = Message(
        b"body",
        content_type="application/json",
        headers={
            "x": "1",
            "amqp-message-id": "mid",
            "amqp-timestamp": "1600000000",
            "content-encoding": "gzip",
            "type": "t",
            "app-id": "app",
            "user-id": "someone",
        },
        priority=8,
        persistent=True,
        expires=NOW + 1.5,
        correlation_id="c",
        reply_to="r",
        id="1.2.3",
        timestamp=NOW - 10,
    )
    a = to_amqp(m, NOW)
    assert a.body == b"body"
    assert a.content_type == "application/json"
    assert a.headers == {"x": "1", "user-id": "someone"}  # RabbitMQ checks user_id: a header
    assert a.user_id is None
    assert a.priority == 8
    assert a.delivery_mode == DeliveryMode.PERSISTENT
    assert a.correlation_id == "c" and a.reply_to == "r"
    assert a.message_id == "mid"
    assert a.timestamp == dt.datetime.fromtimestamp(1600000000, dt.UTC)
    assert a.content_encoding == "gzip" and a.type == "t" and a.app_id == "app"
    assert a.properties.expiration == "1500"  # milliseconds from now, as text


def test_polymq_to_amqp_defaults() -> None:
    a = to_amqp(Message(b"x", id="9.9.9", timestamp=NOW), NOW)
    assert a.message_id == "9.9.9"  # polymq's own id
    assert a.timestamp == dt.datetime.fromtimestamp(NOW, dt.UTC)  # polymq's publish time
    assert a.delivery_mode == DeliveryMode.NOT_PERSISTENT
    assert a.priority == 4
    assert a.properties.expiration is None
    assert a.headers == {}
    # already expired: a TTL of 0 (RabbitMQ drops it unless a consumer is waiting)
    assert to_amqp(Message(b"x", expires=NOW - 5), NOW).properties.expiration == "0"
    # an amqp-timestamp that is no number stays a header
    assert to_amqp(Message(b"x", headers={"amqp-timestamp": "soon"}), NOW).headers == {
        "amqp-timestamp": "soon"
    }


def test_amqp_to_polymq_carries_every_property() -> None:
    a = aio_pika.Message(
        b"\x00bin",
        content_type="application/x",
        content_encoding="br",
        headers={"s": "v", "i": 7, "b": False, "d": Decimal("1.50"), "l": [1, {"k": b"v"}]},
        delivery_mode=DeliveryMode.PERSISTENT,
        priority=2,
        correlation_id="c",
        reply_to="r",
        expiration=30,
        message_id="m",
        timestamp=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        type="ty",
        user_id="guest",
        app_id="ap",
    )
    m = to_polymq(a, NOW)
    assert m.body == b"\x00bin"
    assert m.content_type == "application/x"
    assert m.persistent is True
    assert m.priority == 2
    assert m.correlation_id == "c" and m.reply_to == "r"
    assert m.expires == NOW + 30
    assert m.headers == {
        "s": "v",
        "i": "7",
        "b": "false",
        "d": "1.50",
        "l": '[1,{"k":"v"}]',
        "amqp-message-id": "m",
        "amqp-timestamp": str(int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp())),
        "content-encoding": "br",
        "type": "ty",
        "app-id": "ap",
        "user-id": "guest",
    }
    m.validate(1 << 20)  # what the core would accept


def test_amqp_to_polymq_defaults_and_limits() -> None:
    m = to_polymq(aio_pika.Message(b"x", priority=255), NOW)
    assert m.content_type == "application/octet-stream"
    assert m.priority == 9
    assert m.persistent is False and m.expires is None and m.headers == {}
    assert to_polymq(aio_pika.Message(b"x"), NOW, always_persistent=True).persistent is True
    assert to_polymq(aio_pika.Message(b"x"), NOW).priority == 0  # absent reads as 0


@pytest.mark.parametrize("persistent", [True, False])
def test_round_trip_polymq_amqp_polymq(persistent: bool) -> None:
    m = Message(
        b"rt",
        content_type="text/plain",
        headers={"h": "v", "type": "kind"},
        priority=6,
        persistent=persistent,
        expires=NOW + 60,
        correlation_id="c",
        reply_to="queue/r",
        id="1.1.1",
        timestamp=NOW,
    )
    back = to_polymq(to_amqp(m, NOW), NOW)
    assert back.body == m.body and back.content_type == m.content_type
    assert back.priority == m.priority and back.persistent == m.persistent
    assert back.correlation_id == m.correlation_id and back.reply_to == m.reply_to
    assert back.expires == pytest.approx(m.expires)
    assert back.headers == {
        "h": "v",
        "type": "kind",
        "amqp-message-id": "1.1.1",
        "amqp-timestamp": str(int(NOW)),
    }


def test_header_text() -> None:
    assert header_text(None) is None
    assert header_text(True) == "true"
    assert header_text(3) == "3"
    assert header_text(0.5) == "0.5"
    assert header_text(float("inf")) == "inf"
    assert header_text(b"\xff") == "\ufffd"
    assert header_text(dt.datetime(2020, 1, 1, tzinfo=dt.UTC)) == "2020-01-01T00:00:00+00:00"
    assert header_text({"a": None, "b": b"x"}) == '{"a":null,"b":"x"}'
