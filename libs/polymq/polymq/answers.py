"""What the core answers to a publish, a declare, a binding, a cursor's opening and polls,
and a destination's stats, as the client returns it: small frozen dataclasses, made from the
wire's maps in one place (each ``from_wire``; a poll's :class:`CursorPage` from its
``Polled`` event, where the client reads it), so that no caller indexes a
``dict[str, Any]`` by name. The wire itself is unchanged: the core still answers those maps
(see ``polymq_core.handlers.catalog``, ``.publisher`` and ``.cursors``), and :meth:`to_json` gives
back exactly the map the core sent where a frontend shows it to its clients as JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

from .types import DeclareOptions, Message

__all__ = [
    "Bound",
    "ChannelStats",
    "CursorOpened",
    "CursorPage",
    "Declared",
    "DestinationStats",
    "Published",
    "QueueStats",
    "StreamStats",
    "TopicStats",
    "Unbound",
    "stats_from_wire",
]


@dataclass(frozen=True, slots=True)
class Published:
    """The answer to a publish, once the core took every message (and, for persistent
    messages on durable destinations, fsynced them).

    A queue, stream or channel numbers what it took: ``ids`` and ``seqs``, one each per
    message in the order given. A topic counts who got them instead: ``subscribers`` (the
    live subscribers reached), ``queues`` (the bound queues that took a copy) and
    ``refused`` (those that refused it: full, under ``overflow: reject``). ``duplicate``:
    a repeated ``batch_id``, which published nothing and answers like the first."""

    count: int
    ids: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    subscribers: int | None = None  # None: not a topic (or an empty batch)
    queues: int = 0
    refused: list[str] = field(default_factory=list)
    duplicate: bool = False

    @property
    def to_topic(self) -> bool:
        """Was it a topic's answer (subscribers and bound queues rather than ids)?"""
        return self.subscribers is not None

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> Published:
        return cls(
            answer["count"],
            answer.get("ids", []),
            answer.get("seqs", []),
            answer.get("subscribers"),
            answer.get("queues", 0),
            answer.get("refused", []),
            answer.get("duplicate", False),
        )


@dataclass(frozen=True, slots=True)
class Declared:
    """The answer to a declare: the destination and the options it now has (None for a
    topic, which is transient: there is nothing to keep)."""

    destination: str
    options: DeclareOptions | None = None

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> Declared:
        options = answer.get("options")
        return cls(
            answer["destination"], None if options is None else DeclareOptions.from_dict(options)
        )

    def to_json(self) -> dict[str, Any]:
        """The core's answer as it came: ``{"destination", "options"}`` (a topic's without
        ``options``)."""
        if self.options is None:
            return {"destination": self.destination}
        return {"destination": self.destination, "options": self.options.to_dict()}


@dataclass(frozen=True, slots=True)
class Bound:
    """The answer to a bind: ``added`` is False when the binding was there already."""

    added: bool

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> Bound:
        return cls(bool(answer["added"]))  # (the wire's 0 or 1)


@dataclass(frozen=True, slots=True)
class Unbound:
    """The answer to an unbind: ``removed`` is False when there was no such binding."""

    removed: bool

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> Unbound:
        return cls(bool(answer["removed"]))


@dataclass(frozen=True, slots=True)
class CursorOpened:
    """A cursor subscription the core keeps: its ``id`` (to poll and close it from any
    connection) and the ``cursor`` its first poll starts after."""

    id: str
    cursor: int

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> CursorOpened:
        return cls(answer["id"], answer["cursor"])


@dataclass(frozen=True, slots=True)
class CursorPage:
    """What one poll of a cursor subscription read: the ``messages`` after the cursor
    presented, in order, each with its ``receipts`` entry (a queue's lease, which settles
    it; "" for a topic's or a stream's message, which presenting a cursor confirms), and
    the ``cursor`` to present next. The core always answers a cursor; it is None only in the
    empty page a frontend answers itself (the service stopping) to a poll that presented
    none."""

    cursor: int | None
    messages: list[Message]
    receipts: list[str]

    @property
    def leased(self) -> list[str]:
        """The receipts of the queue leases among the messages (none for a topic or a
        stream): what must be settled, or given back if nobody will see them."""
        return [r for r in self.receipts if r]


