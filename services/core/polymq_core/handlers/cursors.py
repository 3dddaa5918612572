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

A queue's or stream's cursor subscription is kept with its destination: opening one writes
it to the shard's store (``Store.save_cursor``: the answer waits until it is durable, in a
cluster committed to the shard's log), closing it or its idle ``ttl`` removes it. A shard
reads its cursors back when it opens or takes over, with their ``ttl`` started afresh, so a
poll goes on after a restart of the core or a failover. In a cluster the id says where the
subscription lives: ``~<shard>~<token>`` for a queue's or a stream's (the shard's leader
holds it, whichever node that is; :mod:`polymq_core.forwarding.relay` forwards polls there), and
``<node>~<token>`` for a topic's, which holds transient messages in the memory of the node
that opened it (gone with that node, as its messages are). One node's ids are the token.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import msgpack

from polymq.errors import BadRequest, Gone, NotFound
from polymq.types import Destination, Kind, Message, parse_offset

from ..destinations.queue import Queue
from ..store.writes import DeleteCursor, SaveCursor
from .answers import then

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..destinations.shard import Shard
    from ..destinations.stream import Stream
    from ..destinations.subscription import TopicReceiver
    from ..topics.trie import TopicRouter

log = logging.getLogger(__name__)

MAX_TTL = 24 * 3600.0
MAX_BUFFER = 1_000_000
SEP = "~"  # between the parts of a cursor id in a cluster
_STREAM, _QUEUE = 0, 1  # what a stored cursor record is


class _Waiting:
    """Futures of polls waiting for a first message."""

    __slots__ = ("polling", "waiters")

    def __init__(self) -> None:
        # (a dict: a poll that times out leaves it in O(1), not by a scan of 10,000)
        self.waiters: dict[asyncio.Future[None], None] = {}
        self.polling = 0  # polls in progress: a subscription being read is not idle

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, {}
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

    def send_all(self, messages: list[Message], nbytes: int) -> None:
        """Called by the topic router for each matching publish: its messages, in order, the
        oldest dropped past the bound (``nbytes`` unused: the bound counts messages)."""
        buffer = self.buffer
        buffer.extend(messages)
        over = len(buffer) - self.limit
        if over > 0:
            for _ in range(over):
                buffer.popleft()
            self.first += over
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
        holder = self.shard.get(self.key)
        assert not isinstance(holder, Queue)
        return holder

    def poll(self, cursor: int | None, max_: int) -> tuple[int, list[str], list[Message]]:
        stream = self._stream()
        c = self.start - 1 if cursor is None else cursor
        if c + 1 < stream.first_seq and stream.entries:
            raise Gone(f"cursor {c}: the stream now starts at {stream.first_seq}")
        if c > stream.last_seq:
            raise BadRequest(f"cursor {c} is ahead of the stream ({stream.last_seq})")
        lo = max(c + 1 - stream.first_seq, 0)
        entries = stream.entries
        read = [entries[i] for i in range(lo, min(lo + max_, len(entries)))]
        out = [m for m in read if m.id]  # (not the gaps of failed writes)
        return (read[-1].seq if read else c), [""] * len(out), out


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
        holder = self.shard.get(self.key)
        assert isinstance(holder, Queue)
        return holder

    def poll(self, cursor: int | None, max_: int) -> tuple[int, list[str], list[Message]]:
        got = self.queue().lease(max_, self.visibility, time.time())
        return cursor or 0, [r for r, _ in got], [m for _, m in got]


Cursor = TopicCursor | StreamCursor | QueueCursor


