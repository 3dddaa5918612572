"""Tests for the pure part of polymq_core.forwarding.handover: what a leaving leader hands on of a
queue (transient messages, a non-durable queue with its options and bindings), in what
order, in what requests, and which links are hand-over links. No sockets."""

from __future__ import annotations

from polymq.types import DeclareOptions, Message
from polymq_core.destinations.queue import Queue
from polymq_core.forwarding.handover import (
    QueueContents,
    ShardContents,
    batches,
    handover_client,
    is_handover,
    memory_only,
    publish_target,
    steps_of,
)
from polymq_server.auth.provider import INTERNAL_PRINCIPAL

from ..destinations.test_queue import FakeSession, FakeShard, subscribe


def _queue(options: DeclareOptions, *bodies: tuple[str, int, bool]) -> Queue:
    """A queue holding (body, priority, persistent) messages, published in that order."""
    q = Queue(FakeShard(), "queue/q", options)  # type: ignore[arg-type]
    for body, priority, persistent in bodies:
        m = Message(body.encode(), priority=priority, persistent=persistent)
        m.seq = q.next_seq()
        q.put(m)
    return q


def _bodies(contents: QueueContents | None) -> list[str]:
    assert contents is not None
    return [m.body.decode() for m in contents.messages]


def test_a_durable_queue_hands_its_transient_messages_only() -> None:
    q = _queue(DeclareOptions(), ("t1", 4, False), ("p1", 4, True), ("t2", 4, False))
    contents = memory_only(q, ["ignored.#"])
    assert _bodies(contents) == ["t1", "t2"]
    assert contents is not None
    assert contents.options is None and contents.patterns == ()  # the log has the queue


def test_a_durable_queue_with_only_persistent_messages_hands_nothing() -> None:
    q = _queue(DeclareOptions(), ("p1", 4, True), ("p2", 4, True))
    assert memory_only(q) is None
    assert memory_only(_queue(DeclareOptions())) is None


def test_a_non_durable_queue_hands_everything_with_its_options_and_bindings() -> None:
    options = DeclareOptions(durable=False, max_length=10)
    q = _queue(options, ("a", 4, True), ("b", 4, False))
    contents = memory_only(q, ["b.*", "a.#"])
    assert _bodies(contents) == ["a", "b"]  # persistent or not: memory is all it has
    assert contents is not None
    assert contents.options == options.to_dict()
    assert contents.patterns == ("a.#", "b.*")
    empty = memory_only(_queue(options))
    assert empty is not None and empty.messages == () and empty.options == options.to_dict()


def test_messages_go_in_delivery_order_unacked_ones_included_and_counted() -> None:
    q = _queue(
        DeclareOptions(),
        ("low1", 1, False),
        ("high1", 8, False),
        ("low2", 1, False),
        ("high2", 8, False),
        ("mid", 4, False),
    )
    session = FakeSession()
    first = subscribe(q, session, 1, prefetch=1)  # takes high1, not acknowledged
    assert len(q.inflight) == 1
    q.detach(first, requeue=[])  # back, as a closed session's are
    subscribe(q, session, 2, prefetch=1)  # high1 again: in flight
    contents = memory_only(q)
    assert _bodies(contents) == ["high1", "high2", "mid", "low1", "low2"]
    assert contents is not None and contents.unacked == 1
    assert contents.messages[0].delivery_count == 2  # delivered twice: redelivered there


def test_a_queue_with_max_priority_orders_by_its_levels_only() -> None:
    q = _queue(DeclareOptions(max_priority=0), ("a", 9, False), ("b", 0, False), ("c", 5, False))
    assert _bodies(memory_only(q)) == ["a", "b", "c"]  # strictly FIFO


def test_publish_targets_a_queue_or_the_other_role_of_a_channel() -> None:
    assert publish_target("queue/orders") == ("queue/orders", None)
    assert publish_target("channel/chat>server") == ("channel/chat", "client")
    assert publish_target("channel/chat>client") == ("channel/chat", "server")


def test_batches_keep_the_order_and_bound_count_and_bytes() -> None:
    messages = [Message(b"x" * 10) for _ in range(7)]
    out = batches(messages, max_bytes=25, max_count=100)
    assert [len(b) for b in out] == [2, 2, 2, 1]
    assert [m for b in out for m in b] == messages
    assert [len(b) for b in batches(messages, max_bytes=10_000, max_count=3)] == [3, 3, 1]
    big = [Message(b"y" * 100), Message(b"z")]
    assert [len(b) for b in batches(big, max_bytes=50)] == [1, 1]
    assert batches([]) == []


def test_steps_declare_and_bind_a_non_durable_queue_before_its_messages() -> None:
    loose = QueueContents(
        "queue/loose",
        DeclareOptions(durable=False).to_dict(),
        ("a.#",),
        tuple(Message(b"m") for _ in range(3)),
    )
    kept = QueueContents("channel/c>server", None, (), (Message(b"n"),))
    steps = steps_of(ShardContents(0, (loose, kept), 0))
    assert [s.what for s in steps] == [
        "declare queue/loose",
        "bind queue/loose",
        "publish to queue/loose",
        "publish to channel/c>server",
    ]
    assert [s.messages for s in steps] == [0, 0, 3, 1]
    assert [s.declares for s in steps] == [1, 0, 0, 0]
    contents = ShardContents(0, (loose, kept), 2)
    assert contents.messages == 4 and contents.declared == 1 and bool(contents)
    assert not ShardContents(1, (), 0)


def test_only_a_peer_login_with_the_secret_and_the_mark_is_a_hand_over() -> None:
    client = handover_client("n1")
    assert is_handover(client, INTERNAL_PRINCIPAL)
    assert not is_handover(client, "alice")  # no cluster secret
    assert not is_handover("peer/n1", INTERNAL_PRINCIPAL)  # a forwarding link
    assert not is_handover("native/handover", INTERNAL_PRINCIPAL)
    assert not is_handover("stomp/peer/handover", INTERNAL_PRINCIPAL)
