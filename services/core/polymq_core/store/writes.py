"""A shard's durable changes as values: one frozen record per kind of write.

A write is decided in one place (the shard, a handler) and made there as one of these
records, e.g. ``PurgeMessages("queue/orders")``; it is handed to
:meth:`Store.write <polymq_core.store.contract.Store.write>` (through ``Shard.commit``), which
encodes it at once with :meth:`Write.encode`: the flat tuple ``(kind, *fields)`` that the
SQLite writer applies (:func:`~polymq_core.store.schema.apply_batch`) and that a replicated
log's entry carries as it is (:mod:`polymq_core.store.logentry`): the kind is a
:class:`~polymq_core.store.schema.WriteKind`, an ``IntEnum`` that msgpack writes as its number,
and every field is a plain msgpack value (messages packed with msgpack, options and metadata
as JSON). A record holds what its maker passed (a list of messages, say) until it is
written; after :meth:`Store.write` returns, the maker may change that as it likes.

The fields of each kind's tuple are listed with its :class:`~polymq_core.store.schema.
WriteKind`, beside the code that applies them; this module needs no SQLite. A new kind of
write is a record here, a kind there and its branch in ``apply_batch``.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from polymq.types import Message

from .schema import APPEND, APPEND_BATCH, APPEND_MANY, REMOVE, WriteKind

__all__ = [
    "Append",
    "AppendBatch",
    "AppendMany",
    "DeleteBindings",
    "DeleteCursor",
    "DeleteDestination",
    "DeleteValue",
    "ForgetBatches",
    "MarkDelivered",
    "Pack",
    "PurgeMessages",
    "Remove",
    "SaveBindings",
    "SaveCursor",
    "SaveDestination",
    "SaveValue",
    "Write",
]

# msgpack's ``Packer(use_bin_type=True).pack``: each store keeps one (a packer is reused, not
# made per message) and hands it to the records it encodes, on the event loop.
Pack = Callable[[Any], bytes]


class Write(abc.ABC):
    """One durable change of a shard's store (the records below)."""

    __slots__ = ()

    @abc.abstractmethod
    def encode(self, pack: Pack) -> tuple[Any, ...]:
        """The write as the store applies it and a log entry carries it: ``(kind,
        *fields)``, serialized now. Data that cannot be serialized (a header msgpack cannot
        pack, options that are not JSON-able) is a ``TypeError`` or ``ValueError``: a bug
        in the write's maker, not a store failure."""


def _rows(messages: Sequence[Message], pack: Pack) -> list[tuple[int, bytes]]:
    return [(m.seq, pack(m.to_wire())) for m in messages]


@dataclass(frozen=True, slots=True)
class Append(Write):
    """Store ``message`` under ``(destination, message.seq)``, replacing any there."""

    destination: str
    message: Message

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        message = self.message
        return (APPEND, self.destination, message.seq, pack(message.to_wire()))


@dataclass(frozen=True, slots=True)
class AppendMany(Write):
    """:class:`Append` each of ``messages``, in one write."""

    destination: str
    messages: Sequence[Message]

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (APPEND_MANY, self.destination, _rows(self.messages, pack))


@dataclass(frozen=True, slots=True)
class AppendBatch(Write):
    """:class:`AppendMany`, and in the same write remember the idempotent batch ``key``
    with its ``answer`` until ``expires`` (wall-clock seconds): both are kept, or
    neither."""

    destination: str
    messages: Sequence[Message]
    key: str
    expires: float
    answer: bytes

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        rows = _rows(self.messages, pack)
        key, expires, answer = str(self.key), float(self.expires), bytes(self.answer)
        return (APPEND_BATCH, self.destination, rows, key, expires, answer)


@dataclass(frozen=True, slots=True)
class ForgetBatches(Write):
    """Drop the remembered batches that expire at or before ``before``."""

    before: float

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.FORGET_BATCHES, float(self.before))


@dataclass(frozen=True, slots=True)
class SaveCursor(Write):
    """Create or replace cursor subscription ``cursor`` of ``destination``."""

    cursor: str
    destination: str
    record: bytes

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        cursor, destination, record = str(self.cursor), str(self.destination), bytes(self.record)
        return (WriteKind.SAVE_CURSOR, cursor, destination, record)


@dataclass(frozen=True, slots=True)
class DeleteCursor(Write):
    """Forget cursor subscription ``cursor`` (unknown ones are ignored)."""

    cursor: str

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.DELETE_CURSOR, str(self.cursor))


@dataclass(frozen=True, slots=True)
class Remove(Write):
    """Remove acknowledged messages; seqs that are not stored are ignored."""

    destination: str
    seqs: Sequence[int]

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (REMOVE, self.destination, list(self.seqs))


@dataclass(frozen=True, slots=True)
class PurgeMessages(Write):
    """Remove all of ``destination``'s messages; its record and ``last_seq`` stay."""

    destination: str

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.PURGE, self.destination)


@dataclass(frozen=True, slots=True)
class MarkDelivered(Write):
    """Messages were delivered (and are not settled yet): set the delivery count of each
    ``(seq, count)`` stored (a replicated core marks them, so that a new leader flags only
    them redelivered); seqs that are not stored are ignored."""

    destination: str
    marks: Sequence[tuple[int, int]]

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        flat = [int(v) for mark in self.marks for v in mark]
        return (WriteKind.DELIVERED, self.destination, flat)


@dataclass(frozen=True, slots=True)
class SaveDestination(Write):
    """Create or replace ``destination``'s record (``options`` JSON-able)."""

    destination: str
    options: dict[str, Any]
    metadata: dict[str, str]

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        options, metadata = json.dumps(self.options), json.dumps(self.metadata)
        return (WriteKind.SAVE_DESTINATION, self.destination, options, metadata)


@dataclass(frozen=True, slots=True)
class DeleteDestination(Write):
    """Forget ``destination``: its record, its messages, its ``last_seq`` and bindings."""

    destination: str

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.DELETE_DESTINATION, self.destination)


@dataclass(frozen=True, slots=True)
class SaveBindings(Write):
    """Add bindings of ``destination`` (a queue) to ``patterns``; existing ones stay."""

    destination: str
    patterns: Sequence[str]

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.SAVE_BINDINGS, self.destination, [str(p) for p in self.patterns])


@dataclass(frozen=True, slots=True)
class DeleteBindings(Write):
    """Remove bindings of ``destination``; patterns it is not bound to are ignored."""

    destination: str
    patterns: Sequence[str]

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.DELETE_BINDINGS, self.destination, [str(p) for p in self.patterns])


@dataclass(frozen=True, slots=True)
class SaveValue(Write):
    """Set ``key`` to ``value``."""

    key: str
    value: bytes

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.KV_PUT, self.key, bytes(self.value))


@dataclass(frozen=True, slots=True)
class DeleteValue(Write):
    """Forget ``key`` (an unknown one is ignored)."""

    key: str

    def encode(self, pack: Pack) -> tuple[Any, ...]:
        return (WriteKind.KV_DELETE, self.key)
