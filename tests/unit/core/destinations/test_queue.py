"""Tests for polymq_core.destinations.queue and polymq_core.destinations.subscription without
sockets: round robin
within the prefetch windows, acks and nacks by sequence, ack timeouts, against stand-ins for
the shard and the session."""

from __future__ import annotations

from typing import Any

import pytest

from polymq.types import AckMode, DeclareOptions, Message, Outcome, SubscribeOptions
from polymq_core.destinations.queue import Queue
from polymq_core.destinations.subscription import Subscription


class _Sensors:
    def __init__(self) -> None:
        self.delivered = 0
        self.redelivered: list[str] = []

    def on_deliver(self, n: int) -> None:
        self.delivered += n

    def on_redeliver(self, reason: str, n: int) -> None:
        self.redelivered += [reason] * n

    def on_discard(self, reason: str, n: int) -> None:
        pass


class FakeShard:
    def __init__(self) -> None:
        self.sensors = _Sensors()
        self.settled_seqs: list[int] = []
        self.discarded: list[tuple[int, str]] = []
        self.timers: list[tuple[float, int, int]] = []
        self._did = 0

    def settled(self, queue: Queue, msg: Message) -> None:
        self.settled_seqs.append(msg.seq)

    def settled_many(self, queue: Queue, msgs: list[Message]) -> None:
        self.settled_seqs += [m.seq for m in msgs]

    def discard(self, queue: Queue, msg: Message, reason: str) -> None:
        self.discarded.append((msg.seq, reason))

    def new_delivery_id(self) -> int:
        self._did += 1
        return self._did

    def schedule(self, deadline: float, holder: Queue, seq: int, delivery_id: int) -> None:
        self.timers.append((deadline, seq, delivery_id))


class FakeSession:
    """What a core session does with deliveries: here, keeps them."""

    def __init__(self) -> None:
        self.got: list[tuple[int, int, int]] = []  # (sid, tag, seq)

    writable = True  # (False: a socket not draining, where each delivery is held)

    def accepts(self, sub: Subscription) -> bool:
        return True

    def push_delivery(self, sub: Subscription, tag: int, msg: Message, key: Any) -> None:
        self.got.append((sub.sid, tag, msg.seq))

    def push_deliveries(
        self, sub: Subscription, first: int, msgs: list[Message], nbytes: int
    ) -> None:
        assert nbytes == sum(len(m.body) for m in msgs)
        self.got += [(sub.sid, first + i, m.seq) for i, m in enumerate(msgs)]


def queue(**options: Any) -> tuple[Queue, FakeShard]:
    shard = FakeShard()
    return Queue(shard, "queue/q", DeclareOptions(**options)), shard  # type: ignore[arg-type]


def fill(q: Queue, n: int) -> None:
    for _ in range(n):
        m = Message(body=b"x")
        m.seq = q.next_seq()
        q.put(m)
    q.pump()  # as the shard does after a publish


def subscribe(q: Queue, session: FakeSession, sid: int, **options: Any) -> Subscription:
    options.setdefault("ack_mode", AckMode.CLIENT_INDIVIDUAL)
    sub = Subscription(session, sid, "queue/q", SubscribeOptions(**options), q)  # type: ignore[arg-type]
    q.attach(sub)
    return sub


def test_round_robin_within_each_window() -> None:
    q, _ = queue()
    session = FakeSession()
    a = subscribe(q, session, 1, prefetch=2)
    b = subscribe(q, session, 2, prefetch=3)
    fill(q, 7)
    assert session.got == [(1, 1, 1), (2, 1, 2), (1, 2, 3), (2, 2, 4), (2, 3, 5)]
    assert q.count == 2 and len(q.inflight) == 5 and q.delivered == 5
    assert a.inflight == {1: 1, 2: 3} and b.inflight == {1: 2, 2: 4, 3: 5}


