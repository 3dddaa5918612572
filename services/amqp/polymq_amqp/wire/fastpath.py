"""The hot frames of the AMQP codec, without pamqp's generic decoding.

A basic.publish comes with a content header and body frames, once per message; pamqp
decodes them argument by argument through its type tables. :func:`decode_publish` and
:func:`decode_properties` give the same objects (the unit tests compare them with pamqp's,
field by field) in a fraction of the time; anything unusual (a headers table that is not
empty, a timestamp, more than one word of property flags) goes to pamqp.

:class:`ContentReader` takes a publish's content header and body frames straight from the
codec's buffer, in one pass, once its method frame is decoded; it gives up (and the codec
reads frame by frame, with every check and its reply code) at anything but the common
case: all the frames there, on the publish's channel, well formed, within frame-max and the
size limit, the properties decodable. Consecutive publishes mostly carry the same
properties: the last ones decoded (without a headers table) are kept and given again for
the same bytes (the codec's events are read, never changed); so is the last publish method.
:meth:`ContentReader.more` then takes the publishes right after one that repeat it (the same
method bytes, the same kept properties, one body frame each): the codec gives them as one
event, and the frontend handles the run at once.

Field tables nest tables and arrays: pamqp decodes them by recursion, and what the frontend
does with them after (text and JSON for the other protocols, encoding them again for a
delivery) recurses too. :func:`check_nesting` refuses a table nested more than
:data:`MAX_TABLE_DEPTH` deep right after pamqp decoded it (content headers here, method
arguments in the codec), so that a message taken is always deliverable again.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from pamqp import commands, decode

from polymq_server.messages.nesting import nests_deeper

__all__ = [
    "MAX_TABLE_DEPTH",
    "ContentReader",
    "check_nesting",
    "decode_properties",
    "decode_publish",
]

MAX_TABLE_DEPTH: Final = 64  # field tables and arrays nested in one another

_FRAME_HEAD: Final = struct.Struct(">BHI")
_CONTENT_HEAD: Final = struct.Struct(">HHQ")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_FRAME_HEADER: Final = 2
_FRAME_BODY: Final = 3
_FRAME_END: Final = 0xCE
_FRAME_METHOD: Final = 1
_BASIC: Final = 60
_BASIC_HEAD: Final = b"\x00\x3c\x00\x00"  # a content header's class (basic) and weight (0)
_HEADERS: Final = 0x2000
_SIMPLE_PROPS: Final = 0xFFFE & ~0x0040  # every property but a timestamp (and more flag words)
# the content header's properties in their order (flag, attribute, 1: short string / 0: octet
# / 2: a field table, here only an empty one)
_PROPS: Final = (
    (0x8000, "content_type", 1),
    (0x4000, "content_encoding", 1),
    (_HEADERS, "headers", 2),
    (0x1000, "delivery_mode", 0),
    (0x0800, "priority", 0),
    (0x0400, "correlation_id", 1),
    (0x0200, "reply_to", 1),
    (0x0100, "expiration", 1),
    (0x0080, "message_id", 1),
    (0x0020, "message_type", 1),
    (0x0010, "user_id", 1),
    (0x0008, "app_id", 1),
    (0x0004, "cluster_id", 1),
)
_PROPERTY_NAMES: Final = tuple(commands.Basic.Properties.__slots__)


def decode_publish(payload: bytes) -> commands.Basic.Publish:
    """basic.publish from a method frame's payload (class and method ids included), as
    pamqp's ``unmarshal`` would make it (short strings are cut where the payload ends, as
    pamqp does; a missing length or bit octet raises)."""
    method: commands.Basic.Publish = object.__new__(commands.Basic.Publish)
    (method.ticket,) = _U16.unpack_from(payload, 4)
    n = payload[6]
    end = 7 + n
    method.exchange = payload[7:end].decode("utf-8")
    n = payload[end]
    start = end + 1
    end = start + n
    method.routing_key = payload[start:end].decode("utf-8")
    bits = payload[end]
    method.mandatory = bool(bits & 1)
    method.immediate = bool(bits & 2)
    return method


def decode_properties(payload: bytes) -> commands.Basic.Properties:
    """The properties of a content header frame's payload (class, weight and size first).
    ValueError if the values do not fill the payload exactly (a string longer than what
    is left, bytes after the last one), as RabbitMQ refuses them: pamqp would cut the
    string and ignore the rest, and the message would carry what its client never sent."""
    (flags,) = _U16.unpack_from(payload, 12)
    if flags & ~_SIMPLE_PROPS:  # a timestamp, or more flag words
        return _pamqp_properties(payload)
    props: commands.Basic.Properties = object.__new__(commands.Basic.Properties)
    for name in _PROPERTY_NAMES:
        setattr(props, name, None)
    props.cluster_id = ""  # (pamqp's default)
    if not flags:
        return props
    offset = 14
    for flag, name, kind in _PROPS:
        if flags & flag:
            if kind == 1:
                n = payload[offset]
                start = offset + 1
                offset = start + n
                setattr(props, name, payload[start:offset].decode("utf-8"))
            elif kind == 2:  # a table: an empty one (aio-pika sends one) here, else pamqp
                if _U32.unpack_from(payload, offset)[0]:
                    return _pamqp_properties(payload)
                props.headers = {}
                offset += 4
            else:
                setattr(props, name, payload[offset])
                offset += 1
    _filled(payload, offset)
    return props


def _filled(payload: bytes, offset: int) -> None:
    if offset != len(payload):
        what = "longer than" if offset > len(payload) else "shorter than"
        raise ValueError(f"the properties are {what} the content header frame")


def _pamqp_properties(payload: bytes) -> commands.Basic.Properties:
    props = commands.Basic.Properties()
    flags = 0
    offset = 12
    word = 0
    while True:  # property flags: 15 bits a word, the lowest bit says another follows
        (part,) = _U16.unpack_from(payload, offset)
        offset += 2
        flags |= part << (16 * word)
        word += 1
        if not part & 1:
            break
    for name in props.__slots__:  # pamqp's unmarshal, minding where the values end
        if flags & props.flags[name]:
            consumed, value = decode.by_type(payload[offset:], getattr(props, "_" + name))
            setattr(props, name, value)
            offset += consumed
    _filled(payload, offset)
    check_nesting(props.headers)
    return props


def check_nesting(value: Any) -> None:
    """ValueError if ``value`` nests tables (dicts) and arrays (lists) more than
    :data:`MAX_TABLE_DEPTH` deep (checked without recursion)."""
    if nests_deeper(value, MAX_TABLE_DEPTH):
        raise ValueError(f"field tables and arrays nested more than {MAX_TABLE_DEPTH} deep")


class ContentReader:
    """Reads a basic.publish's content from the buffer in one pass (see the module)."""

    __slots__ = ("_method", "_method_raw", "_props", "_raw")

    def __init__(self) -> None:
        self._raw = b""  # the last content header's properties (flags and values)...
        self._props: commands.Basic.Properties | None = None  # ...decoded
        self._method_raw = b""  # the last basic.publish method payload...
        self._method: commands.Basic.Publish | None = None  # ...decoded

    def publish(self, payload: bytes) -> commands.Basic.Publish:
        """:func:`decode_publish`, given again (the same object) for the same payload as the
        last one (the codec's events are read, never changed)."""
        if payload == self._method_raw and self._method is not None:
            return self._method
        method = decode_publish(payload)  # (raises before anything is kept)
        self._method_raw = payload
        self._method = method
        return method

    def take(
        self, buf: bytearray, pos: int, channel: int, frame_max: int, max_body: int
    ) -> tuple[commands.Basic.Properties, bytes, int] | None:
        """The properties and body of the content header and body frames at ``pos`` of
        ``buf``, and where the frames after them start; None (nothing read) unless they are
        all there and all as they should be."""
        have = len(buf)
        if have - pos < 7:
            return None
        kind, ch, size = _FRAME_HEAD.unpack_from(buf, pos)
        end = pos + 7 + size
        if (
            kind != _FRAME_HEADER
            or ch != channel
            or size + 8 > frame_max
            or size < 14
            or end >= have
            or buf[end] != _FRAME_END
        ):
            return None
        class_id, _weight, body_size = _CONTENT_HEAD.unpack_from(buf, pos + 7)
        if class_id != _BASIC or body_size > max_body:
            return None
        raw = bytes(buf[pos + 19 : end])
        if raw == self._raw and self._props is not None:
            props = self._props
        else:
            try:
                props = decode_properties(bytes(buf[pos + 7 : end]))
            except Exception:  # the codec answers it, frame by frame
                return None
            if not raw[0] & 0x20:  # kept unless it holds a headers table (a dict)
                self._raw = raw
                self._props = props
        pos = end + 1
        if not body_size:
            return props, b"", pos
        chunks: list[bytes] = []
        received = 0
        while received < body_size:
            if have - pos < 7:
                return None
            kind, ch, size = _FRAME_HEAD.unpack_from(buf, pos)
            end = pos + 7 + size
            if (
                kind != _FRAME_BODY
                or ch != channel
                or size + 8 > frame_max
                or end >= have
                or buf[end] != _FRAME_END
            ):
                return None
            received += size
            if received > body_size:
                return None
            chunks.append(bytes(buf[pos + 7 : end]))
            pos = end + 1
        return props, chunks[0] if len(chunks) == 1 else b"".join(chunks), pos

    def more(
        self,
        buf: bytearray,
        pos: int,
        channel: int,
        props: commands.Basic.Properties,
        frame_max: int,
        max_body: int,
        limit: int,
    ) -> tuple[list[bytes], int]:
        """The bodies of the publishes at ``pos`` of ``buf`` that repeat the last one read
        (by :meth:`publish` and :meth:`take`, which gave ``props``): on ``channel``, the same
        method payload, a content header with the same properties, one body frame (or none),
        every frame there and well formed, within frame-max and the size limit; at most
        ``limit`` of them. And where the frames after them start. It stops, without reading
        it, at the first publish that differs in anything: :meth:`take` reads that one."""
        method_raw = self._method_raw
        props_raw = self._raw
        if props is not self._props or not method_raw or not props_raw:
            return [], pos
        # the method frame, whole; the content header frame up to its body size, and after it
        method_frame = _FRAME_HEAD.pack(_FRAME_METHOD, channel, len(method_raw)) + method_raw
        method_frame += b"\xce"
        mlen = len(method_frame)
        hsize = 12 + len(props_raw)
        if hsize + 8 > frame_max:  # (take() read the first one: it is not)
            return [], pos
        header_head = _FRAME_HEAD.pack(_FRAME_HEADER, channel, hsize) + _BASIC_HEAD
        header_tail = props_raw + b"\xce"
        tail = 19 + len(header_tail)
        body_head = bytes((_FRAME_BODY,)) + channel.to_bytes(2, "big")
        have = len(buf)
        bodies: list[bytes] = []
        body_max = min(max_body, frame_max - 8)
        startswith = buf.startswith
        size_at = _U64.unpack_from
        while len(bodies) < limit:
            h = pos + mlen  # the content header frame
            b = h + tail  # the body frame
            if (
                b > have
                or not startswith(method_frame, pos)
                or not startswith(header_head, h)
                or not startswith(header_tail, h + 19)
            ):
                break
            (size,) = size_at(buf, h + 11)
            if size > body_max:
                break
            if not size:
                bodies.append(b"")
                pos = b
                continue
            end = b + 7 + size
            if (
                end >= have
                or not startswith(body_head, b)
                or _U32.unpack_from(buf, b + 3)[0] != size
                or buf[end] != _FRAME_END
            ):
                break
            bodies.append(bytes(buf[b + 7 : end]))
            pos = end + 1
        return bodies, pos
