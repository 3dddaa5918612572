"""The primitive API's types: destinations, messages and the options of each operation.

These are the contract every frontend maps to (see ``shared/DESIGN.md``). They are plain
data with validation at construction, shared by the client, the core and the frontends.
"""

from __future__ import annotations

import enum
import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Final, TypeGuard

from .errors import BadRequest

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_PRIORITY",
    "WIRE_FIELDS",
    "AckMode",
    "ChannelRole",
    "DeclareOptions",
    "Destination",
    "Kind",
    "Message",
    "Outcome",
    "Overflow",
    "SlowPolicy",
    "SubscribeOptions",
    "parse_offset",
]

MAX_NAME_LENGTH = 255
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 4

_NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]+\Z")
_PATTERN_RE = re.compile(r"[A-Za-z0-9_.:\-*#]+\Z")


class Kind(enum.Enum):
    QUEUE = "queue"
    TOPIC = "topic"
    STREAM = "stream"
    CHANNEL = "channel"


_KINDS = {k.value: k for k in Kind}


@dataclass(frozen=True, slots=True)
class Destination:
    """``kind/name``, e.g. ``queue/orders`` or ``topic/news.#``."""

    kind: Kind
    name: str

    @classmethod
    def parse(cls, text: str, *, pattern: bool = False) -> Destination:
        """Parse and validate ``kind/name``. ``pattern`` admits topic wildcards."""
        if not isinstance(text, str):
            raise BadRequest("destination must be a string like 'queue/name'")
        kind_s, sep, name = text.partition("/")
        if not sep:
            raise BadRequest(
                f"destination {text[:80]!r} must be 'queue/<name>', 'topic/<name>', "
                "'stream/<name>' or 'channel/<name>'"
            )
        kind = _KINDS.get(kind_s)
        if kind is None:
            raise BadRequest(
                f"unknown destination kind {kind_s[:40]!r}: use queue, topic, stream or channel"
            )
        validate_name(name, pattern=pattern and kind is Kind.TOPIC)
        return cls(kind, name)

    def __str__(self) -> str:
        return f"{self.kind.value}/{self.name}"

    @property
    def is_pattern(self) -> bool:
        return self.kind is Kind.TOPIC and ("*" in self.name or "#" in self.name)


def validate_name(name: str, *, pattern: bool = False) -> None:
    if not name:
        raise BadRequest("destination name is empty")
    # surrogatepass: a lone surrogate (JSON "\ud800") is an illegal character, not a crash
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_LENGTH:
        raise BadRequest(f"destination name longer than {MAX_NAME_LENGTH} bytes")
    if not (_PATTERN_RE if pattern else _NAME_RE).match(name):
        allowed = "letters, digits, '_', '.', ':', '-'" + (", '*', '#'" if pattern else "")
        raise BadRequest(
            f"destination name {name[:80]!r} has illegal characters (allowed: {allowed})"
        )
    if ".." in name or name.startswith(".") or name.endswith("."):
        raise BadRequest(f"destination name {name[:80]!r} has an empty segment")


class ChannelRole(enum.StrEnum):
    """A channel member's side. Each side reads its own inbox, and what one side publishes
    goes to the other's: a client's request to the server's inbox, the server's answer to
    the client's. The wire carries the value (a string equal to the member)."""

    SERVER = "server"
    CLIENT = "client"

    @property
    def other(self) -> ChannelRole:
        """The side that reads what this side publishes."""
        return ChannelRole.CLIENT if self is ChannelRole.SERVER else ChannelRole.SERVER

    @classmethod
    def named(cls, value: object) -> TypeGuard[str]:
        """Is ``value`` one of the roles (or its string)?"""
        return isinstance(value, str) and value in _CHANNEL_ROLES

    @classmethod
    def of(cls, value: object, default: ChannelRole) -> ChannelRole:
        """``value`` as a role (``default`` if None); :class:`BadRequest` if it is none."""
        if value is None:
            return default
        if not cls.named(value):
            raise BadRequest("role must be 'server' or 'client'")
        return cls(value)


