"""Cursor subscriptions: subscriptions that live in the core, not on a connection.

A browser behind a load balancer polls through whichever frontend it reaches; so the
subscription is kept here, read by polls that carry a cursor, and removed after ``ttl``
seconds without a poll. Presenting a cursor confirms everything up to it, so a poll whose
answer was lost is simply repeated with the same cursor (nothing lost, nothing twice).

- topic: matched messages are buffered here (up to ``buffer``, oldest dropped); each gets the
  next position of this subscription. A cursor older than the oldest held is :class:`Gone`.
- stream: the cursor is the stream's own sequence; the log is read in place.
- queue: a poll leases messages for ``visibility`` seconds; receipts settle them and unacked
  ones come back when the lease expires (the cursor does not move).

In a cluster these will be replicated with the shard of their destination; on one node they
are memory only (a core restart forgets them, and a poll then gets NotFound).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from polymq.errors import BadRequest, Gone, NotFound
from polymq.types import Destination, Kind, Message, parse_offset

from .queue import Queue

if TYPE_CHECKING:
    from .broker import Broker
    from .shard import Shard
    from .stream import Stream

log = logging.getLogger(__name__)

MAX_TTL = 24 * 3600.0
MAX_BUFFER = 1_000_000


class _Waiting:
    """Futures of polls waiting for a first message."""

    __slots__ = ("polling", "waiters")

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[None]] = []
        self.polling = 0  # polls in progress: a subscription being read is not idle

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


class TopicCursor(_Waiting):
    __slots__ = ("buffer", "first", "id", "limit", "pattern")

    def __init__(self, sub_id: str, pattern: str, limit: int) -> None:
        super().__init__()
        self.id = sub_id
        self.pattern = pattern
        self.limit = limit
        self.buffer: deque[Message] = deque()
        self.first = 1  # position of buffer[0] (or of the next message when empty)

    @property
    def cursor(self) -> int:
        return self.first + len(self.buffer) - 1

    def send(self, message: Message) -> None:
        """Called by the topic router for each matching publish."""
        self.buffer.append(message)
        if len(self.buffer) > self.limit:
            self.buffer.popleft()
            self.first += 1
        self.wake()

    def poll(self, cursor: int | None, max_: int) -> tuple[int, list[str], list[Message]]:
        c = self.first - 1 if cursor is None else cursor
        if c < self.first - 1:
            raise Gone(f"cursor {c} is older than the oldest message held ({self.first})")
        if c > self.cursor:
            raise BadRequest(f"cursor {c} is ahead of this subscription ({self.cursor})")
        buffer = self.buffer
        while buffer and self.first <= c:  # confirmed by presenting the cursor
            buffer.popleft()
            self.first += 1
        out = [buffer[i] for i in range(min(max_, len(buffer)))]
        return c + len(out), [""] * len(out), out


class StreamCursor(_Waiting):
    __slots__ = ("id", "key", "shard", "start")

    def __init__(self, sub_id: str, shard: Shard, key: str, start: int) -> None:
        super().__init__()
        self.id = sub_id
        self.shard = shard
        self.key = key
        self.start = start  # the first seq this subscription reads

    @property
    def cursor(self) -> int:
        return self.start - 1

    def _stream(self) -> Stream:
        box = self.shard.get(self.key)
        assert not isinstance(box, Queue)
        return box

    def poll(self, cursor: int | None, max_: int) -> tuple[int, list[str], list[Message]]:
        stream = self._stream()
        c = self.start - 1 if cursor is None else cursor
        if c + 1 < stream.first_seq and stream.entries:
            raise Gone(f"cursor {c}: the stream now starts at {stream.first_seq}")
        if c > stream.last_seq:
            raise BadRequest(f"cursor {c} is ahead of the stream ({stream.last_seq})")
        lo = max(c + 1 - stream.first_seq, 0)
        entries = stream.entries
        out = [entries[i] for i in range(lo, min(lo + max_, len(entries)))]
        return (out[-1].seq if out else c), [""] * len(out), out


class QueueCursor:
    __slots__ = ("id", "key", "polling", "shard", "visibility")

    def __init__(self, sub_id: str, shard: Shard, key: str, visibility: float) -> None:
        self.polling = 0
        self.id = sub_id
        self.shard = shard
        self.key = key
        self.visibility = visibility

    cursor = 0

    def queue(self) -> Queue:
        box = self.shard.get(self.key)
        assert isinstance(box, Queue)
        return box

    def poll(self, cursor: int | None, max_: int) -> tuple[int, list[str], list[Message]]:
        got = self.queue().lease(max_, self.visibility, time.time())
        return cursor or 0, [r for r, _ in got], [m for _, m in got]


Cursor = TopicCursor | StreamCursor | QueueCursor


class Cursors:
    """Every cursor subscription of this node, with their idle timers."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.subs: dict[str, Cursor] = {}
        self.ttl: dict[str, float] = {}
        self.deadline: dict[str, float] = {}
        self.destination: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._expire(), name="cursors")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def open(self, dest: Destination, options: Any) -> dict[str, Any]:
        if not isinstance(options, dict) or set(options) - {
            "offset",
            "ttl",
            "visibility",
            "buffer",
        }:
            raise BadRequest("cursor options are offset, ttl, visibility and buffer")
        ttl = _number(options.get("ttl", 300.0), "ttl", 1.0, MAX_TTL)
        sub_id = secrets.token_urlsafe(12)
        cur: Cursor
        if dest.kind is Kind.TOPIC:
            buffer = int(_number(options.get("buffer", 10_000), "buffer", 1, MAX_BUFFER))
            cur = TopicCursor(sub_id, dest.name, buffer)
            try:
                self.broker.topics.add(dest.name, cur)  # type: ignore[arg-type]
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        elif dest.kind is Kind.STREAM:
            key = str(dest)
            shard = self.broker.shard_for(key)
            box = shard.get(key)
            offset = parse_offset(options.get("offset"))
            assert not isinstance(box, Queue)
            cur = StreamCursor(sub_id, shard, key, box.start_of(offset))
            box.pollers.append(cur)
        elif dest.kind is Kind.QUEUE:
            key = str(dest)
            vis = _number(options.get("visibility", 30.0), "visibility", 0.1, 43200)
            cur = QueueCursor(sub_id, self.broker.shard_for(key), key, vis)
            cur.queue()  # exists from now on
        else:
            raise BadRequest("cursor subscriptions work on queues, topics and streams")
        self.subs[sub_id] = cur
        self.ttl[sub_id] = ttl
        self.deadline[sub_id] = time.monotonic() + ttl
        self.destination[sub_id] = str(dest)
        return {"id": sub_id, "cursor": cur.cursor}

    def get(self, sub_id: Any) -> Cursor:
        cur = self.subs.get(sub_id) if isinstance(sub_id, str) else None
        if cur is None:
            raise NotFound(f"no subscription {str(sub_id)[:40]!r} (unknown, or idle past its ttl)")
        self.deadline[sub_id] = time.monotonic() + self.ttl[sub_id]
        return cur

    def close(self, sub_id: str) -> None:
        cur = self.subs.pop(sub_id, None)
        if cur is None:
            raise NotFound(f"no subscription {sub_id[:40]!r}")
        del self.ttl[sub_id], self.deadline[sub_id], self.destination[sub_id]
        if isinstance(cur, TopicCursor):
            self.broker.topics.remove(cur.pattern, cur)  # type: ignore[arg-type]
            cur.wake()
        elif isinstance(cur, StreamCursor):
            box = cur.shard.boxes.get(cur.key)
            if box is not None and not isinstance(box, Queue) and cur in box.pollers:
                box.pollers.remove(cur)
            cur.wake()

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for sub_id in [s for s, d in self.deadline.items() if d <= now]:
                if self.subs[sub_id].polling:  # a poll is waiting on it: in use, not idle
                    self.deadline[sub_id] = now + self.ttl[sub_id]
                    continue
                log.info("cursor subscription %s idle past its ttl: removed", sub_id)
                self.close(sub_id)


def _number(v: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise BadRequest(f"{name} must be a number {lo:g}..{hi:g}")
    return float(v)
