"""polymq messages and AMQP messages, both ways, for the RabbitMQ bridge (pure functions).

==========================  =====================================  ===========================
polymq                      AMQP (RabbitMQ)                        notes
==========================  =====================================  ===========================
body                        body                                   bytes as they are
content_type                content_type                           absent -> octet-stream
headers (str -> str)        headers (table)                        non-str AMQP values become
                                                                   text (JSON for lists/tables)
priority 0..9               priority                               above 9 -> 9 (absent: 0)
persistent                  delivery_mode 2 (1 when transient)
expires (unix time)         expiration (ms from now, as text)      the TTL restarts on arrival
correlation_id              correlation_id
reply_to                    reply_to                               carried verbatim
header ``amqp-message-id``  message_id                             polymq -> AMQP: else the
                                                                   polymq message id
header ``amqp-timestamp``   timestamp (unix seconds)               polymq -> AMQP: else the
                                                                   polymq publish time
header ``content-encoding`` content_encoding
header ``type``             type
header ``app-id``           app_id
header ``user-id``          user_id -> header only                 RabbitMQ refuses a user_id
                                                                   other than the bridge's
==========================  =====================================  ===========================

The header names are those RabbitMQ's STOMP plugin uses for the same properties, so a STOMP
client of polymq sees what it would see on RabbitMQ. ``ack_timeout`` is polymq's alone and
does not cross.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import aio_pika
from aio_pika.abc import AbstractMessage, DeliveryMode

from polymq.types import DEFAULT_PRIORITY, MAX_PRIORITY, Message

__all__ = ["CARRIERS", "header_text", "to_amqp", "to_polymq"]

# polymq header -> the AMQP property it carries
CARRIERS = {
    "amqp-message-id": "message_id",
    "amqp-timestamp": "timestamp",
    "content-encoding": "content_encoding",
    "type": "type",
    "app-id": "app_id",
}
_USER_ID = "user-id"


def header_text(value: Any) -> str | None:
    """An AMQP table value as polymq header text (None: leave the header out)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return json.dumps(value, default=lambda v: header_text(v) or "", separators=(",", ":"))


def to_amqp(msg: Message, now: float) -> aio_pika.Message:
    """The AMQP message that carries ``msg`` (``now``: unix time, for the expiration)."""
    headers: dict[str, Any] = {}
    carried: dict[str, str] = {}
    for k, v in msg.headers.items():
        if k in CARRIERS:
            carried[CARRIERS[k]] = v
        else:
            headers[k] = v
    expiration: float | None = None
    if msg.expires is not None:
        expiration = max(0.0, msg.expires - now)
    timestamp: float | None = msg.timestamp or None
    raw_ts = carried.get("timestamp")
    if raw_ts is not None:
        try:
            timestamp = float(raw_ts)
        except ValueError:
            headers["amqp-timestamp"] = raw_ts  # not a number: keep it as a header
    return aio_pika.Message(
        msg.body,
        headers=headers or None,
        content_type=msg.content_type,
        content_encoding=carried.get("content_encoding"),
        delivery_mode=DeliveryMode.PERSISTENT if msg.persistent else DeliveryMode.NOT_PERSISTENT,
        priority=msg.priority,
        correlation_id=msg.correlation_id,
        reply_to=msg.reply_to,
        expiration=expiration,
        message_id=carried.get("message_id") or msg.id or None,
        timestamp=timestamp,
        type=carried.get("type"),
        app_id=carried.get("app_id"),
    )


def to_polymq(msg: AbstractMessage, now: float, *, always_persistent: bool = False) -> Message:
    """The polymq message that carries the AMQP message ``msg``."""
    headers: dict[str, str] = {}
    raw: Mapping[str, Any] = msg.headers or {}
    for k, v in raw.items():
        text = header_text(v)
        if text is not None:
            headers[str(k)] = text
    if msg.message_id is not None:
        headers["amqp-message-id"] = msg.message_id
    if msg.timestamp is not None:
        ts: Any = msg.timestamp
        headers["amqp-timestamp"] = str(
            int(ts.timestamp() if isinstance(ts, dt.datetime) else float(ts))
        )
    if msg.content_encoding:
        headers["content-encoding"] = msg.content_encoding
    if msg.type:
        headers["type"] = msg.type
    if msg.app_id:
        headers["app-id"] = msg.app_id
    if msg.user_id:
        headers[_USER_ID] = msg.user_id
    priority = DEFAULT_PRIORITY if msg.priority is None else min(max(msg.priority, 0), MAX_PRIORITY)
    expires = None
    exp: Any = msg.expiration
    if exp is not None:
        if isinstance(exp, dt.datetime):
            seconds = exp.timestamp() - now
        elif isinstance(exp, dt.timedelta):
            seconds = exp.total_seconds()
        else:
            seconds = float(exp)  # seconds: what aio-pika makes of the milliseconds
        expires = now + max(0.0, seconds)
    persistent = always_persistent or msg.delivery_mode == DeliveryMode.PERSISTENT
    return Message(
        body=bytes(msg.body),
        content_type=msg.content_type or "application/octet-stream",
        headers=headers,
        priority=priority,
        persistent=persistent,
        expires=expires,
        correlation_id=msg.correlation_id,
        reply_to=msg.reply_to,
    )