def test_acks_settle_what_the_subscription_holds_and_refill_its_window() -> None:
    q, shard = queue()
    session = FakeSession()
    a = subscribe(q, session, 1, prefetch=3)
    b = subscribe(q, session, 2, prefetch=1)
    fill(q, 6)
    assert [seq for sid, _, seq in session.got if sid == 1] == [1, 3, 4]
    q.settle(a, [*a.take([1, 3], False), 2], Outcome.ACK)  # seq 2 is b's: not a's to settle
    assert shard.settled_seqs == [1, 4] and q.acked == 2
    assert 2 in q.inflight and 1 not in q.inflight and 4 not in q.inflight
    assert session.got[-2:] == [(1, 4, 5), (1, 5, 6)]  # the room made goes to a
    q.settle(a, [1, 4], Outcome.ACK)  # already settled: nothing
    assert q.acked == 2 and shard.settled_seqs == [1, 4]
    assert b.inflight == {1: 2}


def test_nacks_requeue_in_order_or_dead_letter() -> None:
    q, shard = queue()
    session = FakeSession()
    a = subscribe(q, session, 1, prefetch=3)
    fill(q, 4)
    q.settle(a, a.take([2, 1], False), Outcome.REQUEUE)
    assert shard.sensors.redelivered == ["nack", "nack"]
    assert [seq for _, _, seq in session.got] == [1, 2, 3, 1, 2]  # back first, in order
    q.settle(a, a.take([5], False), Outcome.REJECT)
    assert shard.discarded == [(2, "rejected")] and q.acked == 0
    assert [seq for _, _, seq in session.got][-1] == 4


def test_an_ack_timeout_is_scheduled_only_when_there_is_one() -> None:
    q, shard = queue()
    session = FakeSession()
    subscribe(q, session, 1, prefetch=10)
    fill(q, 2)
    assert shard.timers == [] and all(d.deadline is None for d in q.inflight.values())
    q2, shard2 = queue(ack_timeout=30.0)
    subscribe(q2, FakeSession(), 1, prefetch=10)
    fill(q2, 2)
    assert [seq for _, seq, _ in shard2.timers] == [1, 2]
    assert [d.deadline for d in q2.inflight.values()] == [t for t, _, _ in shard2.timers]
    q2.expire_delivery(1, shard2.timers[0][2])
    assert shard2.sensors.redelivered == ["ack-timeout"] and 1 in q2.inflight  # again


def test_auto_ack_deliveries_are_settled_as_they_go() -> None:
    q, shard = queue()
    session = FakeSession()
    subscribe(q, session, 1, ack_mode=AckMode.AUTO, prefetch=0)
    fill(q, 3)
    assert shard.settled_seqs == [1, 2, 3] and not q.inflight


class CountingSession(FakeSession):
    """Counts the calls deliveries come in: one per message, or one per batch."""

    def __init__(self, writable: bool = True) -> None:
        super().__init__()
        self.writable = writable
        self.calls = 0

    def push_delivery(self, sub: Subscription, tag: int, msg: Message, key: Any) -> None:
        self.calls += 1
        super().push_delivery(sub, tag, msg, key)

    def push_deliveries(
        self, sub: Subscription, first: int, msgs: list[Message], nbytes: int
    ) -> None:
        self.calls += 1
        super().push_deliveries(sub, first, msgs, nbytes)


@pytest.mark.parametrize("writable", [True, False], ids=["draining", "not-draining"])
def test_one_auto_ack_consumer_takes_what_is_ready_in_one_call(writable: bool) -> None:
    """While its socket drains, the one consumer of a queue, in auto mode, gets every ready
    message in one call, settled, in order; while it does not, each message alone (each
    held to the subscription's buffer by the session)."""
    q, shard = queue()
    for _ in range(5):
        m = Message(body=b"xy")
        m.seq = q.next_seq()
        q.put(m)
    session = CountingSession(writable)
    subscribe(q, session, 1, ack_mode=AckMode.AUTO, prefetch=0)
    q.pump()
    assert session.got == [(1, i, i) for i in range(1, 6)]
    assert session.calls == (1 if writable else 5)
    assert shard.settled_seqs == [1, 2, 3, 4, 5] and not q.inflight
    assert q.count == 0 and q.delivered == 5 and shard.sensors.delivered == 5


