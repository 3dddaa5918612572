"""Paging: a durable queue keeps a bounded window of ready messages in memory.

Past the window (``POLYMQ_QUEUE_WINDOW_MESSAGES`` / ``_BYTES``) a durable queue's new
messages stay in the store only: the queue counts them (:class:`Pages`) and reads them back
in seq order, a page at a time, once fewer than half a window are ready in memory. Since
every message from the first paged one on is in the store, the paged messages are exactly
the queue's stored messages from :attr:`Pages.first` on; a transient message that comes
while the queue pages is written like a persistent one (it then survives a restart too).
A restart reads one window of each queue and counts the rest the same way.

What pages: durable queues on one node. A replicated core keeps its queues in memory (its
local store is written as the log is applied, a step behind the leader's memory), and so
do queues that are not durable (nothing of theirs is stored) and queues whose overflow
policy is drop-head (bounded by their max-length).
"""

from __future__ import annotations

from polymq.types import Message


class Pages:
    """The messages of a queue that are in the store only: how many, their body bytes
    (after a restart, an estimate: Store.measure_messages), the first one's seq, and
    which purge they outlived (``generation``: a page read across a purge is dropped)."""

    __slots__ = ("count", "first", "generation", "nbytes", "reading", "window", "window_bytes")

    def __init__(self, window: int, window_bytes: int) -> None:
        self.window = window
        self.window_bytes = window_bytes
        self.count = 0
        self.nbytes = 0
        self.first = 0
        self.generation = 0
        self.reading = False

    def full(self, count: int, nbytes: int) -> bool:
        """Does a message that comes now stay in the store only? Once anything is paged,
        everything after it is too (the order in the store is the queue's order)."""
        return bool(self.count) or count >= self.window or nbytes >= self.window_bytes

    def add(self, msg: Message) -> None:
        if not self.count:
            self.first = msg.seq
        self.count += 1
        self.nbytes += len(msg.body)

    def add_stored(self, count: int, nbytes: int, after: int) -> None:
        """A restart found ``count`` more messages (``nbytes``) past seq ``after``."""
        if not count:
            return
        if not self.count:
            self.first = after + 1
        self.count += count
        self.nbytes += nbytes

    def wanted(self, count: int, nbytes: int) -> int:
        """How many to read back now, with ``count`` messages (``nbytes``) ready in memory:
        0 while half a window or more is ready, else up to a full window, by the paged
        messages' mean size."""
        if not self.count or self.reading:
            return 0
        if count * 2 >= self.window or nbytes * 2 >= self.window_bytes:
            return 0
        mean = max(self.nbytes // self.count, 1)
        room = min(self.window - count, (self.window_bytes - nbytes) // mean)
        return max(1, min(room, self.count))

    def took(self, page: list[Message]) -> None:
        """``page`` was read back, in order."""
        if not page:  # the store has none left: the counts were off
            self.count = self.nbytes = 0
            return
        self.count = max(self.count - len(page), 0)
        self.nbytes = max(self.nbytes - sum(len(m.body) for m in page), 0)
        self.first = page[-1].seq + 1
        if not self.count:
            self.nbytes = 0

    def clear(self) -> int:
        """Purged: returns how many there were."""
        count = self.count
        self.count = self.nbytes = 0
        self.generation += 1
        return count
