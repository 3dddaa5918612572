"""The basic.deliver frames of one consumer, made a run of messages at a time (sans-IO).

A delivery's frames are what ``AmqpConnection.send_content`` makes of a pamqp
``Basic.Deliver``, byte for byte: a method frame
(the consumer tag, the delivery tag, redelivered, the exchange and routing key shown), a
content header (the message's properties, see ``properties.py``) and the body in frames of
at most frame_max. Most of that is the same from one message to the next: only the delivery
tag, the redelivered flag, the body and its size change. :class:`DeliverFrames` keeps the
rest per *shape* of message, the fields that the exchange, routing key and properties are
made of:

- the headers (names, values and their order: the order of the headers table),
- ``content_type``, ``persistent``, ``priority``, ``correlation_id``, ``reply_to``,
- ``destination`` (the route shown for messages that came from another protocol),
- the timestamp's whole second (the ``timestamp`` property, and ``x-death``'s time).

What depends on the clock is never kept: a message with an ``expires`` but no
``amqp-expiration`` header (its remaining time is computed as it goes out), and a
dead-lettered message without a timestamp (``x-death`` then takes the time of now). The
cache is bounded (:data:`MAX_SHAPES` shapes per consumer, :data:`MAX_SIZES` body sizes per
shape): past the bound it starts again empty.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from pamqp import constants

from polymq.types import Message
from polymq_server.names import VhostNames

from .properties import delivery_properties, route_of

__all__ = ["MAX_SHAPES", "MAX_SIZES", "DeliverFrames", "shown_route"]

MAX_SHAPES: Final = 64
MAX_SIZES: Final = 32

_FRAME_HEAD: Final = struct.Struct(">BHI")
_U64: Final = struct.Struct(">Q")
_DELIVER_ID: Final = b"\x00\x3c\x00\x3c"  # basic.deliver
_CLASS_WEIGHT: Final = b"\x00\x3c\x00\x00"  # content header: class basic, weight 0
_END: Final = b"\xce"
_MAX_TIMESTAMP: Final = 1e15  # past it (or NaN, or negative) a timestamp is not cached
_EXCHANGE_RE: Final = constants.DOMAIN_REGEX["exchange-name"]


def shown_route(message: Message, names: VhostNames) -> tuple[str, str]:
    """The exchange and routing key a delivery shows, as AMQP short strings can carry them
    (headers written by another protocol may name anything)."""
    exchange, routing_key = route_of(message, names)
    if len(exchange) > 127 or not _EXCHANGE_RE.fullmatch(exchange):
        exchange = ""
    if len(routing_key.encode("utf-8", "surrogatepass")) > 255:
        routing_key = routing_key.encode("utf-8", "surrogatepass")[:255].decode("utf-8", "ignore")
    return exchange, routing_key


class _Shape:
    """The frames of a basic.deliver but the delivery tag, redelivered and the body."""

    __slots__ = ("channel", "head", "mid", "props_end", "sized")

    def __init__(
        self, channel: int, ctag: bytes, exchange: str, routing_key: str, props: bytes
    ) -> None:
        ex = exchange.encode("utf-8")
        rk = routing_key.encode("utf-8")
        size = len(_DELIVER_ID) + 1 + len(ctag) + 8 + 1 + 1 + len(ex) + 1 + len(rk)
        self.channel = channel
        # method frame up to the delivery tag
        self.head = b"".join(
            (_FRAME_HEAD.pack(1, channel, size), _DELIVER_ID, bytes((len(ctag),)), ctag)
        )
        # after the delivery tag: redelivered, exchange, routing key; the content header
        # frame up to the body size
        after = b"".join(
            (
                bytes((len(ex),)),
                ex,
                bytes((len(rk),)),
                rk,
                _END,
                _FRAME_HEAD.pack(2, channel, 12 + len(props)),
                _CLASS_WEIGHT,
            )
        )
        self.mid = (b"\x00" + after, b"\x01" + after)
        self.props_end = props + _END
        # body size -> the body size, the properties and the body frame's head
        self.sized: dict[int, bytes] = {}

    def size_part(self, size: int) -> bytes:
        part = b"".join(
            (_U64.pack(size), self.props_end, _FRAME_HEAD.pack(3, self.channel, size))
            if size
            else (_U64.pack(0), self.props_end)
        )
        sized = self.sized
        if len(sized) >= MAX_SIZES:
            sized.clear()
        sized[size] = part
        return part


class DeliverFrames:
    """The basic.deliver frames of one consumer (``consumer_tag`` on ``channel``)."""

    __slots__ = ("_channel", "_ctag", "_names", "_shapes")

    def __init__(self, channel: int, consumer_tag: str, names: VhostNames) -> None:
        self._channel = channel
        self._ctag = consumer_tag.encode("utf-8")
        self._names = names
        self._shapes: dict[tuple[object, ...], _Shape] = {}

    @property
    def cached(self) -> int:
        """How many shapes are kept."""
        return len(self._shapes)

    def _shape(self, message: Message) -> _Shape:
        names = self._names
        exchange, routing_key = shown_route(message, names)
        props = delivery_properties(message, names)
        return _Shape(self._channel, self._ctag, exchange, routing_key, props)

    def frames(
        self, out: list[bytes], first_tag: int, messages: Sequence[Message], frame_max: int
    ) -> None:
        """Append to ``out`` the frames of ``messages``, with delivery tags from
        ``first_tag`` on, in bodies of at most ``frame_max`` frames."""
        shapes = self._shapes
        step = frame_max - 8
        tag = first_tag
        pack = _U64.pack
        for m in messages:
            h = m.headers
            ts = m.timestamp
            if ts:
                second: int | None = int(ts) if 0 < ts < _MAX_TIMESTAMP else None
                cacheable = second is not None
            else:
                second = None
                cacheable = "x-death-reason" not in h
            if m.expires is not None and "amqp-expiration" not in h:
                cacheable = False
            if cacheable:
                key = (
                    m.destination,
                    m.content_type,
                    m.persistent,
                    m.priority,
                    m.correlation_id,
                    m.reply_to,
                    second,
                    *h.items(),
                )
                shape = shapes.get(key)
                if shape is None:
                    shape = self._shape(m)
                    if len(shapes) >= MAX_SHAPES:
                        shapes.clear()
                    shapes[key] = shape
            else:
                shape = self._shape(m)
            body = m.body
            size = len(body)
            if size <= step:
                sized = shape.sized.get(size)
                if sized is None:
                    sized = shape.size_part(size)
                if size:
                    out += (
                        shape.head,
                        pack(tag),
                        shape.mid[m.delivery_count > 1],
                        sized,
                        body,
                        _END,
                    )
                else:
                    out += (shape.head, pack(tag), shape.mid[m.delivery_count > 1], sized)
            else:
                out += (
                    shape.head,
                    pack(tag),
                    shape.mid[m.delivery_count > 1],
                    pack(size),
                    shape.props_end,
                )
                channel = self._channel
                for i in range(0, size, step):
                    chunk = body[i : i + step]
                    out += (_FRAME_HEAD.pack(3, channel, len(chunk)), chunk, _END)
            tag += 1