def test_one_consumer_that_acks_gets_its_window_in_one_call() -> None:
    """The one consumer of a queue, acking, its socket draining, gets as many ready messages
    as its prefetch has room for in one call, each kept unacked under its tag; a message
    with an ack timeout of its own goes alone, in its turn, with its timer."""
    q, shard = queue()
    for i in range(6):
        m = Message(body=b"xy", ack_timeout=5.0 if i == 2 else None)
        m.seq = q.next_seq()
        q.put(m)
    session = CountingSession()
    sub = subscribe(q, session, 1, prefetch=4)
    q.pump()
    assert session.got == [(1, i, i) for i in range(1, 5)]
    assert session.calls == 3  # seqs 1-2 together, 3 alone (its timeout), then 4
    assert [seq for _, seq, _ in shard.timers] == [3]
    assert sub.inflight == {1: 1, 2: 2, 3: 3, 4: 4} and sorted(q.inflight) == [1, 2, 3, 4]
    assert all(q.inflight[s].sub is sub for s in q.inflight)
    assert q.count == 2 and q.delivered == 4
    q.settle(sub, sub.take([1, 2], False), Outcome.ACK)
    assert session.got[4:] == [(1, 5, 5), (1, 6, 6)] and session.calls == 4  # the refill at once
    assert sub.inflight == {3: 3, 4: 4, 5: 5, 6: 6}


def test_max_priority_bounds_the_levels_a_queue_orders_by() -> None:
    priorities = [0, 5, 9, 2, 7, 9, 4]  # seqs 1..7
    for options, order in (
        ({}, [3, 6, 5, 2, 7, 4, 1]),  # every level: by priority, then in order
        ({"max_priority": 0}, [1, 2, 3, 4, 5, 6, 7]),  # strictly FIFO
        ({"max_priority": 4}, [2, 3, 5, 6, 7, 4, 1]),  # 5, 7 and 9 count as 4
    ):
        q, _ = queue(**options)
        for p in priorities:
            m = Message(body=b"x", priority=p)
            m.seq = q.next_seq()
            q.put(m)
        session = FakeSession()
        a = subscribe(q, session, 1, prefetch=2)
        q.detach(a, requeue=[])  # its two come back, each at the head of its level
        b = subscribe(q, session, 2, prefetch=10)
        assert [seq for sid, _, seq in session.got if sid == 2] == order, options
        kept = [q.inflight[seq].message.priority for seq in b.inflight.values()]
        assert kept == [priorities[seq - 1] for seq in order]  # as published


def test_consumer_priorities_serve_the_highest_with_room_first() -> None:
    q, _ = queue()
    session = FakeSession()
    low = subscribe(q, session, 1, prefetch=10)
    high_a = subscribe(q, session, 2, prefetch=2, priority=5)
    mid = subscribe(q, session, 3, prefetch=10, priority=1)
    high_b = subscribe(q, session, 4, prefetch=2, priority=5)
    assert [s.sid for s in q.consumers] == [2, 4, 3, 1]  # by priority, then as attached
    fill(q, 6)
    by_sid = {sid: [seq for s, _, seq in session.got if s == sid] for sid in (1, 2, 3, 4)}
    assert sorted(by_sid[2] + by_sid[4]) == [1, 2, 3, 4]  # the two highest, round robin
    assert len(by_sid[2]) == len(by_sid[4]) == 2
    assert by_sid[3] == [5, 6] and by_sid[1] == []  # then the next priority
    q.settle(high_a, high_a.take([1], False), Outcome.ACK)  # room again at the top
    fill(q, 2)
    assert [sid for sid, _, _ in session.got[-2:]] == [2, 3]
    assert low.inflight == {} and len(mid.inflight) == 3 and len(high_b.inflight) == 2
    for sub in (high_a, mid, high_b):
        q.detach(sub, requeue=[])  # what they held goes to the one left
    assert len(low.inflight) == 7  # the 8 published but the one acked
    assert q.consumers == [low] and not q._prioritized  # plain round robin again
