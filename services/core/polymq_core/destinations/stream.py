"""A stream: persistent publish/subscribe, an append-only log read from an offset.

Entries have contiguous sequence numbers from 1; a publish gets its numbers when it comes
and is appended once written, so one whose write failed (a full disk, a lost leadership)
leaves a gap: an empty entry (no id) that readers skip. A subscriber starts at ``first``, ``last``
(the newest entry), ``next`` (only what comes after subscribing), a sequence number, or a
timestamp (the first entry at or after it), and reads forward at its own pace: the stream
pulls for each subscriber only while its socket drains and its prefetch window is open, so a
slow reader costs nothing but its cursor. Retention is bounded by ``max_length`` /
``max_bytes``; the oldest entries fall off first.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from polymq.types import DeclareOptions, Message, Outcome

from .subscription import Subscription

if TYPE_CHECKING:
    import asyncio

    from ..metrics import Sensors


class StreamHost(Protocol):
    """What a stream needs of the shard that holds it (a protocol: ``shard.py`` imports
    this module): its loop, its sensors, and the removal of trimmed entries from the store."""

    sensors: Sensors
    loop: asyncio.AbstractEventLoop

    def forget(self, key: str, seqs: list[int]) -> asyncio.Future[None]: ...


class Poller(Protocol):
    """A cursor subscription reading the stream (cursors.StreamCursor): woken by an append."""

    def wake(self) -> None: ...


_BURST = 512  # entries handed to one subscriber per pump before yielding to others


def _gap(seq: int, timestamp: float) -> Message:
    """The entry for a number whose write failed: no id, nothing to read."""
    return Message(b"", seq=seq, timestamp=timestamp)


class Stream:
    __slots__ = (
        "_assigned",
        "_gaps",
        "_pump_scheduled",
        "cursors",
        "durable",
        "entries",
        "first_seq",
        "key",
        "last_used",
        "metadata",
        "nbytes",
        "options",
        "pollers",
        "published",
        "shard",
    )

    def __init__(self, shard: StreamHost, key: str, options: DeclareOptions, *, last_seq: int = 0):
        self.shard = shard
        self.key = key
        self.options = options
        self.durable: bool = options.durable
        self.metadata: dict[str, str] = {}
        self.entries: deque[Message] = deque()
        self.first_seq = last_seq + 1  # seq of entries[0], or of the next entry when empty
        self.nbytes = 0
        self.cursors: dict[Subscription, int] = {}
        self.published = 0
        self.pollers: list[Poller] = []  # cursor subscriptions reading this stream
        self.last_used = time.monotonic()
        self._pump_scheduled = False
        self._assigned = last_seq  # the last seq handed to a publish (appended or not yet)
        self._gaps = 0  # entries that are gaps

    kind = "stream"  # (what its subscriptions name: Subscription.destination)

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.entries) - 1

    @property
    def idle(self) -> bool:
        return not (self.entries or self.cursors or self.metadata or self.pollers)

    def next_seq(self) -> int:
        """The seq for a new entry (publishes waiting for their write hold the ones
        before it)."""
        seq = max(self._assigned, self.last_seq) + 1
        self._assigned = seq
        return seq

    def stats(self) -> dict[str, Any]:
        return {
            "destination": self.key,
            "messages": len(self.entries) - self._gaps,
            "bytes": self.nbytes,
            "first_seq": self.first_seq if self.entries else None,
            "last_seq": self.last_seq if self.entries else None,
            "subscribers": len(self.cursors),
            "published": self.published,
            "options": self.options.to_dict(),
        }

    def put(self, message: Message) -> None:
        """Append an entry (new, or recovered): its seq comes after the last one's, with
        a gap for any number between them whose write failed."""
        entries = self.entries
        if not entries:
            self.first_seq = message.seq
        elif message.seq > self.last_seq + 1:
            for seq in range(self.last_seq + 1, message.seq):
                entries.append(_gap(seq, message.timestamp))
                self._gaps += 1
        entries.append(message)
        self.nbytes += len(message.body)
        self.published += 1
        self._trim()
        for poller in self.pollers:
            poller.wake()

    def _trim(self) -> None:
        opts = self.options
        dropped: list[int] = []
        while self.entries and (
            (opts.max_length is not None and len(self.entries) > opts.max_length)
            or (
                opts.max_bytes is not None
                and self.nbytes > opts.max_bytes
                and len(self.entries) > 1
            )
        ):
            old = self.entries.popleft()
            self.nbytes -= len(old.body)
            self.first_seq += 1
            if not old.id:
                self._gaps -= 1
            if old.persistent and self.durable:
                dropped.append(old.seq)
        if dropped:
            self.shard.forget(self.key, dropped)

    def start_of(self, offset: str | int | float) -> int:
        """The seq a new subscriber starting at ``offset`` reads first."""
        if offset == "first":
            return self.first_seq
        if offset == "last":
            return self.last_seq if self.entries else self.first_seq
        if offset == "next":
            return self.last_seq + 1
        if isinstance(offset, float):  # a timestamp
            i = bisect.bisect_left(self.entries, offset, key=lambda m: m.timestamp)
            return self.first_seq + i
        return max(int(offset), self.first_seq)

    def attach(self, sub: Subscription) -> int:
        """Start ``sub`` at its offset; the seq it reads first (what a subscribe answers,
        so that a client failing over before any delivery goes on from there)."""
        self.cursors[sub] = start = self.start_of(sub.options.offset)
        self.last_used = time.monotonic()
        self.pump()
        return start

    def detach(self, sub: Subscription, *, requeue: list[Message]) -> None:
        self.cursors.pop(sub, None)
        sub.inflight.clear()
        self.last_used = time.monotonic()

    def settle(self, sub: Subscription, keys: list[Any], outcome: Outcome) -> None:
        # Acks only open the window again; the log itself is never consumed.
        self.pump()

    def unsent(self, sub: Subscription, msg: Message) -> None:
        pass  # the entry is still in the log; a resubscribe from its seq reads it again

    def pump(self) -> None:
        more = False
        first = self.first_seq
        last = self.last_seq
        for sub, cur in self.cursors.items():
            if cur < first:
                cur = first
            sent = 0
            while cur <= last and sent < _BURST and sub.has_credit() and sub.session.writable:
                msg = self.entries[cur - first]
                cur += 1
                if not msg.id:
                    continue  # a gap
                sub.deliver(msg, cur - 1)
                sent += 1
            self.cursors[sub] = cur
            if sent:
                self.shard.sensors.on_deliver(sent)
            if sent == _BURST and cur <= last:
                more = True
        if more and not self._pump_scheduled:
            self._pump_scheduled = True
            self.shard.loop.call_soon(self._repump)

    def _repump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    def purge(self) -> list[Message]:
        out = list(self.entries)
        self.first_seq = self.last_seq + 1
        self.entries.clear()
        self.nbytes = 0
        self._gaps = 0
        return [m for m in out if m.id]

    def close(self, reason: str) -> None:
        for sub in list(self.cursors):
            sub.session.cancel(sub, "not-found", reason)
        self.cursors.clear()
