"""AMQP message properties and polymq messages, both ways.

A basic.publish becomes a :class:`polymq.types.Message`; a delivered message becomes the
properties of a basic.deliver, basic.get-ok or basic.return (encoded here, as the payload of
a content header after its class, weight and size).

==========================  =====================================================================
AMQP property               polymq message
==========================  =====================================================================
``content_type``            ``content_type`` (``application/octet-stream`` when absent; an
                            AMQP consumer then sees none again)
``headers``                 ``headers``: strings as they are; other values as text for STOMP
                            and HTTP (``42``, ``true``, JSON for tables), with their AMQP types
                            kept in the ``x-amqp-typed`` header for AMQP consumers
``delivery_mode``           ``persistent`` (2 = persistent)
``priority``                ``priority``, 0..9 (above 9 counts as 9; absent is 0, as in
                            RabbitMQ); a consumer sees it exactly as published, 0 and
                            values above 9 included (kept in ``x-amqp-typed`` as ``p``),
                            and none where the publisher set none
``correlation_id``          ``correlation_id``
``reply_to``                ``reply_to`` in the core's form, ``queue/<name>`` (STOMP shows
                            ``/queue/<name>``); a core ``queue/x`` comes back as ``x``;
                            a direct reply-to name is its core topic (``replyto.py``)
``expiration``              ``expires`` (now + the milliseconds), and ``amqp-expiration``
``content_encoding``        header ``content-encoding``
``message_id``              header ``amqp-message-id`` (the core's own id is another)
``timestamp``               header ``amqp-timestamp`` (unix seconds); absent: none for a
                            message published over AMQP (as RabbitMQ: the publisher's
                            properties, nothing added), the core's time for one from
                            another protocol
``type``                    header ``amqp-type``
``user_id``                 header ``amqp-user-id``
``app_id``                  header ``amqp-app-id``
==========================  =====================================================================

The exchange and routing key a message was published with travel in the headers
``x-amqp-exchange`` and ``x-amqp-routing-key``, so that a delivery can name them. A message
published by another protocol is delivered with exchange ``""`` and its queue's name as the
routing key (or, from a topic in the ``amqp.`` namespace, that topic's exchange and key).
A dead-lettered message also carries RabbitMQ's ``x-death`` and ``x-first-death-*`` headers,
made from the core's ``x-death-reason`` and ``x-original-destination``.
"""

from __future__ import annotations

import datetime
import json
import math
import struct
import time
from typing import Any, Final

from pamqp import commands

from polymq.types import MAX_PRIORITY, Message
from polymq_server.messages.headers import AMQP_EXCHANGE, AMQP_ROUTING_KEY, AMQP_TYPED, BOOKKEEPING
from polymq_server.names import VhostNames

from . import replyto
from .errors import PRECONDITION_FAILED, ChannelException
from .wire.tables import encode_table, from_tagged, to_tagged, to_text

__all__ = [
    "H_EXCHANGE",
    "H_ROUTING_KEY",
    "H_TYPED",
    "PublishTemplate",
    "delivery_properties",
    "from_publish",
]

H_EXCHANGE: Final = AMQP_EXCHANGE
H_ROUTING_KEY: Final = AMQP_ROUTING_KEY
H_TYPED: Final = AMQP_TYPED
_INTERNAL: Final = BOOKKEEPING
_MAPPED: Final = {
    "content-encoding": "content_encoding",
    "amqp-message-id": "message_id",
    "amqp-type": "message_type",
    "amqp-user-id": "user_id",
    "amqp-app-id": "app_id",
    "amqp-timestamp": "timestamp",
    "amqp-expiration": "expiration",
}
_DEATH_REASONS: Final = {
    "expired": "expired",
    "rejected": "rejected",
    "max-length": "maxlen",
    "max-deliveries": "delivery_limit",
}
_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")
_DEFAULT_TYPE: Final = "application/octet-stream"
_NO_CONTENT_TYPE: Final = '{"noct":true}'  # the common meta, made and read without json