_CHANNEL_ROLES = frozenset(role.value for role in ChannelRole)


class AckMode(enum.Enum):
    AUTO = "auto"
    CLIENT = "client"  # an ack acknowledges every earlier delivery too (cumulative)
    CLIENT_INDIVIDUAL = "client-individual"


class Outcome(enum.Enum):
    """What settling a delivery or a lease does to its message: the one word every layer
    uses, from a protocol's verb (STOMP ``ACK``/``NACK``, AMQP ``basic.ack``/``nack``/
    ``reject``, the HTTP frontends' ack and nack with ``requeue``) down to the queue. The
    wire carries its value (``Settle.action``); ``Nack.requeue`` is :meth:`of_nack`'s input."""

    ACK = "ack"  # done with: the message is removed
    REQUEUE = "requeue"  # back to the queue, to be delivered again
    REJECT = "reject"  # to the dead-letter destination (dropped without one)

    @classmethod
    def of_nack(cls, requeue: bool) -> Outcome:
        """A negative acknowledgement: requeued, or rejected (dead-lettered)."""
        return cls.REQUEUE if requeue else cls.REJECT

    @classmethod
    def parse(cls, word: object) -> Outcome:
        """The outcome a wire word names (``nack`` is ``requeue``, as a nack requeues unless
        told otherwise); :class:`BadRequest` for anything else."""
        found = _OUTCOME_WORDS.get(word) if isinstance(word, str) else None
        if found is None:
            raise BadRequest("action must be ack, nack (requeue) or reject (dead-letter)")
        return found


_OUTCOME_WORDS = {o.value: o for o in Outcome} | {"nack": Outcome.REQUEUE}


class Overflow(enum.Enum):
    REJECT = "reject"  # refuse the publish with QueueFull
    DROP_OLDEST = "drop-oldest"  # drop (or dead-letter) the head to make room


class SlowPolicy(enum.Enum):
    DISCONNECT = "disconnect"  # close the slow subscriber's connection; its unacked requeue
    DROP = "drop"  # drop the message for that subscriber only (topics)


