"""STOMP headers and core messages, both ways: a SEND frame becomes a
:class:`polymq.types.Message`, a delivered message becomes the headers of a MESSAGE frame.

SEND headers with a meaning (every other header is carried as a message header, so that
HTTP, AMQP and the rest see it, and comes back on MESSAGE frames):

==================  ===========================================================================
``content-type``    the message's content type (``application/octet-stream`` when absent)
``priority``        0..9 (higher first)
``persistent``      ``true``: stored and fsynced before the RECEIPT (on a durable destination)
``expires``         absolute expiry, milliseconds since the epoch (0: never), as ActiveMQ
``expiration``      a time to live in milliseconds from now, as RabbitMQ
``ack-timeout``     seconds a subscriber may hold it unacknowledged before it goes to another
                    (ocamlmq)
``correlation-id``  carried as the message's correlation id
``reply-to``        carried as the message's reply-to; a STOMP destination is stored in the
                    core's form (``/queue/x`` -> ``queue/x``, ``/temp-queue/x`` -> this
                    connection's temp queue) and shown in STOMP's form again on MESSAGE frames
==================  ===========================================================================

The frame's own headers (``destination``, ``receipt``, ``transaction``, ``content-length``)
and the names MESSAGE frames set (``message-id``, ``subscription``, ``ack``, ``redelivered``,
``timestamp``) are not carried.
"""

from __future__ import annotations

import math
import time
from typing import Final

from polymq.types import MAX_PRIORITY, Message
from polymq_server.messages.headers import BOOKKEEPING, public_headers

from .destinations import Target, from_core, parse_destination
from .frames import Frame
from .refusal import Refused

__all__ = [
    "MESSAGE_RESERVED",
    "SEND_RESERVED",
    "message_from_send",
    "message_headers",
    "parse_float",
    "parse_int",
]

# Not carried from SEND into the message.
SEND_RESERVED: Final = frozenset(
    {
        "destination",
        "receipt",
        "transaction",
        "content-length",
        "content-type",
        "priority",
        "persistent",
        "expires",
        "expiration",
        "ack-timeout",
        "correlation-id",
        "reply-to",
        "message-id",
        "subscription",
        "ack",
        "redelivered",
        "timestamp",
    }
    | BOOKKEEPING  # (the AMQP frontend's own: a client cannot set them)
)
# Set by the frontend on MESSAGE frames: a message header with one of these names is left out.
MESSAGE_RESERVED: Final = SEND_RESERVED | {"content-length"}

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no", ""})


def _bad(header: str, value: str, expected: str) -> Refused:
    return Refused(
        "header",
        "Invalid header",
        f"{header}: {value[:80]!r} is not valid: expected {expected}",
    )


def parse_int(header: str, value: str, low: int, high: int) -> int:
    v = value.strip()
    if (
        not (v.isascii() and v.isdigit())
        or len(v.lstrip("0")) > len(str(high))  # (int() refuses more than 4300 digits)
        or not low <= int(v) <= high
    ):
        raise _bad(header, value, f"an integer {low}..{high}")
    return int(v)


def parse_float(header: str, value: str, *, positive: bool = True) -> float:
    try:
        f = float(value)
    except ValueError:
        f = math.nan
    if not math.isfinite(f) or (positive and f <= 0) or f < 0:
        raise _bad(header, value, "a positive number" if positive else "a number >= 0")
    return f


def message_from_send(
    frame: Frame, conn_id: str, vhost_prefix: str = ""
) -> tuple[Message, str | None]:
    """The message a SEND carries, and the STOMP ``reply-to`` if it names this connection's
    temp queue (the session subscribes to it, as RabbitMQ does)."""
    headers: dict[str, str] = {}
    content_type = "application/octet-stream"
    priority = 4
    persistent = False
    expires: float | None = None
    ack_timeout: float | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    temp_reply: str | None = None
    seen: set[str] = set()
    for name, value in frame.headers:
        if name in seen:
            continue  # a repeated header: the first one counts (STOMP 1.2)
        seen.add(name)
        if name not in SEND_RESERVED:
            headers[name] = value
        elif name == "content-type":
            content_type = value
        elif name == "priority":
            priority = parse_int("priority", value, 0, MAX_PRIORITY)
        elif name == "persistent":
            low = value.strip().lower()
            if low in _TRUE:
                persistent = True
            elif low not in _FALSE:
                raise _bad("persistent", value, "true or false")
        elif name == "expires":
            ms = parse_float("expires", value, positive=False)
            if ms:
                expires = ms / 1000.0
        elif name == "expiration":
            ms = parse_float("expiration", value, positive=False)
            expires = time.time() + ms / 1000.0
        elif name == "ack-timeout":
            ack_timeout = parse_float("ack-timeout", value)
        elif name == "correlation-id":
            correlation_id = value
        elif name == "reply-to":
            reply_to = value
            if value.startswith("/"):
                try:
                    target = parse_destination(value, conn_id, vhost_prefix=vhost_prefix)
                except Refused:
                    pass  # not one of ours: carried as the client wrote it
                else:
                    if isinstance(target, Target):
                        reply_to = target.core
                        if target.temp:
                            temp_reply = value
    message = Message(
        body=frame.body,
        content_type=content_type,
        headers=headers,
        priority=priority,
        persistent=persistent,
        expires=expires,
        ack_timeout=ack_timeout,
        correlation_id=correlation_id,
        reply_to=reply_to,
    )
    return message, temp_reply


def _fits(name: str, value: str, version: str) -> bool:
    """Can this version's header syntax carry ``name: value``? (1.0 cannot escape.)"""
    if not name or "\0" in name or "\0" in value:
        return False
    if version == "1.2":
        return True
    if value[-1:] == "\r":
        return False
    return version == "1.1" or not (":" in name or "\n" in name or "\n" in value)


def message_headers(
    message: Message, version: str, conn_id: str, vhost_prefix: str = ""
) -> list[tuple[str, str]]:
    """The MESSAGE headers that describe ``message`` itself (the session adds
    ``destination``, ``message-id``, ``subscription`` and ``ack``). Headers this version
    cannot carry (a newline in STOMP 1.0, a NUL in any) are left out."""
    out = [
        ("content-length", str(len(message.body))),
        ("priority", str(message.priority)),
        ("persistent", "true" if message.persistent else "false"),
        ("redelivered", "true" if message.delivery_count > 1 else "false"),
        ("timestamp", str(int(message.timestamp * 1000))),
    ]
    if message.expires is not None:
        out.append(("expires", str(int(message.expires * 1000))))
    variable = [("content-type", message.content_type)]
    if message.correlation_id is not None:
        variable.append(("correlation-id", message.correlation_id))
    if message.reply_to is not None:
        shown = from_core(message.reply_to, conn_id, vhost_prefix)
        variable.append(("reply-to", shown or message.reply_to))
    for name, value in variable:
        if _fits(name, value, version):
            out.append((name, value))
    if message.headers:
        for name, value in public_headers(message.headers).items():
            if name not in MESSAGE_RESERVED and _fits(name, value, version):
                out.append((name, value))
    return out
