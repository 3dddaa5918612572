"""Tests for polymq_core.destinations.peek without sockets: a queue's head in the order it would be
delivered (priority, then sequence; requeued messages in their place), untouched; a stream's
tail without its gaps."""

from __future__ import annotations

import time

from polymq.types import DeclareOptions, Message
from polymq_core.destinations import peek
from polymq_core.destinations.stream import Stream

from .test_queue import FakeSession, queue, subscribe


def _put(q: object, body: bytes, priority: int = 4, expires: float | None = None) -> Message:
    m = Message(body, priority=priority, expires=expires)
    m.seq = q.next_seq()  # type: ignore[attr-defined]
    q.put(m)  # type: ignore[attr-defined]
    return m


def test_head_is_in_delivery_order_and_takes_nothing() -> None:
    q, _ = queue()
    for body, priority in ((b"a", 1), (b"b", 9), (b"c", 4), (b"d", 9), (b"e", 1)):
        _put(q, body, priority)
    assert [m.body for m in peek.head(q, 10)] == [b"b", b"d", b"c", b"a", b"e"]
    assert [m.body for m in peek.head(q, 2)] == [b"b", b"d"]
    assert q.count == 5 and not q.inflight and q.delivered == 0
    # the order a consumer then gets them in is the one shown
    session = FakeSession()
    subscribe(q, session, 1, prefetch=10)
    q.pump()
    bodies = {m.seq: m.body for level in q.inflight.values() for m in [level.message]}
    assert [bodies[seq] for _, _, seq in session.got] == [b"b", b"d", b"c", b"a", b"e"]


def test_head_puts_requeued_messages_back_in_sequence_order() -> None:
    q, _ = queue()
    msgs = [_put(q, bytes([65 + i])) for i in range(4)]
    first = q._pop(time.time())
    second = q._pop(time.time())
    assert first is msgs[0] and second is msgs[1]
    q.requeue(second)  # it comes back before what was published after it
    assert [m.body for m in peek.head(q, 10)] == [b"B", b"C", b"D"]
    q.requeue(first)
    assert [m.body for m in peek.head(q, 10)] == [b"A", b"B", b"C", b"D"]


def test_head_leaves_out_expired_messages_and_respects_max_priority() -> None:
    q, _ = queue(max_priority=0)  # strictly FIFO: priorities do not reorder
    _put(q, b"old", 9, expires=time.time() - 1)
    _put(q, b"x", 2)
    _put(q, b"y", 9)
    assert [m.body for m in peek.head(q, 10)] == [b"x", b"y"]


class _Shard:
    pass


def test_tail_is_the_last_entries_oldest_first_without_gaps() -> None:
    s = Stream(_Shard(), "stream/s", DeclareOptions())  # type: ignore[arg-type]
    for seq in (1, 2, 3, 5, 6):  # 4's write failed: a gap
        m = Message(f"e{seq}".encode(), id=f"id{seq}")
        m.seq = seq
        s.put(m)
    assert [m.body for m in peek.tail(s, 3)] == [b"e3", b"e5", b"e6"]
    assert [m.body for m in peek.tail(s, 100)] == [b"e1", b"e2", b"e3", b"e5", b"e6"]
    assert len(s.entries) == 6  # the gap is kept, just not shown
