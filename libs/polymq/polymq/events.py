"""Events of the polymq wire protocol, named after what happens on the wire.

Client to core: ``Hello``, ``Publish``, ``Declare``, ``Delete``, ``Purge``, ``Subscribe``,
``Unsubscribe``, ``Ack``, ``Nack``, ``Pull``, ``Settle``, ``Stats``, ``MetaGet``, ``MetaSet``,
``KvGet``, ``KvPut``, ``KvDelete``, ``KvList``, ``Ping``, ``CursorOpen``, ``CursorPoll``,
``CursorClose``, ``Bind``, ``Unbind``, ``Bindings``, ``Peek``.
Core to client: ``Welcome``, ``Ok``, ``Fail``, ``Deliver``, ``Pulled``, ``Polled``, ``Peeked``,
``Cancelled``, ``Goodbye``.

Every request carries ``rid``, a request id the answer (``Ok``, ``Fail`` or ``Pulled``) repeats;
``rid`` 0 asks for no answer at all (fire and forget). An ``Ok`` for ``rid`` 0 answers
nothing: a core whose reading of a connection is held (a resource alarm holds a publisher)
says it now and then, a sign of life for the client's heartbeat (:mod:`polymq.heartbeat`),
which pings with ``Ping`` when the core has been silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .types import Message

__all__ = [
    "EVENT_TYPES",
    "Ack",
    "Bind",
    "Bindings",
    "Cancelled",
    "CursorClose",
    "CursorOpen",
    "CursorPoll",
    "Declare",
    "Delete",
    "Deliver",
    "Event",
    "Fail",
    "Goodbye",
    "Hello",
    "KvDelete",
    "KvGet",
    "KvList",
    "KvPut",
    "MetaGet",
    "MetaSet",
    "Nack",
    "Ok",
    "Peek",
    "Peeked",
    "Ping",
    "Polled",
    "Publish",
    "Pull",
    "Pulled",
    "Purge",
    "Request",
    "Settle",
    "Stats",
    "Subscribe",
    "Unbind",
    "Unsubscribe",
    "Welcome",
]


class Event:
    """Base of wire events. ``OP`` is the opcode on the wire."""

    __slots__ = ()
    OP: ClassVar[int]


class Request(Event):
    """An event that asks the core for an answer (when ``rid`` != 0)."""

    __slots__ = ()
    rid: int


@dataclass(frozen=True, slots=True)
class Hello(Event):
    OP: ClassVar[int] = 1
    version: int
    client: str
    user: str | None = None
    password: str | None = None
    token: str | None = None


@dataclass(frozen=True, slots=True)
class Welcome(Event):
    OP: ClassVar[int] = 2
    version: int
    server: str
    session: str
    limits: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Publish(Request):
    OP: ClassVar[int] = 10
    rid: int
    destination: str
    messages: list[Message]
    role: str | None = None  # channels: the sender's role
    # An idempotent batch: the core remembers (destination, role, batch_id) for batch_ttl
    # seconds (None: its default window) and answers a repeat like the first, publishing
    # nothing, with "duplicate": True added.
    batch_id: str | None = None
    batch_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class Declare(Request):
    OP: ClassVar[int] = 11
    rid: int
    destination: str
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Delete(Request):
    OP: ClassVar[int] = 12
    rid: int
    destination: str


@dataclass(frozen=True, slots=True)
class Purge(Request):
    OP: ClassVar[int] = 13
    rid: int
    destination: str


@dataclass(frozen=True, slots=True)
class Subscribe(Request):
    OP: ClassVar[int] = 14
    rid: int
    sid: int
    destination: str
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Unsubscribe(Request):
    OP: ClassVar[int] = 15
    rid: int
    sid: int


@dataclass(frozen=True, slots=True)
class Ack(Request):
    OP: ClassVar[int] = 16
    rid: int
    sid: int
    tags: list[int]
    cumulative: bool = False


@dataclass(frozen=True, slots=True)
class Nack(Request):
    OP: ClassVar[int] = 17
    rid: int
    sid: int
    tags: list[int]
    requeue: bool = True
    cumulative: bool = False


@dataclass(frozen=True, slots=True)
class Pull(Request):
    """Take up to ``max`` messages from a queue, leased for ``visibility`` seconds."""

    OP: ClassVar[int] = 18
    rid: int
    destination: str
    max: int
    wait: float
    visibility: float


@dataclass(frozen=True, slots=True)
class Settle(Request):
    """Settle leases: ``action`` is an :class:`~polymq.types.Outcome`'s word (``ack``,
    ``requeue`` or ``reject``; ``nack`` is ``requeue``)."""

    OP: ClassVar[int] = 19
    rid: int
    leases: list[str]
    action: str


@dataclass(frozen=True, slots=True)
class Stats(Request):
    OP: ClassVar[int] = 20
    rid: int
    destination: str


@dataclass(frozen=True, slots=True)
class MetaGet(Request):
    OP: ClassVar[int] = 21
    rid: int
    destination: str


@dataclass(frozen=True, slots=True)
class MetaSet(Request):
    OP: ClassVar[int] = 22
    rid: int
    destination: str
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class KvGet(Request):
    OP: ClassVar[int] = 23
    rid: int
    key: str


@dataclass(frozen=True, slots=True)
class KvPut(Request):
    OP: ClassVar[int] = 24
    rid: int
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class KvDelete(Request):
    OP: ClassVar[int] = 25
    rid: int
    key: str


@dataclass(frozen=True, slots=True)
class KvList(Request):
    """The keys under ``prefix``, sorted (at most ``limit``)."""

    OP: ClassVar[int] = 30
    rid: int
    prefix: str
    limit: int = 10_000


@dataclass(frozen=True, slots=True)
class Ping(Request):
    OP: ClassVar[int] = 26
    rid: int


@dataclass(frozen=True, slots=True)
class CursorOpen(Request):
    """Open a subscription that lives in the core, read by polls from any connection."""

    OP: ClassVar[int] = 27
    rid: int
    destination: str
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CursorPoll(Request):
    """Messages of cursor subscription ``id`` after ``cursor`` (None: the oldest held)."""

    OP: ClassVar[int] = 28
    rid: int
    id: str
    cursor: int | None
    max: int
    wait: float


@dataclass(frozen=True, slots=True)
class CursorClose(Request):
    OP: ClassVar[int] = 29
    rid: int
    id: str


@dataclass(frozen=True, slots=True)
class Bind(Request):
    """Bind ``queue`` (``queue/<name>``) to ``pattern`` (``topic/<pattern>``): a copy of every
    message published to a matching topic goes into the queue. Idempotent; durable when the
    queue is declared durable. Answer: ``{"added": 0 | 1}``."""

    OP: ClassVar[int] = 31
    rid: int
    pattern: str
    queue: str


@dataclass(frozen=True, slots=True)
class Unbind(Request):
    """Undo a ``Bind``; unbinding what is not bound is no error. ``{"removed": 0 | 1}``."""

    OP: ClassVar[int] = 32
    rid: int
    pattern: str
    queue: str


@dataclass(frozen=True, slots=True)
class Bindings(Request):
    """The patterns ``queue`` is bound to: a sorted list of ``topic/<pattern>``."""

    OP: ClassVar[int] = 33
    rid: int
    queue: str


@dataclass(frozen=True, slots=True)
class Peek(Request):
    """Look at messages without taking them: a queue's first ``count`` ready messages (in
    the order they would be delivered: by priority, then sequence; those of a durable
    queue's in-memory window, paged ones come after it), or a stream's last ``count``
    entries. A channel's: the inbox of ``role`` (default ``server``). Answer: ``Peeked``."""

    OP: ClassVar[int] = 34
    rid: int
    destination: str
    count: int
    role: str | None = None


