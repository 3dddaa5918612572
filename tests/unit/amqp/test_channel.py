"""Tests for polymq_amqp.channel without sockets: confirms coalesced into ``multiple`` acks,
and delivery-tag bookkeeping for ack / nack / reject / recover, against stand-ins for the
session and the core subscriptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pamqp import base, commands

from polymq.types import Outcome
from polymq_amqp.channel import Channel, Pending
from polymq_amqp.config import AmqpSettings
from polymq_amqp.errors import ChannelException
from polymq_server.names import VhostNames


class _Counter:
    def inc(self, n: int = 1) -> None:
        pass

    def dec(self, n: int = 1) -> None:
        pass


class _Metrics:
    def __getattr__(self, name: str) -> Any:
        return _Counter()


@dataclass
class _Link:
    connected: bool = False


@dataclass
class _Hub:
    link: _Link = field(default_factory=_Link)
    exclusive_consumers: dict[str, str] = field(default_factory=dict)


class FakeSession:
    def __init__(self) -> None:
        self.hub = _Hub()
        self.settings = AmqpSettings()
        self.names = VhostNames("/")
        self.topology = None
        self.metrics = _Metrics()
        self.sent: list[base.Frame] = []
        self.owner = "i/c"

    def send_method(self, channel: int, method: base.Frame) -> bool:
        self.sent.append(method)
        return True

    def confirms_due(self, channel: Channel) -> None:
        pass


class FakeCore:
    """A core subscription: what was acked and nacked."""

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.nacked: list[tuple[int, bool]] = []
        self.closed = False

    def ack(self, tag: int) -> None:
        self.acked.append(tag)

    def nack(self, tag: int, requeue: bool = True) -> None:
        self.nacked.append((tag, requeue))

    def settle(self, tag: int, outcome: Outcome) -> None:
        if outcome is Outcome.ACK:
            self.ack(tag)
        else:
            self.nack(tag, requeue=outcome is Outcome.REQUEUE)


def channel() -> tuple[Channel, FakeSession]:
    session = FakeSession()
    return Channel(session, 1), session  # type: ignore[arg-type]


def acks(session: FakeSession) -> list[tuple[str, int, bool]]:
    return [
        (type(m).__name__, m.delivery_tag, bool(m.multiple))
        for m in session.sent
        if isinstance(m, commands.Basic.Ack | commands.Basic.Nack)
    ]


# ---- confirms ---------------------------------------------------------------------------------
def test_contiguous_confirms_go_out_as_one_multiple_ack() -> None:
    ch, session = channel()
    for seq in range(1, 6):
        ch.unconfirmed[seq] = None
    for seq in (2, 1, 3):
        ch.confirm(seq, True)
    ch.flush_confirms()
    assert acks(session) == [("Ack", 3, True)]
    ch.confirm(5, True)  # 4 is still out: 5 alone
    ch.flush_confirms()
    ch.confirm(4, False)
    ch.flush_confirms()
    assert acks(session)[1:] == [("Ack", 5, False), ("Nack", 4, False)]


def test_a_single_confirm_is_not_multiple() -> None:
    ch, session = channel()
    ch.unconfirmed[1] = None
    ch.confirm(1, True)
    ch.flush_confirms()
    assert acks(session) == [("Ack", 1, False)]


def test_nacks_go_before_the_multiple_ack_that_covers_them() -> None:
    ch, session = channel()
    for seq in (1, 2, 3):
        ch.unconfirmed[seq] = None
        ch.confirm(seq, seq != 2)
    ch.flush_confirms()
    assert acks(session) == [("Nack", 2, False), ("Ack", 3, True)]


# ---- acknowledgements -----------------------------------------------------------------------
def delivered(ch: Channel, n: int) -> tuple[Any, FakeCore]:
    """``n`` deliveries of one consumer (core tags 101...), delivery tags 1..n."""
    core = FakeCore()

    class Consumer:
        def __init__(self) -> None:
            self.outstanding = n
            self.cancelled = False
            self.core = core

        def settle(self, tag: int, outcome: Outcome) -> None:
            self.outstanding -= 1
            core.settle(tag, outcome)

        def settle_many(self, tags: list[int], outcome: Outcome) -> None:
            for tag in tags:
                self.settle(tag, outcome)

    consumer = Consumer()
    for i in range(n):
        tag = ch.next_tag()
        ch.unacked[tag] = Pending(consumer, 101 + i, None)  # type: ignore[arg-type]
        ch.consumer_unacked += 1
    return consumer, core


def test_ack_multiple_and_single() -> None:
    ch, _ = channel()
    _, core = delivered(ch, 5)
    ch.settle(3, True, Outcome.ACK)
    assert core.acked == [101, 102, 103]
    ch.settle(5, False, Outcome.ACK)
    assert core.acked[-1] == 105
    assert list(ch.unacked) == [4]
    assert ch.consumer_unacked == 1


def test_nack_reject_and_recover() -> None:
    ch, _ = channel()
    _, core = delivered(ch, 4)
    ch.settle(1, False, Outcome.REJECT)
    ch.settle(2, True, Outcome.REQUEUE)
    assert core.nacked == [(101, False), (102, True)]
    ch.apply(ch._take(0, True), Outcome.REQUEUE)  # basic.recover
    assert core.nacked[2:] == [(103, True), (104, True)]
    assert not ch.unacked


def test_unknown_tags_are_406() -> None:
    ch, _ = channel()
    delivered(ch, 2)
    for tag, multiple in ((3, False), (9, True), (0, False)):
        with pytest.raises(ChannelException) as info:
            ch.settle(tag, multiple, Outcome.ACK)
        assert info.value.reply_code == 406
    ch.settle(1, False, Outcome.ACK)
    with pytest.raises(ChannelException):
        ch.settle(1, False, Outcome.ACK)  # twice
    with pytest.raises(ChannelException):
        ch.settle(1, True, Outcome.ACK)  # multiple, naming a tag settled already
    assert list(ch.unacked) == [2]


def test_acks_in_a_transaction_wait_for_the_commit() -> None:
    ch, _ = channel()
    _, core = delivered(ch, 2)
    ch.transactional = True
    ch.settle(2, True, Outcome.ACK)
    assert core.acked == [] and ch.tx_acks == [(Outcome.ACK, [1, 2])]
    with pytest.raises(ChannelException):
        ch.settle(7, False, Outcome.ACK)
    for tag, multiple in ((1, False), (2, True), (2, False)):  # settled in it already
        with pytest.raises(ChannelException):
            ch.settle(tag, multiple, Outcome.ACK)
    ch.settle(0, True, Outcome.ACK)  # everything else outstanding: nothing
    assert ch.tx_acks[-1] == (Outcome.ACK, [])
