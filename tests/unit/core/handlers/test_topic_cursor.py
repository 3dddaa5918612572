"""A topic cursor (long-poll's subscriptions) takes a publish's messages at once: its buffer
is the last ``limit`` messages sent, in order, and its first position counts those dropped
from the oldest."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from polymq.types import Message
from polymq_core.handlers.cursors import TopicCursor


@given(st.lists(st.integers(0, 7), max_size=12), st.integers(1, 10))
def test_a_cursor_keeps_the_last_messages_within_its_bound(sizes: list[int], limit: int) -> None:
    cursor = TopicCursor("a", "t", limit)
    sent: list[Message] = []
    for size in sizes:
        msgs = [Message(body=b"%d" % (len(sent) + i)) for i in range(size)]
        sent += msgs
        cursor.send_all(msgs, sum(len(m.body) for m in msgs))
        kept = sent[-limit:]
        assert list(cursor.buffer) == kept
        assert cursor.first == len(sent) - len(kept) + 1
        assert cursor.cursor == len(sent)
