"""A pull without a wait on a queue whose ready messages are all paged (in the store only)
waits for the page its lease asked for, instead of answering nothing while the queue holds
messages (``handlers.consumers._lease_or_wait``); a queue with nothing at all answers at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from polymq.types import DeclareOptions, Message
from polymq_core.destinations.queue import Queue
from polymq_core.handlers import consumers


class _Sensors:
    def on_deliver(self, n: int) -> None:
        pass


class PagingShard:
    """A queue's shard whose page reads come back only when the test says so."""

    max_frame = 1024 * 1024

    def __init__(self) -> None:
        self.sensors = _Sensors()
        self.stored: list[Message] = []
        self.reads: list[tuple[int, int, Callable[[list[Message] | None], None]]] = []
        self._did = 0

    def new_delivery_id(self) -> int:
        self._did += 1
        return self._did

    def schedule(self, deadline: float, holder: Queue, seq: int, delivery_id: int) -> None:
        pass

    def delivered(self, queue: Queue, msg: Message) -> None:
        pass

    def read_page(
        self, key: str, after: int, limit: int, done: Callable[[list[Message] | None], None]
    ) -> None:
        self.reads.append((after, limit, done))

    def answer_reads(self) -> None:
        reads, self.reads = self.reads, []
        for after, limit, done in reads:
            done([m for m in self.stored if m.seq > after][:limit])


def _paging_queue(n: int) -> tuple[Queue, PagingShard]:
    """A queue of ``n`` messages with a window of one message: one ready, the rest paged."""
    shard = PagingShard()
    q = Queue(shard, "queue/q", DeclareOptions(), window=(1, 1 << 20))  # type: ignore[arg-type]
    for _ in range(n):
        m = Message(body=b"x", persistent=True)
        m.seq = q.next_seq()
        shard.stored.append(m)
        q.put(m)
    return q, shard


async def test_a_pull_without_a_wait_waits_for_the_page_of_a_paged_queue() -> None:
    q, shard = _paging_queue(3)
    first: Any = consumers._lease_or_wait(q, 5, 0, 30.0)
    assert [m.seq for _, m in first] == [1]  # the one in memory, at once
    assert q.paged == 2 and shard.reads  # the lease asked for the next page
    pending: Any = consumers._lease_or_wait(q, 5, 0, 30.0)
    assert isinstance(pending, asyncio.Future) and not pending.done()  # not [] at once
    shard.answer_reads()
    got = await asyncio.wait_for(pending, 1)
    assert [m.seq for _, m in got] == [2]  # what the page brought (the window: one)


async def test_a_pull_without_a_wait_on_an_empty_queue_answers_at_once() -> None:
    q, _ = _paging_queue(0)
    assert consumers._lease_or_wait(q, 5, 0, 30.0) == []