# ---- stats: one class per kind of destination, in the core's order of fields -------------------
@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue's (or a channel's inbox's): what it holds (``messages``, of which ``paged``
    are in the store only, and their ``bytes``), ``in_flight`` (delivered, not yet settled),
    its ``subscribers`` and ``bindings``, and its counters since it was loaded."""

    destination: str
    messages: int
    bytes: int
    paged: int
    in_flight: int
    subscribers: int
    published: int
    delivered: int
    acked: int
    redelivered: int
    bindings: int
    options: DeclareOptions

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> QueueStats:
        return cls(**_known(cls, answer), options=DeclareOptions.from_dict(answer["options"]))

    def to_json(self) -> dict[str, Any]:
        return _json(self)


@dataclass(frozen=True, slots=True)
class StreamStats:
    """A stream's: the entries it keeps (``messages``, their ``bytes``) and the first and
    last of their sequence numbers (None while it keeps none), its cursors
    (``subscribers``) and how many entries were ever appended (``published``)."""

    destination: str
    messages: int
    bytes: int
    first_seq: int | None
    last_seq: int | None
    subscribers: int
    published: int
    options: DeclareOptions

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> StreamStats:
        return cls(**_known(cls, answer), options=DeclareOptions.from_dict(answer["options"]))

    def to_json(self) -> dict[str, Any]:
        return _json(self)


@dataclass(frozen=True, slots=True)
class TopicStats:
    """A topic's (or a pattern's): the live subscriptions that match it."""

    destination: str
    subscribers: int

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> TopicStats:
        return cls(answer["destination"], answer["subscribers"])

    def to_json(self) -> dict[str, Any]:
        return {"destination": self.destination, "subscribers": self.subscribers}


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """A channel's: the stats of the inbox each role reads from, None for one that does not
    exist yet (the core answers it as holding no messages)."""

    destination: str
    server: QueueStats | None
    client: QueueStats | None

    @classmethod
    def from_wire(cls, answer: dict[str, Any]) -> ChannelStats:
        return cls(answer["destination"], _inbox(answer["server"]), _inbox(answer["client"]))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"destination": self.destination}
        for role, inbox in (("server", self.server), ("client", self.client)):
            # an inbox's key is the channel's and its role
            # (``polymq_core.destinations.shard.channel_inbox``)
            out[role] = (
                {"destination": f"{self.destination}>{role}", "messages": 0}
                if inbox is None
                else inbox.to_json()
            )
        return out


DestinationStats: TypeAlias = QueueStats | StreamStats | TopicStats | ChannelStats

_STATS_OF_KIND: dict[str, Callable[[dict[str, Any]], DestinationStats]] = {
    "queue": QueueStats.from_wire,
    "stream": StreamStats.from_wire,
    "topic": TopicStats.from_wire,
    "channel": ChannelStats.from_wire,
}


def stats_from_wire(answer: dict[str, Any]) -> DestinationStats:
    """The stats of the kind its ``destination`` (``kind/name``) names."""
    return _STATS_OF_KIND[answer["destination"].partition("/")[0]](answer)


def _inbox(answer: dict[str, Any]) -> QueueStats | None:
    return QueueStats.from_wire(answer) if "options" in answer else None


def _known(cls: type[Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` but ``options`` from ``answer`` (a newer core's others are left
    out)."""
    return {f.name: answer[f.name] for f in fields(cls) if f.name != "options"}


def _json(stats: QueueStats | StreamStats) -> dict[str, Any]:
    out = {f.name: getattr(stats, f.name) for f in fields(stats)}
    out["options"] = stats.options.to_dict()
    return out
