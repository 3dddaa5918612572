"""A :class:`~polymq_core.store.contract.Store` write call as plain values: ``(kind, *fields)``.

Both stores turn a write call into the tuple its writer applies, at once (so the caller may
change what it passed as soon as the call returns): :class:`~polymq_core.store.sqlite.
SqliteStore` queues it to its writer thread, and in cluster mode it is what a log entry
carries (:meth:`WriteEncoder.encode`, :mod:`polymq_core.store.logentry`). The kinds and their
fields are :mod:`polymq_core.store.schema`'s; this module needs no SQLite.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from polymq.types import Message

from .schema import APPEND, APPEND_BATCH, APPEND_MANY, REMOVE, WriteKind

__all__ = ["WriteEncoder"]


class WriteEncoder:
    """One method per Store write, each returning the write as ``(kind, *fields)``,
    serialized when the call is made (messages packed with msgpack, options and metadata as
    JSON). Not thread-safe: the event loop's side of a store uses it."""

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True)
        # op name (a Store write method) -> its encoder: (kind, *fields) from the call's args
        self._encoders: dict[str, Callable[..., tuple[Any, ...]]] = {
            "append": self.append,
            "append_many": self.append_many,
            "append_batch": self.append_batch,
            "forget_batches": self.forget_batches,
            "save_cursor": self.save_cursor,
            "delete_cursor": self.delete_cursor,
            "remove": self.remove,
            "purge": self.purge,
            "save_destination": self.save_destination,
            "delete_destination": self.delete_destination,
            "save_bindings": self.save_bindings,
            "delete_bindings": self.delete_bindings,
            "kv_put": self.kv_put,
            "kv_delete": self.kv_delete,
            "mark_delivered": self.mark_delivered,
        }

    def append(self, destination: str, message: Message) -> tuple[Any, ...]:
        return (APPEND, destination, message.seq, self._packer.pack(message.to_wire()))

    def append_many(self, destination: str, messages: Sequence[Message]) -> tuple[Any, ...]:
        pack = self._packer.pack
        return (APPEND_MANY, destination, [(m.seq, pack(m.to_wire())) for m in messages])

    def append_batch(
        self, destination: str, messages: Sequence[Message], key: str, expires: float, answer: bytes
    ) -> tuple[Any, ...]:
        _, _, rows = self.append_many(destination, messages)
        return (APPEND_BATCH, destination, rows, str(key), float(expires), bytes(answer))

    def forget_batches(self, before: float) -> tuple[Any, ...]:
        return (WriteKind.FORGET_BATCHES, float(before))

    def save_cursor(self, cursor: str, destination: str, record: bytes) -> tuple[Any, ...]:
        return (WriteKind.SAVE_CURSOR, str(cursor), str(destination), bytes(record))

    def delete_cursor(self, cursor: str) -> tuple[Any, ...]:
        return (WriteKind.DELETE_CURSOR, str(cursor))

    def remove(self, destination: str, seqs: Sequence[int]) -> tuple[Any, ...]:
        return (REMOVE, destination, list(seqs))

    def purge(self, destination: str) -> tuple[Any, ...]:
        return (WriteKind.PURGE, destination)

    def save_destination(
        self, destination: str, options: dict[str, Any], metadata: dict[str, str]
    ) -> tuple[Any, ...]:
        options_json, metadata_json = json.dumps(options), json.dumps(metadata)
        return (WriteKind.SAVE_DESTINATION, destination, options_json, metadata_json)

    def delete_destination(self, destination: str) -> tuple[Any, ...]:
        return (WriteKind.DELETE_DESTINATION, destination)

    def save_bindings(self, destination: str, patterns: Sequence[str]) -> tuple[Any, ...]:
        return (WriteKind.SAVE_BINDINGS, destination, [str(p) for p in patterns])

    def delete_bindings(self, destination: str, patterns: Sequence[str]) -> tuple[Any, ...]:
        return (WriteKind.DELETE_BINDINGS, destination, [str(p) for p in patterns])

    def kv_put(self, key: str, value: bytes) -> tuple[Any, ...]:
        return (WriteKind.KV_PUT, key, bytes(value))

    def kv_delete(self, key: str) -> tuple[Any, ...]:
        return (WriteKind.KV_DELETE, key)

    def mark_delivered(self, destination: str, marks: Sequence[tuple[int, int]]) -> tuple[Any, ...]:
        flat = [int(v) for mark in marks for v in mark]
        return (WriteKind.DELIVERED, destination, flat)

    def encode(self, op: str, *args: Any) -> tuple[Any, ...]:
        """The write that the Store method ``op`` called with ``args`` would queue, as a log
        entry carries it: ``(kind.value, *fields)``, every field a plain msgpack value (blobs
        as bytes, JSON as str). A bad ``op`` is a
        ``ValueError``, unserializable data a ``TypeError`` or ``ValueError`` as for the
        methods themselves."""
        encoder = self._encoders.get(op)
        if encoder is None:
            raise ValueError(f"{op!r} is not a Store write")
        kind, *fields = encoder(*args)
        return (kind.value, *fields)