@dataclass(slots=True)
class Message:
    """One message. Fields after ``reply_to`` are assigned by the core."""

    body: bytes
    content_type: str = "application/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)
    priority: int = DEFAULT_PRIORITY
    persistent: bool = False
    expires: float | None = None  # absolute unix time, seconds
    ack_timeout: float | None = None  # seconds; overrides the subscription's
    correlation_id: str | None = None
    reply_to: str | None = None
    id: str = ""
    seq: int = 0
    timestamp: float = 0.0
    delivery_count: int = 0
    destination: str = ""
    # The core's own mark, never on the wire (not in to_wire, False in a copy): the message
    # has a row in its queue's store though it is transient, since it came while the queue
    # paged (polymq_core.destinations.paging). A stored message is removed from the store
    # when it leaves the queue, as a persistent one is; it is delivered as what it is.
    stored: bool = field(default=False, compare=False, repr=False)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1

    def validate(self, max_body: int) -> None:
        # The core checks every message of every publish: the common case (exact types, no
        # timeouts) is tested first, with no calls but len().
        body = self.body
        if type(body) is not bytes and not isinstance(body, bytes | bytearray):
            raise BadRequest("message body must be bytes")
        if len(body) > max_body:
            from .errors import PayloadTooLarge

            raise PayloadTooLarge(f"message body of {len(body)} bytes exceeds {max_body}")
        p = self.priority
        if type(p) is not int or not 0 <= p <= MAX_PRIORITY:  # type() is: a bool is no priority
            raise BadRequest(f"priority must be an integer 0..{MAX_PRIORITY}")
        ct = self.content_type
        if type(ct) is not str or len(ct) > 255:
            raise BadRequest("content_type must be a string of at most 255 characters")
        headers = self.headers
        if type(headers) is not dict:
            raise BadRequest("headers must map strings to strings")
        for k, v in headers.items():
            if type(k) is not str or type(v) is not str:
                raise BadRequest("headers must map strings to strings")
        if self.ack_timeout is not None and not (
            _is_number(self.ack_timeout) and self.ack_timeout > 0
        ):
            raise BadRequest("ack_timeout must be a positive number of seconds")
        if self.expires is not None and not _is_number(self.expires):
            raise BadRequest("expires must be a unix time in seconds")
        # (what every frontend shows as text: another type stored would fail each delivery)
        if self.correlation_id is not None and type(self.correlation_id) is not str:
            raise BadRequest("correlation_id must be a string")
        if self.reply_to is not None and type(self.reply_to) is not str:
            raise BadRequest("reply_to must be a destination name (a string)")

    def copy(self) -> Message:
        """A copy that shares nothing mutable with this one (its own headers; a body that is
        not ``bytes`` made bytes), as a round trip through the wire would give: what an
        in-process pipe (:mod:`polymq.inproc`) hands over instead of encoding. Each field set
        by hand (a third of the dataclass ``__init__``'s cost); tests/unit/polymq/test_types
        checks that every field is copied."""
        n = _new(Message)
        body = self.body
        n.body = (
            body
            if type(body) is bytes or not isinstance(body, bytearray | memoryview)
            else bytes(body)
        )
        n.content_type = self.content_type
        headers = self.headers
        n.headers = dict(headers) if type(headers) is dict else headers
        n.priority = self.priority
        n.persistent = self.persistent
        n.expires = self.expires
        n.ack_timeout = self.ack_timeout
        n.correlation_id = self.correlation_id
        n.reply_to = self.reply_to
        n.id = self.id
        n.seq = self.seq
        n.timestamp = self.timestamp
        n.delivery_count = self.delivery_count
        n.destination = self.destination
        n.stored = False
        return n

    def to_wire(self) -> tuple[Any, ...]:
        """The 14 fields in wire order (msgpack packs the tuple as an array)."""
        return _WIRE_FIELDS(self)

    @classmethod
    def from_wire(cls, fields: Any) -> Message:
        if type(fields) is not list and not isinstance(fields, list | tuple):
            raise BadRequest("a message is a list of 14 fields")
        if len(fields) != 14:
            raise BadRequest("a message is a list of 14 fields")
        if cls is Message:  # each field set by hand, as copy() does (a third less than __init__)
            m = _new(Message)
            (
                m.body, m.content_type, m.headers, m.priority, m.persistent, m.expires,
                m.ack_timeout, m.correlation_id, m.reply_to, m.id, m.seq, m.timestamp,
                m.delivery_count, m.destination,
            ) = fields  # fmt: skip
            m.stored = False
        else:
            m = cls(*fields)
        if type(m.persistent) is not bool or (type(m.id) is not str and not isinstance(m.id, str)):
            raise BadRequest("malformed message fields")
        return m


