"""A shard's log entries and the log's errors (docs/cluster.md, "Writes"), sans-IO.

Every shard has one replicated log (:class:`~polymq_core.replication.jetstream.ShardLog`); each
message
of it is one **entry**: the writes a leader gathered (group commit), as
``msgpack([1, node_id, epoch, [[kind, *fields], ...]])`` (:func:`encode_entry`). Every node
applies every entry, in order, to its own SQLite snapshot of the shard
(:meth:`~polymq_core.store.sqlite.SqliteStore.apply_entry`), together with the entry's
sequence. A takeover entry (a new leader's fence) carries no writes.

The codec needs no NATS; the errors are here, below the stream's client
(:mod:`polymq_core.replication.jetstream`) and the replicated store
(:mod:`polymq_core.replication.replicatedstore`), because
reading an entry is the first thing that can find the log unreadable.

Errors::

    LogError                the log failed or holds something unreadable; ``__cause__`` is
     |                      the nats error beneath, when there is one
     +-- Deposed            an append's fence failed: somebody else appended, so this node
     |                      does not lead the shard
     +-- LogUnavailable     no answer: a timeout, no responders, no quorum, not connected
     +-- TailEnd            (:mod:`polymq_core.replication.jetstream`) a tail cannot go on: its next
                            entry was purged, or the log is shorter than what was applied
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = [
    "ENTRY_VERSION",
    "Deposed",
    "Entry",
    "LogError",
    "LogUnavailable",
    "NoLeader",
    "NotAppended",
    "decode_entry",
    "encode_entry",
]

ENTRY_VERSION = 1


class LogError(Exception):
    """The shard's log failed or holds something unreadable; ``__cause__`` says why."""


class Deposed(LogError):
    """An append's fence failed (somebody else appended): this node does not lead.
    ``last`` is the log's last sequence when the log said it."""

    def __init__(self, *args: object, last: int | None = None) -> None:
        super().__init__(*args)
        self.last = last


class LogUnavailable(LogError):
    """The log did not answer: a timeout, no responders, no quorum, not connected."""


class NoLeader(LogUnavailable):
    """Nobody took the append: the stream had no leader to answer (no responders, during
    an election). Unlike a timeout, this says for sure that the entry is not in the log."""


class NotAppended(LogError):
    """A write that never went to the log: its node stopped leading the shard (or closed
    its store) while the write waited for an entry. For sure not in the log."""


# -- entries (sans-IO) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One decoded entry. ``writes`` are ``(kind, *fields)`` tuples as the leader's
    records encoded them (:meth:`~polymq_core.store.writes.Write.encode`), the kind as a
    plain number; a takeover entry (a new leader's fence) has none."""

    node_id: str
    epoch: int
    writes: list[tuple[Any, ...]]
    takeover: bool = False


def encode_entry(
    node_id: str, epoch: int, writes: Sequence[Sequence[Any]], *, takeover: bool = False
) -> bytes:
    """``msgpack([1, node_id, epoch, writes])``; a takeover entry has no writes and a fifth
    element, ``True``."""
    if takeover and writes:
        raise ValueError("a takeover entry carries no writes")
    body: list[Any] = [ENTRY_VERSION, node_id, epoch, list(writes)]
    if takeover:
        body.append(True)
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return data


def decode_entry(data: bytes) -> Entry:
    """The entry in ``data``; :class:`LogError` if it is not one this code can read."""
    try:
        body = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise LogError(f"not a log entry (not msgpack: {exc})") from exc
    if not isinstance(body, list) or len(body) not in (4, 5):
        raise LogError(f"not a log entry: {body!r:.100}")
    version, node_id, epoch, writes, *rest = body
    if version != ENTRY_VERSION:
        raise LogError(f"log entry version {version!r}: this polymq reads {ENTRY_VERSION}")
    if not isinstance(node_id, str) or not node_id:
        raise LogError(f"log entry without a node id: {node_id!r:.100}")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise LogError(f"log entry with a bad epoch: {epoch!r:.100}")
    if not isinstance(writes, list) or not all(
        isinstance(w, list) and w and isinstance(w[0], int) for w in writes
    ):
        raise LogError(f"log entry with malformed writes: {writes!r:.100}")
    takeover = False
    if rest:
        if rest[0] is not True or writes:
            raise LogError(f"log entry with a bad takeover flag: {rest[0]!r:.100}")
        takeover = True
    return Entry(node_id, epoch, [tuple(w) for w in writes], takeover)
