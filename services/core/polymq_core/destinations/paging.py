"""Paging: a durable queue keeps a bounded window of ready messages in memory.

Past the window (``POLYMQ_QUEUE_WINDOW_MESSAGES`` / ``_BYTES``, the bytes being each ready
message's body plus :data:`OVERHEAD`, what it costs in memory) a durable queue's new
messages stay in the store only: the queue counts them (:class:`Pages`) and reads them back
in seq order, a page at a time, once fewer than half a window are ready in memory. Since
every message from the first paged one on is in the store, the paged messages are exactly
the queue's stored messages from :attr:`Pages.first` on; a transient message that comes
while the queue pages is written too, marked ``stored`` (``Message.stored``, never on the
wire), so that its row goes when it leaves the queue as a persistent one's does; it is still
delivered as transient (it survives a restart, though, as a persistent one does).
A restart reads one window of each queue and counts the rest the same way.

Under memory pressure (:class:`Pressure`: the core's memory past the memory alarm's low
watermark, ``polymq_core.alarms``) the window shrinks to 1/:data:`SQUEEZE` of itself: new
messages go to the store sooner, and pages read back are smaller; what is in memory stays.

What pages: durable queues, on one node and on a replicated core's leader. Queues that are
not durable (nothing of theirs is stored) and queues whose overflow policy is drop-head
(bounded by their max-length) keep everything in memory.

In a replicated core the leader's local store is written as the log is applied, a step
behind its commits (entries are held a moment, then applied together: docs/cluster.md).
A message is counted as paged only once its entry is committed, and a committed entry is
already held for the local store, so a page read first waits until what is held is applied
(``ReplicatedStore.load_page``): it neither misses a committed message nor sees one twice
(the read starts after :attr:`Pages.first`, and what it returns is a prefix, in seq order,
of what is counted). A new leader loads one window and counts the rest; a message read
back carries the delivery count its store has, raised by the log's delivery marks
(``Shard.delivered``), so only what the old leader delivered comes back flagged.
"""

from __future__ import annotations

from polymq.types import Message

SQUEEZE = 8  # a window under memory pressure is this many times smaller
# what a ready message costs in memory beside its body (its Message, its place in the
# queue, the id's string; the backlog scenario measured 1,543 B for one of 1 KB): the bytes
# bound counts it, so a window is memory, not bodies (32 MiB: ~60k messages of 32 B,
# ~21k of 1 KB, 512 of 64 KB)
OVERHEAD = 512


class Pressure:
    """Whether the core's memory is under pressure (set by the memory alarm's monitor at
    each measure; shared by every paging queue)."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


class Pages:
    """The messages of a queue that are in the store only: how many, their body bytes
    (after a restart, an estimate: Store.measure_messages), the first one's seq, and
    and which purge they outlived (``generation``: a page read across a purge is dropped)."""

    __slots__ = (
        "count",
        "first",
        "generation",
        "nbytes",
        "pressure",
        "reading",
        "window",
        "window_bytes",
    )

    def __init__(self, window: int, window_bytes: int, pressure: Pressure | None = None) -> None:
        self.window = window
        self.window_bytes = window_bytes
        self.pressure = pressure
        self.count = 0
        self.nbytes = 0
        self.first = 0
        self.generation = 0
        self.reading = False

    def bounds(self) -> tuple[int, int]:
        """The window now, (messages, bytes): squeezed under memory pressure."""
        if self.pressure is not None and self.pressure.on:
            return max(self.window // SQUEEZE, 1), max(self.window_bytes // SQUEEZE, 1)
        return self.window, self.window_bytes

    def full(self, count: int, nbytes: int) -> bool:
        """Does a message that comes now stay in the store only? Once anything is paged,
        everything after it is too (the order in the store is the queue's order)."""
        if self.count:
            return True
        window, window_bytes = self.bounds()
        return count >= window or nbytes + count * OVERHEAD >= window_bytes

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
        """How many to read back now, with ``count`` messages (``nbytes`` of bodies) ready in
        memory: 0 while half a window or more is ready, else up to a full window, by the
        paged messages' mean size (and :data:`OVERHEAD` each)."""
        if not self.count or self.reading:
            return 0
        window, window_bytes = self.bounds()
        in_memory = nbytes + count * OVERHEAD
        if count * 2 >= window or in_memory * 2 >= window_bytes:
            return 0
        mean = self.nbytes // self.count + OVERHEAD
        room = min(window - count, (window_bytes - in_memory) // mean)
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
