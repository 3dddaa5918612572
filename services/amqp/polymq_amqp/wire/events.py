"""What the AMQP codec reads off the wire, as frozen dataclasses (as h11's ``_events.py``).

``Method`` and ``Content`` hold pamqp's method objects (the spec's classes, decoded);
``Content`` is a basic.publish with its header and body frames put together; ``ContentRun``
is a run of them that differ only in their bodies (what a client publishing in a loop sends).
"""

from __future__ import annotations

from dataclasses import dataclass

from pamqp import base, commands

__all__ = [
    "ConnectionClosed",
    "Content",
    "ContentRun",
    "Event",
    "Heartbeat",
    "Method",
    "NeedData",
    "OversizedContent",
    "ProtocolHeader",
]


@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    """``AMQP\\x00\\x00\\x09\\x01``: the client speaks AMQP 0-9-1."""


@dataclass(frozen=True, slots=True)
class Method:
    """A method frame (not a basic.publish, which comes as :class:`Content`)."""

    channel: int
    method: base.Frame


@dataclass(frozen=True, slots=True)
class Content:
    """A basic.publish, its content header and the whole body."""

    channel: int
    method: commands.Basic.Publish
    properties: commands.Basic.Properties
    body: bytes


@dataclass(frozen=True, slots=True)
class ContentRun:
    """Consecutive basic.publishes on one channel with the same method (exchange, routing
    key, flags) and the same properties, in one event: their bodies, in order (two or
    more). Handling it must be what handling a :class:`Content` per body would be."""

    channel: int
    method: commands.Basic.Publish
    properties: commands.Basic.Properties
    bodies: list[bytes]


@dataclass(frozen=True, slots=True)
class OversizedContent:
    """A basic.publish whose body was over the size limit; the body was read and dropped."""

    channel: int
    method: commands.Basic.Publish
    size: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A heartbeat frame."""


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The client closed its side of the stream."""


@dataclass(frozen=True, slots=True)
class NeedData:
    """More bytes are needed before the next event."""


Event = (
    ProtocolHeader | Method | Content | ContentRun | OversizedContent | Heartbeat | ConnectionClosed
)