def from_publish(
    props: commands.Basic.Properties,
    body: bytes,
    exchange: str,
    routing_key: str,
    names: VhostNames,
) -> Message:
    """The polymq message of a basic.publish; ChannelException 406 for a bad expiration."""
    headers: dict[str, str] = {}
    typed: dict[str, Any] = {}
    table = props.headers
    if table:
        for name, value in table.items():
            if name in _INTERNAL:
                continue
            if isinstance(value, str):
                headers[name] = value
            else:
                headers[name] = to_text(value)
                typed[name] = to_tagged(value)
    headers[H_EXCHANGE] = exchange
    headers[H_ROUTING_KEY] = routing_key
    meta: dict[str, Any] = {}
    if typed:
        meta["h"] = typed
    priority = props.priority
    if priority is not None and not 0 < priority <= MAX_PRIORITY:
        meta["p"] = priority  # what the core's priority cannot tell: 0 given, or above 9
    content_type = props.content_type
    if not content_type:
        content_type = _DEFAULT_TYPE
        meta["noct"] = True
    if typed or "p" in meta:
        headers[H_TYPED] = json.dumps(meta, separators=(",", ":"), ensure_ascii=False)
    elif meta:
        headers[H_TYPED] = _NO_CONTENT_TYPE
    if props.content_encoding:
        headers["content-encoding"] = props.content_encoding
    if props.message_id:
        headers["amqp-message-id"] = props.message_id
    if props.message_type:
        headers["amqp-type"] = props.message_type
    if props.user_id:
        headers["amqp-user-id"] = props.user_id
    if props.app_id:
        headers["amqp-app-id"] = props.app_id
    if props.timestamp is not None:
        headers["amqp-timestamp"] = to_text(props.timestamp)
    expires: float | None = None
    if props.expiration:
        ms = _expiration(props.expiration)
        headers["amqp-expiration"] = props.expiration
        expires = time.time() + ms / 1000.0
    reply_to = props.reply_to
    return Message(
        body=body,
        content_type=content_type,
        headers=headers,
        priority=0 if priority is None else min(int(priority), MAX_PRIORITY),
        persistent=props.delivery_mode == 2,
        expires=expires,
        correlation_id=props.correlation_id or None,
        reply_to=_reply_to_core(reply_to, names) if reply_to else None,
    )


class PublishTemplate:
    """:func:`from_publish` for a run of publishes with the same properties object (the
    codec gives the same one again for the same property bytes), exchange, routing key and
    vhost: the first message's fields are kept and each next message gets them with a copy
    of their headers (never the same dict) and, with an expiration, its own ``expires``.
    Properties with a headers table are not kept (a table is a dict: it could change)."""

    __slots__ = ("_exchange", "_expiration_ms", "_message", "_names", "_props", "_routing_key")

    def __init__(self) -> None:
        self._props: commands.Basic.Properties | None = None
        self._exchange = ""
        self._routing_key = ""
        self._names: VhostNames | None = None
        self._message: Message | None = None
        self._expiration_ms: int | None = None

    def message(
        self,
        props: commands.Basic.Properties,
        body: bytes,
        exchange: str,
        routing_key: str,
        names: VhostNames,
    ) -> Message:
        """What ``from_publish(props, body, exchange, routing_key, names)`` gives."""
        t = self._message
        if (
            t is not None
            and props is self._props
            and routing_key == self._routing_key
            and exchange == self._exchange
            and names is self._names
        ):
            ms = self._expiration_ms
            return Message(
                body,
                t.content_type,
                t.headers.copy(),
                t.priority,
                t.persistent,
                None if ms is None else time.time() + ms / 1000.0,
                None,
                t.correlation_id,
                t.reply_to,
            )
        message = from_publish(props, body, exchange, routing_key, names)
        if props.headers:
            self._message = self._props = None
            return message
        self._props = props
        self._exchange = exchange
        self._routing_key = routing_key
        self._names = names
        self._expiration_ms = _expiration(props.expiration) if props.expiration else None
        self._message = Message(
            b"",
            message.content_type,
            message.headers.copy(),
            message.priority,
            message.persistent,
            None,
            None,
            message.correlation_id,
            message.reply_to,
        )
        return message


def _expiration(raw: str) -> int:
    v = raw.strip()
    if not (v.isascii() and v.isdigit()) or len(v) > 12:
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid expiration {raw[:40]!r}: expected milliseconds as a non-negative integer",
        )
    return int(v)


def _reply_to_core(reply_to: str, names: VhostNames) -> str:
    if reply_to.startswith(replyto.PREFIX):
        topic = replyto.core_topic(reply_to)
        if topic is not None:
            return topic
    try:
        return names.queue(reply_to)
    except ValueError:
        return reply_to  # too long for a core name: carried as it is


def route_of(message: Message, names: VhostNames) -> tuple[str, str]:
    """The exchange and routing key to show for a delivered ``message``."""
    h = message.headers
    exchange = h.get(H_EXCHANGE)
    if exchange is not None and "x-death-reason" not in h:
        return exchange, h.get(H_ROUTING_KEY, "")
    # published by another protocol, or dead-lettered: where it was sent says (a message
    # routed through a binding keeps the topic it was published to)
    dest = message.destination
    if dest.startswith("queue/"):
        name = names.queue_of(dest)
        return "", name if name is not None else dest[6:]
    if dest.startswith("topic/"):
        route = names.route_of(dest)
        if route is not None:
            return route
        return "", dest[6:]
    return "", dest