@dataclass(frozen=True, slots=True)
class Ok(Event):
    OP: ClassVar[int] = 40
    rid: int
    result: Any = None


@dataclass(frozen=True, slots=True)
class Fail(Event):
    OP: ClassVar[int] = 41
    rid: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Deliver(Event):
    """Messages for subscription ``sid``; ``tags[i]`` is the delivery tag of ``messages[i]``."""

    OP: ClassVar[int] = 42
    sid: int
    tags: list[int]
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class Pulled(Event):
    OP: ClassVar[int] = 43
    rid: int
    leases: list[str]
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class Polled(Event):
    """The answer to CursorPoll: the next cursor, and receipts (queues) beside messages."""

    OP: ClassVar[int] = 46
    rid: int
    cursor: int
    receipts: list[str]
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class Peeked(Event):
    """The answer to Peek: the messages, still where they were (nothing is leased)."""

    OP: ClassVar[int] = 47
    rid: int
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class Cancelled(Event):
    """The core ended subscription ``sid`` (destination deleted, slow consumer, ...)."""

    OP: ClassVar[int] = 44
    sid: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Goodbye(Event):
    """The sender is closing the connection, and says why. Sent before the close."""

    OP: ClassVar[int] = 45
    code: str
    message: str


EVENT_TYPES: dict[int, type[Event]] = {
    cls.OP: cls
    for cls in (
        Hello,
        Welcome,
        Publish,
        Declare,
        Delete,
        Purge,
        Subscribe,
        Unsubscribe,
        Ack,
        Nack,
        Pull,
        Settle,
        Stats,
        MetaGet,
        MetaSet,
        KvGet,
        KvPut,
        KvDelete,
        KvList,
        Ping,
        CursorOpen,
        CursorPoll,
        CursorClose,
        Bind,
        Unbind,
        Bindings,
        Peek,
        Ok,
        Fail,
        Deliver,
        Pulled,
        Polled,
        Peeked,
        Cancelled,
        Goodbye,
    )
}
