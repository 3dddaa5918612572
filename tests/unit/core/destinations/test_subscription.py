"""Tests for polymq_core.destinations.subscription: a subscription's delivery state (tags, unacked
deliveries, closed) lives in a window shared by every subscription that never delivered,
and its own from the first delivery on; the destination comes from its source."""

from __future__ import annotations

import sys
from typing import Any

from polymq.types import AckMode, DeclareOptions, Destination, Kind, Message, SubscribeOptions
from polymq_core.destinations.queue import Queue
from polymq_core.destinations.stream import Stream
from polymq_core.destinations.subscription import Subscription, TopicSource
from polymq_core.topics.trie import TopicRouter


class FakeSession:
    name = "fake"

    def __init__(self) -> None:
        self.got: list[tuple[int, int, Any]] = []  # (sid, tag, key)

    writable = True  # (False: a socket not draining, where each delivery is held)

    def accepts(self, sub: Subscription) -> bool:
        return True

    def push_delivery(self, sub: Subscription, tag: int, msg: Message, key: Any) -> None:
        self.got.append((sub.sid, tag, key))

    def push_deliveries(
        self, sub: Subscription, first: int, msgs: list[Message], nbytes: int
    ) -> None:
        assert nbytes == sum(len(m.body) for m in msgs)
        self.got += [(sub.sid, first + i, None) for i in range(len(msgs))]


class FakeHolder:
    """A queue's side, as far as a subscription sees it: its key names its kind."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.kind = key.partition("/")[0]


def topic_sub(
    session: FakeSession, sid: int, name: str = "news.sport", **opts: Any
) -> Subscription:
    source = TopicSource(TopicRouter())
    return Subscription(session, sid, f"topic/{name}", SubscribeOptions(**opts), source)  # type: ignore[arg-type]


def test_an_idle_subscription_is_small_and_shares_its_window() -> None:
    session = FakeSession()
    a, b = topic_sub(session, 1), topic_sub(session, 2)
    assert a.window is b.window  # nothing of its own until it delivers
    assert sys.getsizeof(a) <= 80  # six slots and the GC header
    assert a.next_tag == 1 and a.inflight == {} and not a.closed


def test_the_first_delivery_gives_a_window_of_its_own() -> None:
    session = FakeSession()
    a, b = topic_sub(session, 1), topic_sub(session, 2)
    a.send_all([Message(body=b"x")], 1)
    a.send_all([Message(body=b"y")], 1)
    assert session.got == [(1, 1, None), (1, 2, None)]
    assert a.next_tag == 3 and b.next_tag == 1  # b is untouched
    assert a.window is not b.window and b.inflight == {}
    b.send_all([Message(body=b"z")], 1)
    assert session.got[-1] == (2, 1, None)


def test_a_topics_messages_go_over_in_one_call_under_consecutive_tags() -> None:
    session = FakeSession()
    a, b = topic_sub(session, 1), topic_sub(session, 2)
    a.send_all([Message(body=b"x")], 1)
    msgs = [Message(body=b"y"), Message(body=b"zz")]
    a.send_all(msgs, 3)
    b.send_all(msgs, 3)
    assert session.got == [(1, 1, None), (1, 2, None), (1, 3, None), (2, 1, None), (2, 2, None)]
    assert a.next_tag == 4 and b.next_tag == 3 and a.inflight == {}


def queue_subs(session: FakeSession, mode: AckMode) -> tuple[Subscription, Subscription]:
    """Two subscriptions to one queue, sids 1 and 2."""
    holder, opts = FakeHolder("queue/q"), SubscribeOptions(ack_mode=mode)
    a = Subscription(session, 1, "queue/q", opts, holder)  # type: ignore[arg-type]
    return a, Subscription(session, 2, "queue/q", opts, holder)  # type: ignore[arg-type]


def test_unacked_deliveries_are_the_subscriptions_own() -> None:
    session = FakeSession()
    a, b = queue_subs(session, AckMode.CLIENT_INDIVIDUAL)
    assert a.deliver(Message(body=b"x"), 10) == 1
    assert a.deliver(Message(body=b"y"), 11) == 2
    assert a.inflight == {1: 10, 2: 11} and b.inflight == {}
    assert a.take([1], False) == [10] and a.inflight == {2: 11}
    a.forget(11)
    assert a.inflight == {} and b.inflight == {}
    auto = Subscription(session, 3, "queue/q", SubscribeOptions(), FakeHolder("queue/q"))  # type: ignore[arg-type]
    auto.deliver(Message(body=b"z"), 12)
    assert auto.inflight == {} and auto.next_tag == 2  # auto mode: nothing unacked


def test_closing_a_subscription_closes_it_alone() -> None:
    session = FakeSession()
    a, b, c = topic_sub(session, 1), topic_sub(session, 2), topic_sub(session, 3)
    a.close()  # never delivered
    assert a.closed and not b.closed and not c.closed
    assert not a.has_credit() and b.has_credit()
    c.send_all([Message(body=b"x")], 1)
    c.close()  # delivered before
    assert c.closed and c.next_tag == 2 and not b.closed
    a.close()  # again: no change
    assert a.closed and a.next_tag == 1


def test_a_moved_subscription_goes_on_from_its_tag() -> None:
    """A subscription moved from another leader starts at the tag it had reached there."""
    session = FakeSession()
    a, b = queue_subs(session, AckMode.CLIENT)
    a.next_tag = 41
    assert a.deliver(Message(body=b"x"), 7) == 41 and a.inflight == {41: 7}
    assert b.next_tag == 1 and b.deliver(Message(body=b"y"), 8) == 1


def test_the_destination_is_the_sources_kind_and_the_name() -> None:
    session = FakeSession()
    topic = topic_sub(session, 1, "news.*")
    assert topic.destination == "topic/news.*" and topic.kind == "topic"
    assert topic.name == "news.*"
    inbox = Queue(None, "channel/chat>server", DeclareOptions())  # type: ignore[arg-type]
    channel = Subscription(
        session,  # type: ignore[arg-type]
        2,
        Destination(Kind.CHANNEL, "chat"),
        SubscribeOptions(role="server"),
        inbox,
    )
    assert channel.destination == "channel/chat" and channel.kind == "channel"
    q = Queue(None, "queue/orders", DeclareOptions())  # type: ignore[arg-type]
    queue = Subscription(session, 3, Destination(Kind.QUEUE, "orders"), SubscribeOptions(), q)  # type: ignore[arg-type]
    assert queue.destination == "queue/orders"
    s = Stream(None, "stream/s", DeclareOptions())  # type: ignore[arg-type]
    stream = Subscription(session, 4, "stream/s", SubscribeOptions(), s)  # type: ignore[arg-type]
    assert stream.destination == "stream/s" and stream.kind == "stream"
