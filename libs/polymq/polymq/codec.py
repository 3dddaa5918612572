"""The sans-IO codec of the polymq wire protocol: bytes in, events out, and back.

On the wire, a connection starts with the 4-byte preamble ``PMQ\\x01`` from the client, then
both sides send *frames*: a 4-byte big-endian payload length, then a msgpack array of
operations, each ``[opcode, field, ...]`` (see :mod:`polymq.events`). One frame may carry many
operations, which is how batching amortises syscalls and encoding.

Like h11's ``Connection``, :class:`Connection` never touches a socket::

    conn = Connection(Role.SERVER)
    conn.receive_data(data)          # b"" means end of stream
    while (event := conn.next_event()) is not NEED_DATA:
        ...
    transport.write(conn.send(Ok(rid, None)))
    transport.write(conn.send_many([ev1, ev2]))   # one frame

A relay can pass operations through without encoding them again: a connection made with
``keep_raw=True`` sets :attr:`Connection.raw` to the encoded operation of each event carrying
messages that :meth:`~Connection.next_event` returns, and :meth:`~Connection.send_many` takes
such bytes in place of encoding the event (``raws``).

Nothing a peer sends is unpacked without a bound: a frame is at most ``max_frame`` bytes
(``max_login_frame`` before the Hello), msgpack's lengths of arrays, maps, strings and binaries
are bounded by the frame's own size (``unpackb``'s default; the Unpackers here are given it),
and its nesting by msgpack's fixed stack of 1024 levels (an error, never a C recursion).

The states of one side are in :data:`TRANSITIONS`; a malformed frame raises
:class:`~polymq.errors.RemoteProtocolError`, after which the connection is ``ERROR`` and the
owner should send :meth:`Connection.goodbye` and close.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import MISSING
from typing import Any, Final

import msgpack

from .errors import LocalProtocolError, RemoteProtocolError
from .events import (
    EVENT_TYPES,
    Deliver,
    Event,
    Goodbye,
    Hello,
    Peeked,
    Polled,
    Publish,
    Pulled,
    Welcome,
)
from .types import _WIRE_FIELDS, Message

__all__ = [
    "DEFAULT_MAX_FRAME",
    "EVENT_BYTES",
    "NEED_DATA",
    "PREAMBLE",
    "PROTOCOL_VERSION",
    "TRANSITIONS",
    "Connection",
    "Role",
    "State",
    "weight",
]

PREAMBLE: Final = b"PMQ\x01"
PROTOCOL_VERSION: Final = 1
DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024
_LEN = struct.Struct(">I")


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    PREAMBLE = "preamble"  # server: waiting for the preamble; client: must send Hello
    HELLO = "hello"  # the preamble is through, Hello not yet seen
    WELCOME = "welcome"  # Hello went through, Welcome not yet seen
    OPEN = "open"
    CLOSED = "closed"  # a Goodbye went either way, or EOF
    ERROR = "error"


# (state, event type, sent by role) -> next state; any other non-open event is a protocol error.
TRANSITIONS: Final[dict[tuple[State, type[Event], Role], State]] = {
    (State.HELLO, Hello, Role.CLIENT): State.WELCOME,
    (State.WELCOME, Welcome, Role.SERVER): State.OPEN,
    # goodbye() is valid in any state, so a Goodbye is too, e.g. a client that gives up
    # waiting for Welcome (or whose Hello and Goodbye arrive in one read).
    (State.HELLO, Goodbye, Role.CLIENT): State.CLOSED,
    (State.WELCOME, Goodbye, Role.CLIENT): State.CLOSED,
    (State.HELLO, Goodbye, Role.SERVER): State.CLOSED,
    (State.WELCOME, Goodbye, Role.SERVER): State.CLOSED,
    (State.OPEN, Goodbye, Role.CLIENT): State.CLOSED,
    (State.OPEN, Goodbye, Role.SERVER): State.CLOSED,
}

# Events each role may send once OPEN.
_CLIENT_OPS = frozenset(op for op in range(10, 40) if op in EVENT_TYPES)
_SERVER_OPS = frozenset(op for op in range(40, 50) if op in EVENT_TYPES)
# ... of those, the ones that leave an open connection open (a Goodbye closes it)
_CHANGING = frozenset(cls.OP for _, cls, _ in TRANSITIONS)
_OPEN_CLIENT = _CLIENT_OPS - _CHANGING
_OPEN_SERVER = _SERVER_OPS - _CHANGING

_FIELD_COUNTS: dict[int, tuple[int, int]] = {}
for _op, _cls in EVENT_TYPES.items():
    _fields = dataclasses.fields(_cls)  # type: ignore[arg-type]
    _required = sum(1 for f in _fields if f.default is MISSING and f.default_factory is MISSING)
    _FIELD_COUNTS[_op] = (_required, len(_fields))
_FIELDS: dict[int, tuple[str, ...]] = {
    op: tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    for op, cls in EVENT_TYPES.items()
}
_HAS_MESSAGES = frozenset(cls.OP for cls in (Publish, Deliver, Pulled, Polled, Peeked))
# Message.to_wire's own getter (C, no Python frame per message): a batch may hold thousands
_TO_WIRE = _WIRE_FIELDS
_FROM_WIRE = Message.from_wire


EVENT_BYTES: Final = 64  # what an event or a message adds to a frame besides bodies, roughly


def weight(event: Event, raw: bytes | None = None) -> int:
    """About how many bytes ``event`` adds to a frame (``raw``: its encoded op, if at hand),
    for :meth:`Connection.send_frames`: its bodies count, and a little for everything else."""
    if raw is not None:
        return len(raw)
    if event.OP not in _HAS_MESSAGES:
        return EVENT_BYTES
    messages: list[Message] = event.messages  # type: ignore[attr-defined]
    return EVENT_BYTES + sum(len(m.body) + EVENT_BYTES for m in messages)


def _getter(names: tuple[str, ...]) -> Any:
    """The fields of an event in wire order, as a tuple (``attrgetter`` of one name gives
    the value itself)."""
    if len(names) == 1:
        name = names[0]
        return lambda event: (getattr(event, name),)
    return operator.attrgetter(*names)


# per opcode, looked up once per operation: (class, fewest fields, most fields, the index
# of ``messages`` or -1, the (name, index) of its ``rid`` / ``sid``, its fields' getter)
_OPS: dict[int, tuple[Any, int, int, int, tuple[tuple[str, int], ...], Any]] = {
    op: (
        cls,
        *_FIELD_COUNTS[op],
        _FIELDS[op].index("messages") if op in _HAS_MESSAGES else -1,
        tuple((name, _FIELDS[op].index(name)) for name in ("rid", "sid") if name in _FIELDS[op]),
        _getter(_FIELDS[op]),
    )
    for op, cls in EVENT_TYPES.items()
}


def _shared_cache(events: Sequence[Any]) -> dict[int, bytes] | None:
    """A dict to pack each message once in, if two of ``events`` begin with the same one."""
    firsts: set[int] = set()
    for ev in events:
        if ev.OP in _HAS_MESSAGES and (messages := ev.messages):
            first = id(messages[0])
            if first in firsts:
                return {}
            firsts.add(first)
    return None


def _encode_op(event: Event) -> list[Any]:
    op = event.OP
    spec = _OPS[op]
    values = [op, *spec[5](event)]
    i = spec[3]
    if i >= 0:
        values[i + 1] = list(map(_TO_WIRE, values[i + 1]))
    return values


def _decode_op(raw: Any) -> Event:
    if (
        not isinstance(raw, list)
        or not raw
        or not isinstance(raw[0], int)
        or isinstance(raw[0], bool)  # msgpack true would otherwise be opcode 1 (Hello)
    ):
        raise RemoteProtocolError("an operation must be a list starting with an opcode")
    op = raw[0]
    spec = _OPS.get(op)
    if spec is None:
        raise RemoteProtocolError(f"unknown opcode {op}")
    cls, lo, hi, i, ids, _ = spec
    n = len(raw) - 1
    if not lo <= n <= hi:
        raise RemoteProtocolError(f"{cls.__name__} takes {lo}..{hi} fields, got {n}")
    args = raw[1:]
    if i >= 0:
        msgs = args[i]
        if not isinstance(msgs, list):
            raise RemoteProtocolError(f"{cls.__name__}.messages must be a list")
        try:
            args[i] = list(map(_FROM_WIRE, msgs))
        except (TypeError, ValueError, Exception) as exc:
            raise RemoteProtocolError(f"malformed message in {cls.__name__}: {exc}") from None
    # Request ids and subscription ids must be integers; everything else is checked by the
    # core per request, where a bad value fails that request only.
    for name, j in ids:
        v = args[j]
        if (
            type(v) is not int and (not isinstance(v, int) or isinstance(v, bool))
        ) or not 0 <= v < 2**63:
            raise RemoteProtocolError(f"{cls.__name__}.{name} must be a non-negative integer")
    try:
        return cls(*args)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise RemoteProtocolError(f"malformed {cls.__name__}: {exc}") from None


class Connection:
    """One side of a polymq wire connection. Owns no socket."""

    def __init__(
        self,
        role: Role,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        keep_raw: bool = False,
        max_login_frame: int | None = None,
    ) -> None:
        self.role = role
        self.max_frame = max_frame
        # a server's cap on the frames before the peer's Hello, that Hello included (so an
        # unknown peer cannot make it hold a large frame); max_frame when None
        self.max_login_frame = max_frame if max_login_frame is None else max_login_frame
        self.keep_raw = keep_raw
        # with keep_raw: the operation of the event next_event returned last, as it came on
        # the wire, if it carries messages (Publish, Deliver, Pulled, Polled, Peeked); else None
        self.raw: bytes | None = None
        self.state = State.PREAMBLE if role is Role.SERVER else State.HELLO
        self._buf = bytearray()
        self._events: deque[Event] = deque()
        self._raws: deque[bytes | None] = deque()  # with keep_raw: one per event queued
        self._eof = False
        # An error found behind events still queued: raised once those are consumed, so
        # the events come out the same however the bytes were chunked.
        self._error: RemoteProtocolError | None = None
        self._preamble_sent = False
        self._packer = msgpack.Packer(use_bin_type=True)

    # ---- receiving ----------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        self._buf += data

    def stop_keeping_raw(self) -> None:
        """Keep no more operations' bytes (``keep_raw`` off): for a connection whose events
        are never passed on as they came. The events already parsed, and every one after
        them, give :attr:`raw` None."""
        self.keep_raw = False
        self._raws.clear()
        self.raw = None

    def next_event(self) -> Event | _NeedData:
        """The next event, :data:`NEED_DATA`, or a :class:`Goodbye` on EOF.

        Raises RemoteProtocolError on garbage; the connection is then in ``State.ERROR``.
        """
        if self._events:
            return self._pop()
        self.raw = None
        if self._error is not None:
            exc, self._error = self._error, None
            self.state = State.ERROR
            raise exc
        if self.state is State.ERROR:
            raise RemoteProtocolError("connection is in an error state")
        try:
            self._parse()
        except RemoteProtocolError as exc:
            if not self._events:
                self.state = State.ERROR
                raise
            self._error = exc
        if self._events:
            return self._pop()
        if self._eof:
            if self._buf:
                self.state = State.ERROR
                raise RemoteProtocolError("connection closed in the middle of a frame")
            if self.state is not State.CLOSED:
                self.state = State.CLOSED
                return Goodbye("closed", "the peer closed the connection")
        return NEED_DATA

    def _pop(self) -> Event:
        if self.keep_raw:
            self.raw = self._raws.popleft()
        return self._events.popleft()

    def _parse(self) -> None:
        buf = self._buf
        if self.state is State.PREAMBLE:
            if len(buf) < len(PREAMBLE):
                if not PREAMBLE.startswith(bytes(buf)):
                    raise RemoteProtocolError("not a polymq client (bad preamble)")
                return
            if buf[: len(PREAMBLE)] != PREAMBLE:
                raise RemoteProtocolError("not a polymq client (bad preamble)")
            del buf[: len(PREAMBLE)]
            self.state = State.HELLO
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (length,) = _LEN.unpack_from(buf, pos)
            limit = self.max_frame
            if self.state is State.HELLO and self.role is Role.SERVER:
                limit = self.max_login_frame
            if length > limit:
                when = "" if limit == self.max_frame else " before the Hello"
                raise RemoteProtocolError(
                    f"frame of {length} bytes exceeds the maximum of {limit}{when}", 413
                )
            if end - pos - 4 < length:
                break
            payload = bytes(buf[pos + 4 : pos + 4 + length])
            pos += 4 + length
            if self.keep_raw:
                self._parse_keeping_raw(payload)
                continue
            try:
                ops = msgpack.unpackb(payload, raw=False, strict_map_key=True)
            except Exception as exc:  # msgpack raises several unrelated types
                raise RemoteProtocolError(f"frame is not valid msgpack: {exc}") from None
            if not isinstance(ops, list):
                raise RemoteProtocolError("a frame must be a list of operations")
            for raw in ops:
                self._events.append(self._receive_event(_decode_op(raw)))
        if pos:
            del buf[:pos]

    def _parse_keeping_raw(self, payload: bytes) -> None:
        """As ``unpackb`` of the frame (the same events, the same errors), and the bytes of
        each operation that carries messages."""
        unpacker = msgpack.Unpacker(
            raw=False, strict_map_key=True, max_buffer_size=max(len(payload), 1)
        )
        unpacker.feed(payload)
        ops: list[tuple[Any, bytes | None]] = []
        try:
            try:
                n = unpacker.read_array_header()
            except ValueError:  # not an array (valid msgpack or not: found out below)
                unpacker = msgpack.Unpacker(
                    raw=False, strict_map_key=True, max_buffer_size=max(len(payload), 1)
                )
                unpacker.feed(payload)
                unpacker.unpack()  # (raises if it is not valid msgpack either)
                if unpacker.tell() != len(payload):
                    raise msgpack.ExtraData(None, None) from None
                raise RemoteProtocolError("a frame must be a list of operations") from None
            start = unpacker.tell()
            for _ in range(n):
                op = unpacker.unpack()
                end = unpacker.tell()
                has = type(op) is list and bool(op) and type(op[0]) is int
                ops.append((op, payload[start:end] if has and op[0] in _HAS_MESSAGES else None))
                start = end
            if start != len(payload):
                raise msgpack.ExtraData(None, None)
        except RemoteProtocolError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types
            raise RemoteProtocolError(f"frame is not valid msgpack: {exc}") from None
        for op, raw in ops:
            self._events.append(self._receive_event(_decode_op(op)))
            self._raws.append(raw)

    def receive_events(self, events: Sequence[Event]) -> None:
        """Events handed over in-process (:mod:`polymq.inproc`), not encoded: queued behind
        every frame that came before them, as if decoded from the next frame (each checked
        against the state; one that may not come now is an error :meth:`next_event` raises
        once the events before it are consumed, and the rest are dropped)."""
        if self._error is not None or self.state is State.ERROR:
            return
        if self._buf:
            try:
                self._parse()
            except RemoteProtocolError as exc:
                self._error = exc
                return
        peer = Role.SERVER if self.role is Role.CLIENT else Role.CLIENT
        queue, raws, keep = self._events, self._raws, self.keep_raw
        for event in events:
            try:
                self._transition(event, peer, RemoteProtocolError)
            except RemoteProtocolError as exc:
                self._error = exc
                return
            queue.append(event)
            if keep:
                raws.append(None)

    def _receive_event(self, event: Event) -> Event:
        peer = Role.SERVER if self.role is Role.CLIENT else Role.CLIENT
        self._transition(event, peer, RemoteProtocolError)
        return event

    # ---- sending ------------------------------------------------------------------------
    def send(self, event: Event) -> bytes:
        """Bytes of one frame carrying ``event``."""
        return self.send_many((event,))

    def send_many(
        self,
        events: Any,
        raws: Sequence[bytes | None] | None = None,
        packed: dict[int, bytes] | None = None,
    ) -> bytes:
        """Bytes of one frame carrying every event in ``events`` (an iterable).

        ``raws``, one per event: where not None, the event's operation as it came from
        another connection's :attr:`raw` (the event itself is still checked against the
        state), sent as it is instead of encoded again. ``packed``: each message packed
        once, kept here by ``id()`` (for messages that live at least as long as the dict:
        :meth:`send_frames` shares one between the frames of a topic's fan-out).

        All or nothing: if any event cannot be sent, this raises LocalProtocolError and the
        state is as it was before the call.
        """
        state = self.state
        try:
            payload: bytes
            try:
                if raws is None or not any(raws):
                    events = events if isinstance(events, list | tuple) else list(events)
                    firsts: set[int] = set()  # the first message of each event with some
                    shared = False
                    for ev in events:
                        self._transition(ev, self.role, LocalProtocolError)
                        if ev.OP in _HAS_MESSAGES and (messages := ev.messages):
                            first = id(messages[0])
                            shared = shared or first in firsts
                            firsts.add(first)
                    if shared or packed is not None:  # (a topic's messages to several subs)
                        payload = self._pack_sharing(events, {} if packed is None else packed)
                    else:
                        payload = self._packer.pack(list(map(_encode_op, events)))
                else:
                    pack = self._packer.pack
                    parts = [self._packer.pack_array_header(len(raws))]
                    for ev, raw in zip(events, raws, strict=True):
                        self._transition(ev, self.role, LocalProtocolError)
                        parts.append(raw if raw is not None else pack(_encode_op(ev)))
                    payload = b"".join(parts)
            except (TypeError, ValueError, OverflowError) as exc:  # msgpack's, translated
                raise LocalProtocolError(f"cannot encode the frame: {exc}") from exc
            if len(payload) > self.max_frame:
                raise LocalProtocolError(f"frame of {len(payload)} bytes exceeds {self.max_frame}")
        except BaseException:
            self.state = state
            raise
        out = _LEN.pack(len(payload)) + payload
        if self.role is Role.CLIENT and not self._preamble_sent:
            self._preamble_sent = True
            out = PREAMBLE + out
        return out

    def send_events(self, events: Sequence[Event]) -> None:
        """Check ``events`` against the state as :meth:`send_many` does, for a side that
        hands them over in-process instead of encoding them (:mod:`polymq.inproc`). All or
        nothing: LocalProtocolError leaves the state as it was."""
        state = self.state
        try:
            for event in events:
                self._transition(event, self.role, LocalProtocolError)
        except BaseException:
            self.state = state
            raise

    def _pack_sharing(self, events: Sequence[Event], packed: dict[int, bytes]) -> bytes:
        """What ``pack(list(map(_encode_op, events)))`` gives, each message packed once however
        many of the events carry it (``packed``: by ``id()``, each message's bytes): a topic's
        message goes to every subscription of a connection, and so in one frame to each
        (msgpack is a stream: an array is its header and its items, packed apart or
        together)."""
        packer = self._packer
        pack, header = packer.pack, packer.pack_array_header
        parts = [header(len(events))]
        for ev in events:
            spec = _OPS[ev.OP]
            i = spec[3]
            if i < 0:
                parts.append(pack(_encode_op(ev)))
                continue
            fields = spec[5](ev)
            parts.append(header(len(fields) + 1))
            parts.append(pack(ev.OP))
            for j, value in enumerate(fields):
                if j != i:
                    parts.append(pack(value))
                    continue
                parts.append(header(len(value)))
                for m in value:
                    b = packed.get(id(m))
                    if b is None:
                        b = packed[id(m)] = pack(_TO_WIRE(m))
                    parts.append(b)
        return b"".join(parts)

    def send_frames(
        self,
        events: list[Any],
        weights: list[int],
        frame_bytes: int,
        raws: list[bytes | None] | None = None,
    ) -> list[bytes]:
        """The bytes of ``events`` as frames of about ``frame_bytes`` each (``weights``:
        what each event adds to a frame): many small events share one, a big one goes alone.
        Each frame is all or nothing, as :meth:`send_many` (``raws``: as there). Where some
        events begin with the same message (a topic's, to several subscriptions whose
        backlogs span several frames), each message is packed once for all the frames."""
        packed = _shared_cache(events) if len(weights) > 1 and not raws else None
        frames = []
        start = size = 0
        for i, weight in enumerate(weights):
            if size and size + weight > frame_bytes:
                frames.append(self.send_many(events[start:i], raws and raws[start:i], packed))
                start, size = i, 0
            size += weight
        frames.append(self.send_many(events[start:], raws and raws[start:], packed))
        return frames

    def goodbye(self, code: str, message: str) -> bytes:
        """Bytes of a Goodbye frame, valid in any state but CLOSED; then CLOSED."""
        if self.state is State.CLOSED:
            return b""
        ops = [_encode_op(Goodbye(code, message))]
        self.state = State.CLOSED
        payload: bytes = self._packer.pack(ops)
        out = _LEN.pack(len(payload)) + payload
        if self.role is Role.CLIENT and not self._preamble_sent:
            self._preamble_sent = True
            out = PREAMBLE + out
        return out

    def _transition(self, event: Event, sender: Role, error: type[Exception]) -> None:
        state = self.state
        if state is State.OPEN and event.OP in (
            _OPEN_CLIENT if sender is Role.CLIENT else _OPEN_SERVER
        ):
            return  # (most events: no TRANSITIONS key built and hashed)
        nxt = TRANSITIONS.get((state, type(event), sender))
        if nxt is not None:
            self.state = nxt
            return
        # A client may pipeline requests right behind its Hello.
        if sender is Role.CLIENT:
            if state in (State.OPEN, State.WELCOME) and event.OP in _CLIENT_OPS:
                return
        elif state is State.OPEN and event.OP in _SERVER_OPS:
            return
        raise error(f"{sender.value} may not send {type(event).__name__} in state {state.value}")
