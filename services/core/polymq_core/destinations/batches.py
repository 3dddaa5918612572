"""Idempotent batches: a window of recently published batch ids per shard.

A publish that carries a ``batch_id`` is remembered under (destination, role, batch id) for
its window. A repeat inside the window publishes nothing and gets the first answer again,
with ``"duplicate": True``; a repeat that arrives while the first is still being made durable
waits for it and shares its outcome. A batch whose publish failed is forgotten, so that a
retry publishes it.

The window lives in the memory of the shard that owns the destination, and a batch is
remembered as durably as its messages: when any of them is written to the store (persistent
messages, durable destination), the batch id and its answer go in the same write
(``Store.append_batch``), so both are kept or neither; the shard reads them back when it
opens or (in a cluster) when it takes over, and a retry through any node after a restart or a
failover is still a duplicate. A batch of transient messages only, or one published to a
topic (its copies may go to several shards), is remembered in memory only: a restart
forgets it, and a retry publishes again (at-least-once). Entries are dropped when they expire
or, oldest first, when the shard holds ``max_entries``; the shard drops expired ones from the
store now and then (``Store.forget_batches``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import Any

import msgpack

from polymq.types import Message

MAX_BATCH_ID = 256  # characters
MAX_BATCH_TTL = 7 * 86400.0


class BatchWindow:
    def __init__(self, max_entries: int = 1_000_000) -> None:
        self.max_entries = max_entries
        # key -> (expires (monotonic), the answer's future); in insertion order
        self._entries: OrderedDict[str, tuple[float, asyncio.Future[Any]]] = OrderedDict()
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Awaitable[Any] | None:
        """The answer of a remembered batch, as a duplicate; None if not remembered."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, fut = entry
        if expires <= time.monotonic():
            del self._entries[key]
            return None
        self.duplicates += 1
        return _duplicate(fut)

    def remember(self, key: str, ttl: float, answer: Any) -> Awaitable[Any]:
        """Remember ``answer`` (a result, or an awaitable of one) under ``key``; returns what
        to answer the first publish with."""
        now = time.monotonic()
        self._prune(now)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any]
        if isinstance(answer, Awaitable):
            fut = asyncio.ensure_future(answer)
            fut.add_done_callback(lambda f: self._settled(key, f))
        else:
            fut = loop.create_future()
            fut.set_result(answer)
        self._entries[key] = (now + ttl, fut)
        self._entries.move_to_end(key)
        return asyncio.shield(fut)

    def restore(self, key: str, expires: float, answer: dict[str, Any]) -> None:
        """Remember a batch read back from the store, until ``expires`` (wall-clock)."""
        now = time.monotonic()
        self._prune(now)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(answer)
        self._entries[key] = (now + (expires - time.time()), fut)
        self._entries.move_to_end(key)

    def _settled(self, key: str, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            entry = self._entries.get(key)
            if entry is not None and entry[1] is fut:
                del self._entries[key]  # a failed batch is not remembered: a retry publishes

    def _prune(self, now: float) -> None:
        entries = self._entries
        while entries:
            key, (expires, _) = next(iter(entries.items()))
            if expires > now and len(entries) < self.max_entries:
                break
            del entries[key]


async def _duplicate(fut: asyncio.Future[Any]) -> Any:
    result = await asyncio.shield(fut)
    if isinstance(result, dict):
        return {**result, "duplicate": True}
    return result


def pack_answer(messages: Sequence[Message]) -> bytes:
    """The answer to a publish of ``messages`` (their ids and seqs assigned), as a batch keeps
    it in the store. A publish numbers its messages in a row (ids ``<boot>.<shard>.<n>``,
    seqs), so a row is kept as its first id and seq; anything else as the lists."""
    count = len(messages)
    if count:
        prefix, _, first = messages[0].id.rpartition(".")
        if first.isascii() and first.isdigit():
            n, seq = int(first), messages[0].seq
            if all(
                m.id == f"{prefix}.{n + i}" and m.seq == seq + i for i, m in enumerate(messages)
            ):
                return bytes(msgpack.packb([0, count, prefix, n, seq]))
    return bytes(msgpack.packb([1, count, [m.id for m in messages], [m.seq for m in messages]]))


def unpack_answer(blob: bytes) -> dict[str, Any]:
    """The answer that :func:`pack_answer` kept (``ValueError`` if ``blob`` is not one)."""
    try:
        form, count, *rest = msgpack.unpackb(blob)
        if form == 0:
            prefix, n, seq = rest
            ids = [f"{prefix}.{n + i}" for i in range(count)]
            seqs = list(range(seq, seq + count))
        elif form == 1:
            ids, seqs = rest
        else:
            raise ValueError(f"unknown form {form!r}")
    except Exception as exc:
        raise ValueError(f"not a stored batch answer: {exc}") from exc
    return {"count": count, "ids": ids, "seqs": seqs, "duplicate": False}
