"""One shard's durable state: the :class:`Store` contract every shard's store keeps.

The core keeps its queues and streams in shards; each shard owns one :class:`Store` and every
durable change of the shard goes through it. Two keep it: :class:`~polymq_core.store.sqlite.
SqliteStore`, one SQLite file (a single node, and each node's snapshot of a shard in a
cluster), and :class:`~polymq_core.replication.replicatedstore.ReplicatedStore`, the shard's
replicated log
applied to such a file (cluster mode). A shard sees only this module and the records of
:mod:`polymq_core.store.writes`.

Writes
    Every change is a record of :mod:`polymq_core.store.writes` (``AppendMany(key,
    messages)``, ``Remove(key, seqs)``, one frozen dataclass per kind of write) given to one
    method, :meth:`Store.write`: it queues the change and returns an :class:`asyncio.Future` that
    resolves to ``None`` once the change is committed *and* fsynced. Changes are applied in
    the order they were issued. A write whose future is never awaited (or is cancelled) is
    still made; cancelling only stops the waiting.

    Data is serialized when the write is issued, so a :class:`~polymq.types.Message` may be
    changed as soon as ``write`` returns. Data that cannot be serialized (a header that is
    not a string, options that are not JSON-able) raises ``TypeError`` or ``ValueError`` at
    once: that is a bug in the caller, not a store failure.

Reads
    ``kv_get``, ``kv_keys``, ``load_destinations``, ``load_messages``, ``load_bindings``,
    ``load_batches``, ``load_cursors`` and ``count_messages`` never block the event loop. A
    read sees every write whose future has resolved.

Lifecycle
    ``open()`` before anything else; ``close()`` waits until every write issued before it is
    committed. Writes and reads after ``close()`` raise :class:`StoreError`. A process that
    exits without ``close()`` loses only writes whose futures had not resolved.

Errors::

    StoreError      the store failed: disk full, I/O error, corrupt file, not open or closed.
                    ``__cause__`` holds the sqlite3 or OS error beneath, when there is one.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polymq.types import Message

from .writes import Write

__all__ = ["DestinationRecord", "Store", "StoreError"]


class StoreError(Exception):
    """The store failed (disk full, I/O error, corrupt file, closed); ``__cause__`` says why."""


@dataclass(frozen=True, slots=True)
class DestinationRecord:
    """A destination as the store knows it after a restart."""

    destination: str  # e.g. "queue/orders"
    options: dict[str, Any]  # opaque JSON-able dict
    metadata: dict[str, str]
    last_seq: int  # highest message seq ever stored for it (0 if none)


class Store(abc.ABC):
    """One shard's durable state."""

    # Set by the core; called on the event loop after each commit with the seconds the
    # transaction took (apply, commit and fsync) and the number of writes in it.
    on_commit: Callable[[float, int], None] | None = None

    @abc.abstractmethod
    async def open(self) -> None: ...

    async def promote(self) -> int:
        """Take the lead of the shard's log (a cluster's store fences it and catches up);
        returns the last entry applied. One node's store always leads: nothing to do."""
        return 0

    def demote(self) -> None:
        """Stop leading: a cluster's store fails the writes still pending. One node's store
        never stops."""
        return

    @abc.abstractmethod
    async def close(self) -> None:
        """Wait for every pending write to be committed, then close."""

    @abc.abstractmethod
    def write(self, write: Write) -> asyncio.Future[None]:
        """Make the durable change ``write`` (:mod:`polymq_core.store.writes`): encode it
        at once and queue it; the future resolves once it is committed."""

    @abc.abstractmethod
    async def kv_get(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    async def kv_keys(self, prefix: str, limit: int) -> list[str]:
        """The keys that start with ``prefix``, sorted, at most ``limit``."""

    @abc.abstractmethod
    async def load_destinations(self) -> list[DestinationRecord]:
        """Every saved destination, plus any that has messages but no saved record (with
        empty options and metadata), ordered by name."""

    @abc.abstractmethod
    async def load_messages(self, destination: str) -> list[Message]:
        """``destination``'s messages in seq order."""

    @abc.abstractmethod
    async def load_bindings(self) -> list[tuple[str, str]]:
        """Every stored binding as ``(destination, pattern)``, ordered."""

    @abc.abstractmethod
    async def load_batches(self, now: float) -> list[tuple[str, float, bytes]]:
        """The remembered batches that expire after ``now``, as ``(key, expires, answer)``,
        soonest to expire first."""

    @abc.abstractmethod
    async def load_cursors(self) -> list[tuple[str, str, bytes]]:
        """Every stored cursor subscription as ``(id, destination, record)``, by id."""

    @abc.abstractmethod
    async def count_messages(self, destination: str) -> int: ...

    async def load_page(self, destination: str, after: int, limit: int) -> list[Message]:
        """At most ``limit`` of ``destination``'s messages with a seq above ``after``, in
        seq order (a queue reading back what it paged out)."""
        return [m for m in await self.load_messages(destination) if m.seq > after][:limit]

    async def measure_messages(self, destination: str, after: int) -> tuple[int, int]:
        """(count, bytes) of ``destination``'s messages with a seq above ``after``: the
        count exact, the bytes those of their bodies or an estimate (a restart's figure)."""
        page = [m for m in await self.load_messages(destination) if m.seq > after]
        return len(page), sum(len(m.body) for m in page)
