"""Tests for polymq_amqp.deliver (basic.deliver frames a run of messages at a time, with
their exchange, routing key and properties kept per shape of message) and for the batch
delivery of polymq_amqp.consumer.AmqpConsumers: byte for byte what pamqp makes of each message
alone, whatever was delivered before it."""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from polymq.types import Message, Outcome
from polymq_amqp.channel import Channel
from polymq_amqp.config import AmqpSettings
from polymq_amqp.consumer import Consumer
from polymq_amqp.deliver import MAX_SHAPES, DeliverFrames, shown_route
from polymq_amqp.errors import LocalProtocolError
from polymq_amqp.properties import delivery_properties
from polymq_amqp.wire.codec import AmqpConnection
from polymq_server.names import VhostNames

from .helpers import open_conn, with_channel

NAMES = VhostNames("/")
NOW = 1_700_000_050.25
TS = 1_700_000_000.5


def expected(
    conn: AmqpConnection, channel: int, ctag: str, first: int, messages: list[Message]
) -> bytes:
    """Each message alone, its basic.deliver marshalled by pamqp."""
    out = []
    for i, m in enumerate(messages):
        exchange, key = shown_route(m, NAMES)
        deliver = commands.Basic.Deliver(ctag, first + i, m.delivery_count > 1, exchange, key)
        out.append(conn.send_content(channel, deliver, delivery_properties(m, NAMES), m.body))
    return b"".join(out)


def made(frames: DeliverFrames, first: int, messages: list[Message], frame_max: int) -> bytes:
    out: list[bytes] = []
    frames.frames(out, first, messages, frame_max)
    return b"".join(out)


def message(**kw: Any) -> Message:
    fields: dict[str, Any] = {
        "body": b"0123456789abcdef0123456789abcdef",
        "headers": {"x-amqp-exchange": "", "x-amqp-routing-key": "q"},
        "timestamp": TS,
        "destination": "queue/q",
        "delivery_count": 1,
    }
    fields.update(kw)
    return Message(**fields)


