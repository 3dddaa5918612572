"""Looking at a destination's messages without taking them (the ``Peek`` request): what
the admin API's ``GET /api/destinations/{kind}/{name}/messages`` shows.

A queue's head is read from its in-memory structures in the order :meth:`Queue._pop
<polymq_core.destinations.queue.Queue._pop>` would hand it out: the highest priority level first,
and
within a level the messages that came back (the ``requeued`` heap) merged with the ready
deque by sequence. Expired messages are skipped (the next pop discards them). A durable
queue that pages shows its in-memory window only: the paged messages come after it. A
stream shows its last entries (gaps left out). Nothing is moved, leased or counted.
"""

from __future__ import annotations

import heapq
import time

from polymq.types import Message

from .queue import Queue
from .stream import Stream

__all__ = ["MAX_PEEK", "head", "tail"]

MAX_PEEK = 100  # messages one peek shows at most


def head(queue: Queue, count: int, now: float | None = None) -> list[Message]:
    """The first ``count`` ready messages of ``queue``, in delivery order."""
    now = time.time() if now is None else now
    out: list[Message] = []
    for level in range(len(queue.ready) - 1, -1, -1):
        back = (m for _, m in sorted(queue.requeued[level], key=lambda e: e[0]))
        for msg in heapq.merge(back, queue.ready[level], key=lambda m: m.seq):
            if msg.expires is not None and msg.expires <= now:
                continue
            out.append(msg)
            if len(out) >= count:
                return out
    return out


def tail(stream: Stream, count: int) -> list[Message]:
    """The last ``count`` entries of ``stream`` (oldest first), gaps left out."""
    out: list[Message] = []
    for msg in reversed(stream.entries):
        if msg.id:  # (a gap has none)
            out.append(msg)
            if len(out) >= count:
                break
    out.reverse()
    return out
