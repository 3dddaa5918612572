"""The sans-IO AMQP 0-9-1 codec (server side): bytes in, events out, and back.

Like h11's ``Connection``, :class:`AmqpConnection` never touches a socket::

    conn = AmqpConnection(frame_max=131072, channel_max=2047, max_body=16 << 20)
    conn.receive_data(data)              # b"" means end of stream
    while not isinstance(event := conn.next_event(), NeedData):
        ...                              # ProtocolHeader, Method, Content, ContentRun, ...
    transport.write(conn.send_method(0, commands.Connection.Start(...)))

pamqp decodes and encodes the methods themselves; this module does the framing around
them (``type channel size payload 0xCE``), puts a basic.publish's content header and body
frames together, checks sizes as soon as a frame's header is read (a frame over frame-max is
refused before its payload arrives), and keeps the state of the connection and of each
channel by the one table of ``states.py``, :data:`~polymq_amqp.wire.states.TRANSITIONS`.

Bad input raises a :class:`~polymq_amqp.errors.ConnectionException` carrying the reply code
(501 frame error, 502 syntax error, 503 command invalid, 504 channel error, 505 unexpected
frame, 530 not allowed, 540 not implemented); a wrong protocol header raises
:class:`~polymq_amqp.errors.ProtocolHeaderMismatch` (answer with :data:`PROTOCOL_HEADER`).
After the server sent connection.close, everything but close and close-ok is discarded;
after it sent channel.close, that channel's frames but close and close-ok are discarded,
as the spec requires.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from pamqp import base, commands

from ..errors import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    ConnectionException,
    LocalProtocolError,
    ProtocolHeaderMismatch,
)
from .events import (
    ConnectionClosed,
    Content,
    ContentRun,
    Event,
    Heartbeat,
    Method,
    NeedData,
    OversizedContent,
    ProtocolHeader,
)
from .fastpath import ContentReader, check_nesting, decode_properties, decode_publish
from .states import (
    CLASSES,
    CLIENT_METHODS,
    RECV_TRIGGERS,
    SEND_TRIGGERS,
    TRANSITIONS,
    WAIT_FOR,
    State,
    Trigger,
    method_name,
)

__all__ = [
    "FRAME_MIN_SIZE",
    "NEED_DATA",
    "PROTOCOL_HEADER",
    "TRANSITIONS",
    "AmqpConnection",
    "State",
    "Trigger",
]

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_MIN_SIZE: Final = 4096
NEED_DATA: Final = NeedData()

_FRAME_HEAD: Final = struct.Struct(">BHI")
_METHOD_ID: Final = struct.Struct(">HH")
_CONTENT_HEAD: Final = struct.Struct(">HHQ")
_INDEX: Final = struct.Struct(">I")
_HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"
_BASIC: Final = 60
_PUBLISH_INDEX: Final = 0x003C0028
_PUBLISH_ID: Final = b"\x00\x3c\x00\x28"  # basic.publish
_MAX_RUN: Final = 4096  # publishes in one ContentRun at most


@dataclass(slots=True)
class _Partial:
    """A basic.publish waiting for its content header and body frames."""

    method: commands.Basic.Publish
    properties: commands.Basic.Properties | None = None
    size: int = 0
    received: int = 0
    chunks: list[bytes] = field(default_factory=list)
    oversized: bool = False


class AmqpConnection:
    """The server side of one AMQP 0-9-1 connection, without I/O."""

    def __init__(
        self, *, frame_max: int = 131072, channel_max: int = 2047, max_body: int = 16 << 20
    ) -> None:
        self.state = State.AWAIT_HEADER
        self.frame_max = frame_max  # what we accept and send; lowered by tune-ok
        self.channel_max = channel_max
        self.max_body = max_body
        self.heartbeat = 0  # seconds, as tune-ok said
        self.channels: dict[int, State] = {}
        self._buf = bytearray()
        self._pos = 0  # bytes of _buf already read
        self._eof = False
        self._partial: dict[int, _Partial] = {}
        self._reader = ContentReader()

    # ---- state ---------------------------------------------------------------------------
    def _fire(self, trigger: Trigger) -> None:
        new = TRANSITIONS.get((self.state, trigger))
        if new is None:
            raise LocalProtocolError(f"{trigger.value} is not allowed in state {self.state.value}")
        self.state = new

    def channel_state(self, channel: int) -> State:
        return self.channels.get(channel, State.CHANNEL_CLOSED)

    def _fire_channel(self, channel: int, trigger: Trigger) -> None:
        new = TRANSITIONS.get((self.channel_state(channel), trigger))
        if new is None:
            raise LocalProtocolError(
                f"{trigger.value} on channel {channel} is not allowed in state "
                f"{self.channel_state(channel).value}"
            )
        if new is State.CHANNEL_CLOSED:
            self.channels.pop(channel, None)
            self._partial.pop(channel, None)
        else:
            self.channels[channel] = new

    # ---- reading -------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        if data:
            self._buf += data
        else:
            self._eof = True

    def next_event(self) -> Event | NeedData:
        """The next event, or :data:`NEED_DATA`. Raises ConnectionException on bad input."""
        while True:
            event = self._next()
            if event is not None:
                return event

    def _next(self) -> Event | NeedData | None:
        if self.state is State.AWAIT_HEADER:
            return self._header()
        buf = self._buf
        pos = self._pos
        have = len(buf) - pos
        if have < 7:
            return self._need()
        kind, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
        if size + 8 > self.frame_max:
            raise ConnectionException(
                FRAME_ERROR,
                f"frame of {size + 8} bytes exceeds the negotiated frame_max of "
                f"{self.frame_max} bytes",
            )
        if have < size + 8:
            return self._need()
        end = pos + size + 7
        if buf[end] != FRAME_END:
            raise ConnectionException(FRAME_ERROR, f"frame end byte 0x{buf[end]:02x} is not 0xce")
        payload = bytes(buf[pos + 7 : end])
        self._pos = end + 1
        if self.state in (State.CLOSED, State.CLOSE_RECEIVED):
            return None  # nothing more is read
        if kind == FRAME_METHOD:
            if (
                payload[:4] == _PUBLISH_ID
                and self.channels.get(channel) is State.CHANNEL_OPEN
                and self.state is State.OPEN
                and channel not in self._partial
            ):  # what _method would find, the common way
                return self._publish(channel, self._decode_publish(payload, self._reader))
            return self._method(channel, payload)
        if kind == FRAME_HEADER:
            return self._content_header(channel, payload)
        if kind == FRAME_BODY:
            return self._content_body(channel, payload)
        if kind == FRAME_HEARTBEAT:
            if channel != 0:
                raise ConnectionException(
                    FRAME_ERROR, f"heartbeat frame on channel {channel} (must be 0)"
                )
            return Heartbeat()
        raise ConnectionException(FRAME_ERROR, f"unknown frame type {kind}")

    def _need(self) -> ConnectionClosed | NeedData:
        """Out of whole frames: drop what was read, and wait (or end)."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        return ConnectionClosed() if self._eof else NEED_DATA

    def _header(self) -> Event | NeedData | None:
        buf = self._buf
        n = min(len(buf), 8)
        if bytes(buf[:n]) != PROTOCOL_HEADER[:n]:
            raise ProtocolHeaderMismatch(
                f"expected the AMQP 0-9-1 protocol header, got {bytes(buf[:8])!r}"
            )
        if n < 8:
            if self._eof:
                return ConnectionClosed()
            return NEED_DATA
        del buf[:8]
        self._fire(Trigger.RECV_HEADER)
        return ProtocolHeader()

    def _decode(self, payload: bytes) -> base.Frame:
        if len(payload) < 4:
            raise ConnectionException(SYNTAX_ERROR, "method frame shorter than 4 bytes")
        class_id, method_id = _METHOD_ID.unpack_from(payload)
        index = class_id << 16 | method_id
        if class_id not in CLASSES:
            raise ConnectionException(
                NOT_IMPLEMENTED, f"unknown class {class_id}", class_id, method_id
            )
        cls = commands.INDEX_MAPPING.get(index)
        if cls is None:
            raise ConnectionException(
                NOT_IMPLEMENTED, f"unknown method {method_id} of class {class_id}", class_id
            )
        if index == _PUBLISH_INDEX:
            return self._decode_publish(payload)
        if index not in CLIENT_METHODS:
            raise ConnectionException(
                COMMAND_INVALID,
                f"{method_name(cls)} is sent by servers, not clients",
                class_id,
                method_id,
            )
        try:
            method: base.Frame = cls()
            method.unmarshal(payload[4:])
            for _, value in method:  # arguments, client properties: field tables
                check_nesting(value)
        except Exception as exc:  # struct.error, ValueError, UnicodeDecodeError...
            raise ConnectionException(
                SYNTAX_ERROR,
                f"cannot decode the arguments of {method_name(cls)}: {exc}"[:200],
                class_id,
                method_id,
            ) from None
        return method

    @staticmethod
    def _decode_publish(
        payload: bytes, reader: ContentReader | None = None
    ) -> commands.Basic.Publish:
        try:
            return decode_publish(payload) if reader is None else reader.publish(payload)
        except Exception as exc:  # IndexError, UnicodeDecodeError
            raise ConnectionException(
                SYNTAX_ERROR,
                f"cannot decode the arguments of basic.publish: {exc}"[:200],
                _BASIC,
                40,
            ) from None

    def _publish(self, channel: int, method: commands.Basic.Publish) -> Event | None:
        """A basic.publish on an open channel: its content, if its frames are all read and
        as usual (see ``fastpath.py``), with the publishes after it that repeat it (one
        :class:`ContentRun`); else they are read one by one."""
        got = self._reader.take(self._buf, self._pos, channel, self.frame_max, self.max_body)
        if got is None:
            self._partial[channel] = _Partial(method)
            return None
        props, body, pos = got
        bodies, self._pos = self._reader.more(
            self._buf, pos, channel, props, self.frame_max, self.max_body, _MAX_RUN
        )
        if bodies:
            bodies.insert(0, body)
            return ContentRun(channel, method, props, bodies)
        return Content(channel, method, props, body)

    def _method(self, channel: int, payload: bytes) -> Event | None:
        method = self._decode(payload)
        ids = method.index >> 16, method.index & 0xFFFF
        if channel == 0:
            return self._connection_method(method, ids)
        if self.state is State.CLOSING:
            return None  # after our connection.close, discard all but close and close-ok
        if self.state is not State.OPEN:
            raise ConnectionException(
                COMMAND_INVALID,
                f"{method_name(method)} on channel {channel} before the connection is open",
                *ids,
            )
        if ids[0] == 10:
            raise ConnectionException(
                COMMAND_INVALID, f"{method_name(method)} on channel {channel} (must be 0)", *ids
            )
        if channel > self.channel_max:
            raise ConnectionException(
                CHANNEL_ERROR,
                f"channel {channel} is above the negotiated channel_max {self.channel_max}",
                *ids,
            )
        state = self.channel_state(channel)
        if state is State.CHANNEL_CLOSING:
            if isinstance(method, commands.Channel.CloseOk):
                self._fire_channel(channel, Trigger.RECV_CHANNEL_CLOSE_OK)
                return Method(channel, method)
            if isinstance(method, commands.Channel.Close):
                self._fire_channel(channel, Trigger.RECV_CHANNEL_CLOSE)
                return Method(channel, method)
            return None  # after our channel.close, discard
        if state is State.CHANNEL_CLOSED:
            if not isinstance(method, commands.Channel.Open):
                raise ConnectionException(
                    CHANNEL_ERROR,
                    f"expected 'channel.open' on channel {channel}, got {method_name(method)}",
                    *ids,
                )
            self._fire_channel(channel, Trigger.RECV_CHANNEL_OPEN)
            return Method(channel, method)
        if state is State.CHANNEL_CLOSE_RECEIVED:
            return None
        # the channel is open
        if channel in self._partial:
            raise ConnectionException(
                UNEXPECTED_FRAME,
                f"expected a content header on channel {channel}, got {method_name(method)}",
                *ids,
            )
        if isinstance(method, commands.Channel.Open):
            raise ConnectionException(
                CHANNEL_ERROR, f"second 'channel.open' on channel {channel}", *ids
            )
        if isinstance(method, commands.Channel.CloseOk):
            raise ConnectionException(
                COMMAND_INVALID, f"channel.close-ok on channel {channel}, which is open", *ids
            )
        if isinstance(method, commands.Channel.Close):
            self._fire_channel(channel, Trigger.RECV_CHANNEL_CLOSE)
        elif isinstance(method, commands.Basic.Publish):
            return self._publish(channel, method)
        return Method(channel, method)

    def _connection_method(self, method: base.Frame, ids: tuple[int, int]) -> Event | None:
        state = self.state
        if ids[0] != 10:
            raise ConnectionException(
                COMMAND_INVALID, f"{method_name(method)} on channel 0 (connection only)", *ids
            )
        if state is State.CLOSING:
            if isinstance(method, commands.Connection.CloseOk | commands.Connection.Close):
                self._fire(RECV_TRIGGERS[type(method)])
                return Method(0, method)
            return None
        trigger = RECV_TRIGGERS.get(type(method))
        new = TRANSITIONS.get((state, trigger)) if trigger is not None else None
        if new is None:
            expected = WAIT_FOR.get(state)
            detail = f"unexpected {method_name(method)}"
            if expected:
                detail += f" (expected {expected})"
            raise ConnectionException(COMMAND_INVALID, detail, *ids)
        if isinstance(method, commands.Connection.TuneOk):
            self._tune(method, ids)
        self.state = new
        return Method(0, method)

    def _tune(self, tune_ok: commands.Connection.TuneOk, ids: tuple[int, int]) -> None:
        frame_max = tune_ok.frame_max or self.frame_max
        if frame_max < FRAME_MIN_SIZE or frame_max > self.frame_max:
            raise ConnectionException(
                NOT_ALLOWED,
                f"frame_max {tune_ok.frame_max} is outside {FRAME_MIN_SIZE}..{self.frame_max}",
                *ids,
            )
        channel_max = tune_ok.channel_max or self.channel_max
        if channel_max > self.channel_max:
            raise ConnectionException(
                NOT_ALLOWED,
                f"channel_max {channel_max} is above the offered {self.channel_max}",
                *ids,
            )
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = tune_ok.heartbeat or 0

    def _content_frame_check(self, channel: int, what: str) -> _Partial | None:
        if self.state is State.CLOSING or self.channel_state(channel) in (
            State.CHANNEL_CLOSING,
            State.CHANNEL_CLOSE_RECEIVED,
        ):
            return None  # discarded with the rest of a closing channel's frames
        partial = self._partial.get(channel)
        if partial is None:
            raise ConnectionException(
                UNEXPECTED_FRAME, f"{what} frame on channel {channel} without a basic.publish"
            )
        return partial

    def _content_header(self, channel: int, payload: bytes) -> Event | None:
        partial = self._content_frame_check(channel, "content header")
        if partial is None:
            return None
        if partial.properties is not None:
            raise ConnectionException(
                UNEXPECTED_FRAME, f"second content header on channel {channel}"
            )
        if len(payload) < 14:
            raise ConnectionException(FRAME_ERROR, "content header frame too short")
        class_id, _weight, size = _CONTENT_HEAD.unpack_from(payload)
        if class_id != _BASIC:
            raise ConnectionException(
                UNEXPECTED_FRAME, f"content header of class {class_id} (expected 60, basic)"
            )
        try:
            props = decode_properties(payload)
        except Exception as exc:
            raise ConnectionException(
                SYNTAX_ERROR, f"cannot decode the content header's properties: {exc}"[:200]
            ) from None
        partial.properties = props
        partial.size = size
        partial.oversized = size > self.max_body
        return self._content_done(channel, partial)

    def _content_body(self, channel: int, payload: bytes) -> Event | None:
        partial = self._content_frame_check(channel, "content body")
        if partial is None:
            return None
        if partial.properties is None:
            raise ConnectionException(
                UNEXPECTED_FRAME, f"content body on channel {channel} before its content header"
            )
        partial.received += len(payload)
        if partial.received > partial.size:
            raise ConnectionException(
                FRAME_ERROR,
                f"content body of {partial.received} bytes on channel {channel} is longer "
                f"than the {partial.size} bytes its header announced",
            )
        if not partial.oversized:
            partial.chunks.append(payload)
        return self._content_done(channel, partial)

    def _content_done(self, channel: int, partial: _Partial) -> Event | None:
        if partial.received < partial.size:
            return None
        del self._partial[channel]
        if partial.oversized:
            return OversizedContent(channel, partial.method, partial.size)
        chunks = partial.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        assert partial.properties is not None
        return Content(channel, partial.method, partial.properties, body)

    # ---- writing -------------------------------------------------------------------------
    @staticmethod
    def protocol_header() -> bytes:
        return PROTOCOL_HEADER

    def send_method(self, channel: int, method: base.Frame) -> bytes:
        """The frame of ``method`` on ``channel``; state changes for the methods that make
        them. LocalProtocolError if it may not be sent now."""
        if channel == 0:
            trigger = SEND_TRIGGERS.get(type(method))
            if trigger is not None:
                self._fire(trigger)
            elif self.state is not State.OPEN:
                raise LocalProtocolError(f"{method_name(method)} in state {self.state.value}")
        else:
            if self.state is not State.OPEN:
                raise LocalProtocolError(
                    f"{method_name(method)} on channel {channel} in state {self.state.value}"
                )
            if isinstance(method, commands.Channel.Close):
                self._fire_channel(channel, Trigger.SEND_CHANNEL_CLOSE)
            elif isinstance(method, commands.Channel.CloseOk):
                self._fire_channel(channel, Trigger.SEND_CHANNEL_CLOSE_OK)
            elif self.channel_state(channel) is not State.CHANNEL_OPEN:
                raise LocalProtocolError(
                    f"{method_name(method)} on channel {channel}, which is "
                    f"{self.channel_state(channel).value}"
                )
        payload = _INDEX.pack(method.index) + method.marshal()
        return _FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"

    def send_content(
        self, channel: int, method: base.Frame, properties: bytes, body: bytes
    ) -> bytes:
        """A method with content (basic.deliver, basic.get-ok, basic.return): the method, a
        content header with ``properties`` (encoded, see ``properties.py``) and the body in
        frames of at most frame_max."""
        if self.state is not State.OPEN or self.channel_state(channel) is not State.CHANNEL_OPEN:
            raise LocalProtocolError(f"content on channel {channel}, which is not open")
        payload = _INDEX.pack(method.index) + method.marshal()
        head = _CONTENT_HEAD.pack(_BASIC, 0, len(body)) + properties
        parts = [
            _FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)),
            payload,
            b"\xce",
            _FRAME_HEAD.pack(FRAME_HEADER, channel, len(head)),
            head,
            b"\xce",
        ]
        step = self.frame_max - 8
        for i in range(0, len(body), step):
            chunk = body[i : i + step]
            parts += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(chunk)), chunk, b"\xce")
        return b"".join(parts)

    def send_delivers(self, channel: int, frames: list[bytes]) -> bytes:
        """The frames of basic.deliver methods with their content on ``channel`` (made by
        ``deliver.py``, byte for byte those of :meth:`send_content` with a pamqp
        ``Basic.Deliver``), joined; LocalProtocolError if the channel is not open."""
        if self.state is not State.OPEN or self.channels.get(channel) is not State.CHANNEL_OPEN:
            raise LocalProtocolError(f"content on channel {channel}, which is not open")
        return b"".join(frames)

    @staticmethod
    def send_heartbeat() -> bytes:
        return _HEARTBEAT_FRAME