# ---- byte for byte, cache or not --------------------------------------------------------------
_text = st.text(max_size=12)
_header_names = st.sampled_from(
    [
        "x-amqp-exchange",
        "x-amqp-routing-key",
        "x-amqp-typed",
        "amqp-expiration",
        "amqp-timestamp",
        "amqp-message-id",
        "amqp-type",
        "content-encoding",
        "x-death-reason",
        "x-original-destination",
        "a",
        "b",
    ]
)
_messages = st.builds(
    Message,
    body=st.binary(max_size=9000),
    content_type=st.sampled_from(["application/octet-stream", "text/plain", ""]),
    headers=st.dictionaries(_header_names | _text, _text, max_size=5),
    priority=st.integers(0, 9),
    persistent=st.booleans(),
    expires=st.sampled_from([None, NOW + 10.0, NOW - 1.0]),
    correlation_id=st.sampled_from([None, "", "c1", "c2"]),
    reply_to=st.sampled_from([None, "queue/r", "queue/amqp:vx.r", "elsewhere"]),
    timestamp=st.sampled_from([0.0, 0.5, TS, TS + 0.4, TS + 1.0, -3.5, float("inf")]),
    delivery_count=st.integers(1, 3),
    destination=st.sampled_from(["queue/q", "topic/amqp.ex.k", "topic/t", "queue/amqp:vx.q"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_messages, min_size=1, max_size=6), st.sampled_from([4096, 8192, 131072]))
def test_frames_are_pamqps_with_a_warm_cache(messages: list[Message], frame_max: int) -> None:
    messages = [m for m in messages if m.timestamp != float("inf") or not _needs_int_ts(m)]
    conn = with_channel(open_conn(frame_max=frame_max), 3)
    frames = DeliverFrames(3, "ctag-é", NAMES)
    # twice over: the second time every cacheable shape is known
    twice = [*messages, *(dataclasses.replace(m, headers=dict(m.headers)) for m in messages)]
    with mock.patch("time.time", return_value=NOW):
        want = expected(conn, 3, "ctag-é", 7, twice)
        assert made(frames, 7, twice, frame_max) == want
        assert made(frames, 7, twice, frame_max) == want


def _needs_int_ts(m: Message) -> bool:
    """delivery_properties itself fails on an infinite timestamp (int()) unless a valid
    amqp-timestamp header stands in for it."""
    try:
        int(m.headers.get("amqp-timestamp", "x"))
    except ValueError:
        return True
    return "x-death-reason" in m.headers


def test_an_infinite_timestamp_with_a_header_standing_in_is_delivered() -> None:
    conn = with_channel(open_conn(), 1)
    m = message(timestamp=float("inf"), headers={"amqp-timestamp": "12"})
    assert made(DeliverFrames(1, "t", NAMES), 1, [m, m], 131072) == expected(
        conn, 1, "t", 1, [m, m]
    )


@pytest.mark.parametrize(
    "change",
    [
        {"headers": {"x-amqp-exchange": "", "x-amqp-routing-key": "other"}},
        {"headers": {"x-amqp-exchange": "", "x-amqp-routing-key": "q", "h": "1"}},
        {"headers": {"x-amqp-exchange": "", "x-amqp-routing-key": "q", "h": "2"}},
        {"headers": {"x-amqp-exchange": "e", "x-amqp-routing-key": "q"}},
        {"headers": {"x-amqp-exchange": "", "x-amqp-routing-key": "q", "amqp-expiration": "5"}},
        {"headers": {"x-amqp-exchange": "", "x-amqp-routing-key": "q", "amqp-expiration": "6"}},
        {"headers": {"x-amqp-exchange": "", "x-amqp-routing-key": "q", "x-death-reason": "x"}},
        {"headers": {}},
        {"priority": 5},
        {"persistent": True},
        {"content_type": "text/plain"},
        {"timestamp": TS + 1.0},
        {"timestamp": 0.0},
        {"reply_to": "queue/r"},
        {"reply_to": "r"},
        {"correlation_id": "c"},
        {"correlation_id": ""},
        {"destination": "queue/other", "headers": {}},
        {"body": b""},
        {"body": b"x" * 5000},
        {"delivery_count": 2},
    ],
)
def test_a_message_of_another_shape_gets_its_own_frames(change: dict[str, Any]) -> None:
    conn = with_channel(open_conn(frame_max=4096), 1)
    frames = DeliverFrames(1, "t", NAMES)
    base, other = message(), message(**change)
    run = [base, other, base, other, other]
    with mock.patch("time.time", return_value=NOW):
        want = expected(conn, 1, "t", 1, run)
        assert want.count(delivery_properties(other, NAMES)) >= 3
        assert made(frames, 1, run[:1], 4096) + made(frames, 2, run[1:], 4096) == want


def test_headers_in_another_order_are_another_table() -> None:
    conn = with_channel(open_conn(), 1)
    frames = DeliverFrames(1, "t", NAMES)
    run = [message(headers={"a": "1", "b": "2"}), message(headers={"b": "2", "a": "1"})]
    want = expected(conn, 1, "t", 1, run)
    assert made(frames, 1, run[:1], 131072) + made(frames, 2, run[1:], 131072) == want


def test_one_shape_per_run_of_like_messages() -> None:
    frames = DeliverFrames(1, "t", NAMES)
    run = [message(body=bytes([i])) for i in range(100)]
    run += [message(timestamp=TS + 0.4, body=b"")]  # the same second
    made(frames, 1, run, 131072)
    assert frames.cached == 1
    made(frames, 1, [message(timestamp=TS + 1.0)], 131072)
    assert frames.cached == 2


def test_what_depends_on_the_clock_is_computed_each_time() -> None:
    conn = with_channel(open_conn(), 1)
    frames = DeliverFrames(1, "t", NAMES)
    expiring = message(expires=NOW + 10.0)  # from STOMP: no amqp-expiration header
    dead = message(timestamp=0.0, headers={"x-death-reason": "expired"})
    for now in (NOW, NOW + 2.0, NOW + 3601.0):
        with mock.patch("time.time", return_value=now):
            got = made(frames, 1, [expiring, dead], 131072)
            assert got == expected(conn, 1, "t", 1, [expiring, dead])
    assert frames.cached == 0


def test_the_cache_is_bounded() -> None:
    conn = with_channel(open_conn(), 1)
    frames = DeliverFrames(1, "t", NAMES)
    run = [message(correlation_id=str(i)) for i in range(3 * MAX_SHAPES)]
    assert made(frames, 1, run + run, 131072) == expected(conn, 1, "t", 1, run + run)
    assert 0 < frames.cached <= MAX_SHAPES


# ---- AmqpConsumers.deliver: one write per run, the bookkeeping of each delivery ---------------
class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: int = 1) -> None:
        self.value += n

    def dec(self, n: int = 1) -> None:
        self.value -= n


class _Metrics:
    def __init__(self) -> None:
        self.counters: dict[str, _Counter] = {}

    def __getattr__(self, name: str) -> _Counter:
        return self.counters.setdefault(name, _Counter())


@dataclasses.dataclass
class _Link:
    connected: bool = False


