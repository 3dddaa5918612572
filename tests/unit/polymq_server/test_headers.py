from __future__ import annotations

from polymq_server.messages.headers import BOOKKEEPING, public_headers


def test_bookkeeping_headers_are_left_out() -> None:
    headers = {"x-amqp-exchange": "", "x-amqp-routing-key": "q", "x-amqp-typed": "{}", "a": "1"}
    assert public_headers(headers) == {"a": "1"}
    assert headers["x-amqp-exchange"] == ""  # (the message's own headers are not changed)
    assert BOOKKEEPING == {"x-amqp-exchange", "x-amqp-routing-key", "x-amqp-typed"}


def test_headers_without_bookkeeping_are_shown_as_they_are() -> None:
    headers = {"x-amqp-other": "mine", "amqp-message-id": "m-1"}
    assert public_headers(headers) is headers
