"""SEND headers to core messages and core messages to MESSAGE headers
(``polymq_stomp.messages``)."""

from __future__ import annotations

import time

import pytest

from polymq.types import Message
from polymq_stomp.frames import Command, Frame
from polymq_stomp.messages import message_from_send, message_headers, parse_int
from polymq_stomp.refusal import Refused

CONN = "c0ffee"


def send(*headers: tuple[str, str], body: bytes = b"hi") -> Frame:
    return Frame(Command.SEND, (("destination", "/queue/q"), *headers), body)


def test_send_headers_become_message_fields() -> None:
    msg, temp = message_from_send(
        send(
            ("content-type", "text/plain"),
            ("priority", "9"),
            ("persistent", "true"),
            ("expires", "4102444800000"),
            ("ack-timeout", "2.5"),
            ("correlation-id", "c1"),
            ("reply-to", "/queue/answers"),
            ("x-custom", "v"),
            ("x-custom", "ignored"),  # repeated: the first counts
            ("receipt", "r"),
        ),
        CONN,
    )
    assert temp is None
    assert msg.body == b"hi"
    assert msg.content_type == "text/plain"
    assert (msg.priority, msg.persistent, msg.ack_timeout) == (9, True, 2.5)
    assert msg.expires == 4102444800.0
    assert (msg.correlation_id, msg.reply_to) == ("c1", "queue/answers")
    assert msg.headers == {"x-custom": "v"}  # receipt, destination...: not carried


def test_expiration_is_relative_and_temp_reply_to_is_rewritten() -> None:
    before = time.time()
    msg, temp = message_from_send(
        send(("expiration", "60000"), ("reply-to", "/temp-queue/r")), CONN
    )
    assert msg.expires is not None and before + 59 < msg.expires < time.time() + 61
    assert msg.reply_to == f"queue/tmp.{CONN}.r"
    assert temp == "/temp-queue/r"


@pytest.mark.parametrize(
    ("name", "value"),
    [("priority", "10"), ("priority", "high"), ("persistent", "maybe"),
     ("priority", "\u00b2"),  # isdigit(), but int() refuses it
     ("priority", "\u0661"),  # a digit int() takes, but not an ASCII one
     ("priority", "9" * 5000),  # more digits than int() takes
     ("expires", "soon"), ("ack-timeout", "0"), ("ack-timeout", "nan")],
)  # fmt: skip
def test_bad_values_are_refused(name: str, value: str) -> None:
    with pytest.raises(Refused) as err:
        message_from_send(send((name, value)), CONN)
    assert err.value.reason == "header"
    assert err.value.message == "Invalid header"  # RabbitMQ's wording
    assert name in err.value.detail


def test_parse_int_takes_ascii_digits_in_range() -> None:
    assert parse_int("x", " 0000000000000000000000000007 ", 0, 9) == 7
    assert parse_int("x", "1" * 18, 0, 10**18) == int("1" * 18)
    for bad in ("10", "+1", "1_0", "-1", "", "\u00b2", "9" * 5000):
        with pytest.raises(Refused, match="Invalid header"):
            parse_int("x", bad, 0, 9)


def test_message_headers_round_trip() -> None:
    msg = Message(
        body=b"abc",
        content_type="text/plain",
        headers={"x-a": "1", "destination": "spoofed", "line": "a\nb"},
        priority=7,
        persistent=True,
        correlation_id="c",
        reply_to=f"queue/tmp.{CONN}.r",
        timestamp=1.5,
        delivery_count=2,
    )
    h12 = dict(message_headers(msg, "1.2", CONN))
    assert h12["content-length"] == "3"
    assert (h12["priority"], h12["persistent"], h12["redelivered"]) == ("7", "true", "true")
    assert h12["timestamp"] == "1500"
    assert h12["reply-to"] == "/temp-queue/r"
    assert h12["x-a"] == "1" and h12["line"] == "a\nb"
    assert "destination" not in h12  # the session sets it; a message header cannot spoof it
    h10 = dict(message_headers(msg, "1.0", "other"))
    assert "line" not in h10  # STOMP 1.0 cannot carry a newline in a header
    assert h10["reply-to"] == f"/queue/tmp.{CONN}.r"