class Cursors:
    """Every cursor subscription of this node, with their idle timers. ``topics``: the
    core's topic router (a topic cursor is one of its subscribers); ``shard_for``: the shard
    of a key; ``node_id``: this node's id in a cluster (a topic cursor lives on the node
    that opened it; the others, on their shard's leader), None on a single node."""

    def __init__(
        self,
        topics: TopicRouter[TopicReceiver],
        shard_for: Callable[[str], Shard],
        node_id: str | None,
    ) -> None:
        self.topics = topics
        self.shard_for = shard_for
        self.node_id = node_id
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

    def open(self, dest: Destination, options: Any) -> Any:
        if not isinstance(options, dict) or set(options) - {
            "offset",
            "ttl",
            "visibility",
            "buffer",
        }:
            raise BadRequest("cursor options are offset, ttl, visibility and buffer")
        ttl = _number(options.get("ttl", 300.0), "ttl", 1.0, MAX_TTL)
        sub_id = secrets.token_urlsafe(12)
        node_id = self.node_id
        cur: Cursor
        if dest.kind is Kind.TOPIC:
            if node_id is not None:
                sub_id = f"{node_id}{SEP}{sub_id}"
            buffer = int(_number(options.get("buffer", 10_000), "buffer", 1, MAX_BUFFER))
            cur = TopicCursor(sub_id, dest.name, buffer)
            try:
                self.topics.add(dest.name, cur)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        elif dest.kind is Kind.STREAM:
            key = str(dest)
            shard = self.shard_for(key)
            holder = shard.get(key)
            offset = parse_offset(options.get("offset"))
            assert not isinstance(holder, Queue)
            if node_id is not None:
                sub_id = f"{SEP}{shard.index}{SEP}{sub_id}"
            cur = StreamCursor(sub_id, shard, key, holder.start_of(offset))
            holder.pollers.append(cur)
        elif dest.kind is Kind.QUEUE:
            key = str(dest)
            vis = _number(options.get("visibility", 30.0), "visibility", 0.1, 43200)
            shard = self.shard_for(key)
            if node_id is not None:
                sub_id = f"{SEP}{shard.index}{SEP}{sub_id}"
            cur = QueueCursor(sub_id, shard, key, vis)
            cur.queue()  # exists from now on
        else:
            raise BadRequest("cursor subscriptions work on queues, topics and streams")
        self._add(cur, str(dest), ttl)
        result = {"id": sub_id, "cursor": cur.cursor}
        if isinstance(cur, TopicCursor):
            return result
        key, record = cur.key, _record(cur, ttl)
        return then(cur.shard.commit(SaveCursor(sub_id, key, record)), result)

    def _add(self, cur: Cursor, destination: str, ttl: float) -> None:
        self.subs[cur.id] = cur
        self.ttl[cur.id] = ttl
        self.deadline[cur.id] = time.monotonic() + ttl
        self.destination[cur.id] = destination

    def restore(self, shard: Shard, records: list[tuple[str, str, bytes]]) -> None:
        """Take back the cursor subscriptions a shard read from its store (it opened, or
        this node took it over); their ttl starts afresh."""
        for sub_id, key, blob in records:
            try:
                kind, value, ttl = msgpack.unpackb(blob)
                cur: Cursor
                if kind == _STREAM:
                    holder = shard.get(key)
                    if isinstance(holder, Queue):
                        raise ValueError(f"{key} is not a stream")
                    cur = StreamCursor(sub_id, shard, key, int(value))
                    holder.pollers.append(cur)
                elif kind == _QUEUE:
                    cur = QueueCursor(sub_id, shard, key, float(value))
                else:
                    raise ValueError(f"unknown kind {kind!r}")
                self._add(cur, key, float(ttl))
            except Exception as exc:
                log.warning("shard %d: ignoring stored cursor %s: %s", shard.index, sub_id, exc)

    def drop(self, shard: Shard) -> None:
        """The shard is no longer led here: forget its cursor subscriptions (their polls
        find them at the new leader), and wake the polls waiting on them."""
        for sub_id, cur in list(self.subs.items()):
            if not isinstance(cur, TopicCursor) and cur.shard is shard:
                self._forget(sub_id)

    def get(self, sub_id: Any) -> Cursor:
        cur = self.subs.get(sub_id) if isinstance(sub_id, str) else None
        if cur is None:
            raise NotFound(f"no subscription {str(sub_id)[:40]!r} (unknown, or idle past its ttl)")
        self.deadline[sub_id] = time.monotonic() + self.ttl[sub_id]
        return cur

    def close(self, sub_id: str) -> asyncio.Future[None] | None:
        """Remove a subscription; the future of its removal from the store, if it was there."""
        cur = self._forget(sub_id)
        if not isinstance(cur, TopicCursor) and cur.shard.leading:
            return cur.shard.commit(DeleteCursor(sub_id))
        return None

    def _forget(self, sub_id: str) -> Cursor:
        cur = self.subs.pop(sub_id, None)
        if cur is None:
            raise NotFound(f"no subscription {sub_id[:40]!r}")
        del self.ttl[sub_id], self.deadline[sub_id], self.destination[sub_id]
        if isinstance(cur, TopicCursor):
            self.topics.remove(cur.pattern, cur)
            cur.wake()
        elif isinstance(cur, StreamCursor):
            holder = cur.shard.holders.get(cur.key)
            if holder is not None and not isinstance(holder, Queue) and cur in holder.pollers:
                holder.pollers.remove(cur)
            cur.wake()
        return cur

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


def _record(cur: StreamCursor | QueueCursor, ttl: float) -> bytes:
    """What the store keeps of a queue's or stream's cursor subscription."""
    if isinstance(cur, StreamCursor):
        return bytes(msgpack.packb([_STREAM, cur.start, ttl]))
    return bytes(msgpack.packb([_QUEUE, cur.visibility, ttl]))


def _number(v: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise BadRequest(f"{name} must be a number {lo:g}..{hi:g}")
    return float(v)