def delivery_properties(message: Message, names: VhostNames) -> bytes:
    """The encoded properties (flags, then values) of a content header for ``message``."""
    h = message.headers
    meta: dict[str, Any] = {}
    raw_meta = h.get(H_TYPED)
    if raw_meta == _NO_CONTENT_TYPE:
        meta = {"noct": True}
    elif raw_meta:
        try:
            loaded = json.loads(raw_meta)
            if isinstance(loaded, dict):
                meta = loaded
        except (ValueError, RecursionError):  # a header nested too deeply is no metadata
            meta = {}
    typed = meta.get("h") if isinstance(meta.get("h"), dict) else {}
    mapped: dict[str, str] = {}
    table: dict[str, Any] = {}
    for name, value in h.items():
        if name in _INTERNAL:
            continue
        prop = _MAPPED.get(name)
        if prop is not None:
            mapped[prop] = value
            continue
        t = typed.get(name) if typed else None
        if t is not None:
            try:
                v = from_tagged(t)
            except (ValueError, TypeError):
                table[name] = value
            else:
                # restored unless another protocol changed the text meanwhile
                table[name] = v if to_text(v) == value else value
        else:
            table[name] = value
    if "x-death-reason" in h:
        _add_death(table, message, names)

    flags = 0
    parts: list[bytes] = []
    content_type = message.content_type
    if content_type and not (meta.get("noct") and content_type == _DEFAULT_TYPE):
        flags |= 0x8000
        parts.append(_shortstr(content_type))
    enc = mapped.get("content_encoding")
    if enc:
        flags |= 0x4000
        parts.append(_shortstr(enc))
    if table:
        flags |= 0x2000
        parts.append(encode_table(table))
    flags |= 0x1000
    parts.append(b"\x02" if message.persistent else b"\x01")
    shown = meta.get("p")
    if not (type(shown) is int and 0 <= shown <= 255):
        # 0 is the default that absent means: not invented
        shown = message.priority if message.priority > 0 else None
    if shown is not None:
        flags |= 0x0800
        parts.append(bytes((shown,)))
    if message.correlation_id is not None:
        flags |= 0x0400
        parts.append(_shortstr(message.correlation_id))
    if message.reply_to is not None:
        flags |= 0x0200
        reply = message.reply_to
        if reply.startswith("queue/"):
            queue = names.queue_of(reply)
            reply = queue if queue is not None else reply
        elif reply.startswith(replyto.CORE_PREFIX):
            reply = replyto.amqp_name(reply) or reply
        parts.append(_shortstr(reply))
    expiration = mapped.get("expiration")
    if expiration is None and message.expires is not None:
        expiration = str(max(0, math.ceil((message.expires - time.time()) * 1000)))
    if expiration is not None:
        flags |= 0x0100
        parts.append(_shortstr(expiration))
    mid = mapped.get("message_id")
    if mid:
        flags |= 0x0080
        parts.append(_shortstr(mid))
    ts = _int(mapped.get("timestamp"))
    if ts is None and message.timestamp and H_EXCHANGE not in h:  # from another protocol
        ts = int(message.timestamp)
    if ts is not None:
        flags |= 0x0040
        parts.append(_U64.pack(max(0, ts)))
    for flag, prop in ((0x0020, "message_type"), (0x0010, "user_id"), (0x0008, "app_id")):
        v = mapped.get(prop)
        if v:
            flags |= flag
            parts.append(_shortstr(v))
    return _U16.pack(flags) + b"".join(parts)


def _shortstr(s: str) -> bytes:
    data = s.encode("utf-8", "surrogatepass")
    if len(data) > 255:
        data = data[:255].decode("utf-8", "ignore").encode("utf-8")
    return bytes((len(data),)) + data


def _int(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        return None


def _add_death(table: dict[str, Any], message: Message, names: VhostNames) -> None:
    """RabbitMQ's ``x-death`` (one entry) and ``x-first-death-*`` from the core's headers."""
    h = message.headers
    reason = _DEATH_REASONS.get(h.get("x-death-reason", ""), h.get("x-death-reason", ""))
    original = h.get("x-original-destination", "")
    name = names.queue_of(original) if original.startswith("queue/") else None
    queue = name if name is not None else original
    exchange = h.get(H_EXCHANGE, "")
    routing_key = h.get(H_ROUTING_KEY, "")
    table.setdefault(
        "x-death",
        [
            {
                "count": 1,
                "reason": reason,
                "queue": queue,
                "time": datetime.datetime.fromtimestamp(
                    int(message.timestamp or time.time()), tz=datetime.UTC
                ),
                "exchange": exchange,
                "routing-keys": [routing_key],
            }
        ],
    )
    table.setdefault("x-first-death-reason", reason)
    table.setdefault("x-first-death-queue", queue)
    table.setdefault("x-first-death-exchange", exchange)
