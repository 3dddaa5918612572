"""A topic cursor (long-poll's subscriptions) takes a publish's messages at once as it takes
each alone: the same buffer, the same first position, every message past its bound dropped
from the oldest."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from polymq.types import Message
from polymq_core.handlers.cursors import TopicCursor


@given(st.lists(st.integers(0, 7), max_size=12), st.integers(1, 10))
def test_taking_a_publish_at_once_is_taking_each_message(sizes: list[int], limit: int) -> None:
    one_by_one, at_once = TopicCursor("a", "t", limit), TopicCursor("b", "t", limit)
    n = 0
    for size in sizes:
        msgs = [Message(body=b"%d" % (n + i)) for i in range(size)]
        n += size
        for m in msgs:
            one_by_one.send(m)
        at_once.send_all(msgs, sum(len(m.body) for m in msgs))
        assert list(at_once.buffer) == list(one_by_one.buffer)
        assert (at_once.first, at_once.cursor) == (one_by_one.first, one_by_one.cursor)
    assert len(at_once.buffer) == min(n, limit)