@dataclasses.dataclass
class _Hub:
    link: _Link = dataclasses.field(default_factory=_Link)
    exclusive_consumers: dict[str, str] = dataclasses.field(default_factory=dict)


class FakeSession:
    def __init__(self) -> None:
        self.hub = _Hub()
        self.settings = AmqpSettings()
        self.names = NAMES
        self.topology = None
        self.metrics = _Metrics()
        self.owner = "i/c"
        self.open = True
        self.codec = with_channel(open_conn(frame_max=4096), 1)
        self.writes: list[bytes] = []
        self.after_write: dict[Any, int] = {}

    def send_delivers(self, channel: int, frames: list[bytes], count: int) -> bool:
        try:
            self.writes.append(self.codec.send_delivers(channel, frames))
        except LocalProtocolError:
            return False
        return True

    def ack_after_write(self, consumer: Any, core_tag: int) -> None:
        self.after_write[consumer] = core_tag

    def send_method(self, channel: int, method: Any) -> bool:
        return True


def consumer_on(no_ack: bool = False) -> tuple[Channel, FakeSession, Consumer]:
    session = FakeSession()
    ch = Channel(session, 1)  # type: ignore[arg-type]
    consumer = Consumer(
        ch, "ctag", "q", "queue/q", no_ack=no_ack, exclusive=False, auto_delete=False
    )
    return ch, session, consumer


def test_a_run_of_deliveries_is_one_write() -> None:
    ch, session, consumer = consumer_on()
    ch.next_tag()  # delivery tags go on from the channel's last
    run = [message(body=b"a"), message(body=b"b" * 5000), message(delivery_count=2)]
    ch.consumers.deliver(consumer, [11, 12, 13], run)
    assert session.writes == [expected(session.codec, 1, "ctag", 2, run)]
    assert {t: (p.consumer, p.tag, p.receipt) for t, p in ch.unacked.items()} == {
        2: (consumer, 11, None),
        3: (consumer, 12, None),
        4: (consumer, 13, None),
    }
    assert ch.consumer_unacked == consumer.outstanding == 3
    assert session.metrics.delivered_consume.value == 3
    ch.settle(3, True, Outcome.ACK)
    assert list(ch.unacked) == [4] and consumer.outstanding == ch.consumer_unacked == 1


def test_no_ack_deliveries_ack_the_last_core_tag_once_written() -> None:
    ch, session, consumer = consumer_on(no_ack=True)
    ch.consumers.deliver(consumer, [5, 6], [message(), message()])
    assert session.writes == [expected(session.codec, 1, "ctag", 1, [message(), message()])]
    assert session.after_write == {consumer: 6}
    assert not ch.unacked and consumer.outstanding == 0


def test_deliveries_past_the_global_window_wait_for_acks() -> None:
    ch, session, consumer = consumer_on()
    ch.global_prefetch = 2
    run = [message(body=bytes([i])) for i in range(5)]
    ch.consumers.deliver(consumer, [1, 2, 3, 4, 5], run)
    assert session.writes == [expected(session.codec, 1, "ctag", 1, run[:2])]
    assert [t for _, t, _ in ch.held] == [3, 4, 5]
    ch.consumers.deliver(consumer, [6], [message()])  # behind those held
    assert len(session.writes) == 1 and len(ch.held) == 4
    ch.settle(1, False, Outcome.ACK)
    assert session.writes[1:] == [expected(session.codec, 1, "ctag", 3, run[2:3])]
    ch.settle(0, True, Outcome.ACK)  # room for two again
    assert b"".join(session.writes[2:]) == expected(session.codec, 1, "ctag", 4, run[3:])
    assert [t for _, t, _ in ch.held] == [6]
    assert {t: p.tag for t, p in ch.unacked.items()} == {4: 4, 5: 5}
    ch.settle(4, False, Outcome.ACK)
    assert session.writes[-1] == expected(session.codec, 1, "ctag", 6, [message()])
    assert not ch.held and session.metrics.delivered_consume.value == 6


def test_nothing_is_recorded_when_the_channel_cannot_send() -> None:
    ch, session, consumer = consumer_on()
    session.codec = with_channel(open_conn(), 2)  # channel 1 is not open there
    ch.consumers.deliver(consumer, [1, 2], [message(), message()])
    assert not session.writes and not ch.unacked and not ch.held
    assert consumer.outstanding == 0 and session.metrics.delivered_consume.value == 0


def test_tags_and_messages_must_pair_up() -> None:
    ch, _, consumer = consumer_on()
    with pytest.raises(ValueError):
        ch.consumers.deliver(consumer, [1], [message(), message()])