def _is_number(v: Any) -> bool:
    """A finite int or float, and not a bool (``True`` is an int to Python, not to users)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


_new = object.__new__

# a message's fields on the wire, in order: every field but the core's ``stored`` mark
WIRE_FIELDS: Final = (
    "body", "content_type", "headers", "priority", "persistent", "expires", "ack_timeout",
    "correlation_id", "reply_to", "id", "seq", "timestamp", "delivery_count", "destination",
)  # fmt: skip
_WIRE_FIELDS = operator.attrgetter(*WIRE_FIELDS)


def _opt_int(d: dict[str, Any], key: str, minimum: int = 0) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise BadRequest(f"{key} must be an integer >= {minimum}")
    return v


def _priority(v: Any) -> int:
    if type(v) is not int or not -(2**31) <= v < 2**31:
        raise BadRequest("priority must be an integer from -2147483648 to 2147483647")
    return v


def _opt_float(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if not _is_number(v) or v <= 0:
        raise BadRequest(f"{key} must be a positive number")
    return float(v)


def _enum(d: dict[str, Any], key: str, cls: type[enum.Enum], default: Any) -> Any:
    v = d.get(key)
    if v is None:
        return default
    try:
        return cls(v)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise BadRequest(f"{key} must be one of {allowed}") from None


def _check_keys(d: Any, allowed: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise BadRequest(f"{what} must be an object")
    unknown = set(d) - allowed
    if unknown:
        raise BadRequest(f"unknown {what}: {', '.join(sorted(map(str, unknown)))}")
    return d


@dataclass(frozen=True, slots=True)
class DeclareOptions:
    durable: bool = True
    max_length: int | None = None
    max_bytes: int | None = None
    overflow: Overflow = Overflow.REJECT
    idle_ttl: float | None = None  # seconds without subscribers or publishes, then deleted
    dead_letter: str | None = None  # a destination string
    # whose write permission on ``dead_letter`` each dead letter is sent on (the core sets
    # it: see polymq_core.handlers.deadletters); "" is the anonymous client. Not part of a queue's
    # identity: a redeclaration with equal options by someone else is no conflict.
    dead_letter_by: str | None = field(default=None, compare=False)
    max_deliveries: int | None = None
    ack_timeout: float | None = None  # default for subscriptions
    message_ttl: float | None = None
    # the highest priority level the queue orders by: a message above it counts as this
    # level (its priority is kept); None: every level (0..MAX_PRIORITY), 0: strictly FIFO
    max_priority: int | None = None

    KEYS = frozenset(
        {
            "durable",
            "max_length",
            "max_bytes",
            "overflow",
            "idle_ttl",
            "dead_letter",
            "dead_letter_by",
            "max_deliveries",
            "ack_timeout",
            "message_ttl",
            "max_priority",
        }
    )

    @classmethod
    def from_dict(cls, d: Any) -> DeclareOptions:
        d = _check_keys({} if d is None else d, cls.KEYS, "declare option")
        durable = d.get("durable", True)
        if not isinstance(durable, bool):
            raise BadRequest("durable must be true or false")
        dl = d.get("dead_letter")
        if dl is not None:
            dest = Destination.parse(dl)
            if dest.kind not in (Kind.QUEUE, Kind.TOPIC, Kind.STREAM):
                raise BadRequest("dead_letter must be a queue, topic or stream")
        by = d.get("dead_letter_by")
        if by is not None and (not isinstance(by, str) or len(by) > MAX_NAME_LENGTH or dl is None):
            raise BadRequest("dead_letter_by must be a user name, with a dead_letter")
        return cls(
            durable=durable,
            max_length=_opt_int(d, "max_length", 1),
            max_bytes=_opt_int(d, "max_bytes", 1),
            overflow=_enum(d, "overflow", Overflow, Overflow.REJECT),
            idle_ttl=_opt_float(d, "idle_ttl"),
            dead_letter=dl,
            dead_letter_by=by,
            max_deliveries=_opt_int(d, "max_deliveries", 1),
            ack_timeout=_opt_float(d, "ack_timeout"),
            message_ttl=_opt_float(d, "message_ttl"),
            max_priority=_opt_int(d, "max_priority", 0),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"durable": self.durable, "overflow": self.overflow.value}
        for k in (
            "max_length",
            "max_bytes",
            "idle_ttl",
            "dead_letter",
            "dead_letter_by",
            "max_deliveries",
            "ack_timeout",
            "message_ttl",
            "max_priority",
        ):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


# A stream's sequence numbers are signed 64-bit (the store's INTEGER, the long-poll cursor):
# a start offset past the last of them is refused as bad input, not met as an overflow in
# the wire's msgpack or the store.
_MAX_SEQ: Final = 2**63 - 1


def parse_offset(v: Any) -> str | int | float:
    """A stream start offset: 'first', 'last', 'next', a sequence (int, 0..2**63 - 1) or
    ``{"timestamp": t}`` / ``"@<unix seconds>"`` (returned as float)."""
    if v is None:
        return "next"
    if isinstance(v, bool):
        raise BadRequest("offset must be first, last, next, a sequence number or a timestamp")
    if isinstance(v, int):
        if not 0 <= v <= _MAX_SEQ:
            raise BadRequest(f"offset sequence must be 0..{_MAX_SEQ}")
        return v
    if isinstance(v, dict) and set(v) == {"timestamp"} and _is_number(v["timestamp"]):
        return float(v["timestamp"])
    if isinstance(v, str):
        if v in ("first", "last", "next"):
            return v
        if v.startswith("@"):
            try:
                t = float(v[1:])
            except ValueError:
                pass
            else:
                if math.isfinite(t):
                    return t
        elif v.isascii() and v.isdigit():  # not "²", which isdigit() but int() refuses
            # (int() refuses more than 4300 digits too: none of them is a sequence anyway)
            if len(v.lstrip("0")) > len(str(_MAX_SEQ)) or int(v) > _MAX_SEQ:
                raise BadRequest(f"offset sequence must be 0..{_MAX_SEQ}")
            return int(v)
    raise BadRequest("offset must be first, last, next, a sequence number or a timestamp")


# Equal subscribe options share one object: a million subscriptions made alike cost one.
_INTERNED: dict[SubscribeOptions, SubscribeOptions] = {}


@dataclass(frozen=True, slots=True)
class SubscribeOptions:
    ack_mode: AckMode = AckMode.AUTO
    prefetch: int = 100  # unacked deliveries outstanding; 0 = unlimited (auto mode only)
    buffer_messages: int = 10_000  # deliveries waiting for a slow socket before the policy
    buffer_bytes: int = 16 * 1024 * 1024
    slow_policy: SlowPolicy = SlowPolicy.DISCONNECT
    ack_timeout: float | None = None  # seconds; None = the queue's, or never
    offset: str | int | float = "next"  # streams only
    role: str | None = None  # channels only: 'server' or 'client'
    # queues: consumers of a higher priority get the messages while they have room in their
    # window; those of lower ones only what they cannot take (AMQP's x-priority)
    priority: int = 0

    KEYS = frozenset(
        {
            "ack_mode",
            "prefetch",
            "buffer_messages",
            "buffer_bytes",
            "slow_policy",
            "ack_timeout",
            "offset",
            "role",
            "priority",
        }
    )

    @classmethod
    def from_dict(cls, d: Any) -> SubscribeOptions:
        d = _check_keys({} if d is None else d, cls.KEYS, "subscribe option")
        role = d.get("role")
        if role is not None:
            ChannelRole.of(role, ChannelRole.SERVER)  # (BadRequest if it is not a role)
        prefetch = _opt_int(d, "prefetch", 0)
        opts = cls(
            ack_mode=_enum(d, "ack_mode", AckMode, AckMode.AUTO),
            prefetch=100 if prefetch is None else prefetch,
            buffer_messages=_opt_int(d, "buffer_messages", 1) or 10_000,
            buffer_bytes=_opt_int(d, "buffer_bytes", 1) or 16 * 1024 * 1024,
            slow_policy=_enum(d, "slow_policy", SlowPolicy, SlowPolicy.DISCONNECT),
            ack_timeout=_opt_float(d, "ack_timeout"),
            offset=parse_offset(d.get("offset")),
            role=role,
            priority=_priority(d.get("priority", 0)),
        )
        # Never intern a numeric offset: a sequence 5 and a timestamp 5.0 compare equal.
        if isinstance(opts.offset, str) and len(_INTERNED) < 4096:
            return _INTERNED.setdefault(opts, opts)
        return opts

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ack_mode": self.ack_mode.value,
            "prefetch": self.prefetch,
            "buffer_messages": self.buffer_messages,
            "buffer_bytes": self.buffer_bytes,
            "slow_policy": self.slow_policy.value,
        }
        if self.ack_timeout is not None:
            out["ack_timeout"] = self.ack_timeout
        if self.offset != "next":
            out["offset"] = (
                {"timestamp": self.offset} if isinstance(self.offset, float) else self.offset
            )
        if self.role is not None:
            out["role"] = self.role
        if self.priority:
            out["priority"] = self.priority
        return out
