"""basic.consume / cancel / get / qos / ack / nack / reject / recover, with pika."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from .helpers import QUIET, WAIT, unique

pytestmark = pytest.mark.timeout(60)
Connect = Callable[..., BlockingConnection]
Got = list[tuple[Any, Any, bytes]]


def fill(ch: BlockingChannel, n: int, **declare: Any) -> str:
    q = unique("q")
    ch.queue_declare(q, **declare)
    for i in range(n):
        ch.basic_publish("", q, str(i).encode())
    return q


def consume(ch: BlockingChannel, q: str, **kw: Any) -> tuple[str, Got]:
    got: Got = []
    tag = ch.basic_consume(q, lambda _ch, m, p, b: got.append((m, p, b)), **kw)
    return tag, got


def pump(conn: BlockingConnection, until: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "condition not reached in time"
        conn.process_data_events(time_limit=0.05)


def settle(conn: BlockingConnection, wait: float = QUIET) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def test_prefetch_bounds_unacknowledged_deliveries(channel: BlockingChannel) -> None:
    conn = channel.connection
    q = fill(channel, 10)
    channel.basic_qos(prefetch_count=3)
    _tag, got = consume(channel, q)
    pump(conn, lambda: len(got) >= 3)
    settle(conn)
    assert [b for _, _, b in got] == [b"0", b"1", b"2"]  # and no more
    channel.basic_ack(got[0][0].delivery_tag)
    pump(conn, lambda: len(got) >= 4)
    settle(conn)
    assert len(got) == 4
    channel.basic_ack(got[-1][0].delivery_tag, multiple=True)  # acks 2, 3, 4 (tags 2..4)
    pump(conn, lambda: len(got) >= 7)
    settle(conn)
    assert len(got) == 7
    tags = [m.delivery_tag for m, _, _ in got]
    assert tags == sorted(tags) and len(set(tags)) == 7  # per channel, increasing


def test_global_qos_bounds_the_channel(channel: BlockingChannel) -> None:
    conn = channel.connection
    q1, q2 = fill(channel, 5), fill(channel, 5)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    _t1, got1 = consume(channel, q1)
    _t2, got2 = consume(channel, q2)
    pump(conn, lambda: len(got1) + len(got2) >= 3)
    settle(conn)
    assert len(got1) + len(got2) == 3
    first = (got1 + got2)[0][0]
    channel.basic_ack(first.delivery_tag)
    pump(conn, lambda: len(got1) + len(got2) >= 4)
    settle(conn)
    assert len(got1) + len(got2) == 4


def test_nack_and_reject_with_and_without_requeue(channel: BlockingChannel) -> None:
    conn = channel.connection
    q = fill(channel, 4)
    channel.basic_qos(prefetch_count=4)
    tag, got = consume(channel, q)
    pump(conn, lambda: len(got) == 4)
    m = [g[0] for g in got]
    channel.basic_reject(m[0].delivery_tag, requeue=False)  # dropped (no dead-letter)
    channel.basic_nack(m[2].delivery_tag, multiple=True, requeue=True)  # 1 and 2 come back
    pump(conn, lambda: len(got) >= 6)
    again = got[4:]
    assert sorted(b for _, _, b in again) == [b"1", b"2"]
    assert all(mm.redelivered for mm, _, _ in again)
    channel.basic_nack(m[3].delivery_tag, requeue=False)
    channel.basic_ack(0, multiple=True)  # everything outstanding
    channel.basic_cancel(tag)
    settle(conn)
    assert channel.queue_declare(q, passive=True).method.message_count == 0


def test_a_multiple_ack_naming_a_settled_tag_is_406_and_settles_nothing(
    channel: BlockingChannel,
) -> None:
    """``multiple`` settles the tags up to one still unacknowledged; a stale one (acked
    already) is an unknown tag, as in RabbitMQ, and the deliveries before it stay out."""
    q = fill(channel, 2)
    first, _p, _b = channel.basic_get(q)
    second, _p, _b = channel.basic_get(q)
    channel.basic_ack(second.delivery_tag)
    channel.basic_ack(second.delivery_tag, multiple=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_qos(prefetch_count=1)
    assert info.value.reply_code == 406
    assert f"unknown delivery tag {second.delivery_tag}" in info.value.reply_text
    other = channel.connection.channel()
    deadline = time.monotonic() + WAIT
    while other.queue_declare(q, passive=True).method.message_count != 1:  # first: back
        assert time.monotonic() < deadline, "the first message did not come back"
        time.sleep(0.05)
    body = other.basic_get(q, auto_ack=True)[2]
    assert body == b"0"
    assert first.delivery_tag < second.delivery_tag


def test_ack_of_an_unknown_tag_is_406(channel: BlockingChannel) -> None:
    channel.basic_ack(999)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_qos(prefetch_count=1)
    assert info.value.reply_code == 406
    assert "unknown delivery tag 999" in info.value.reply_text


def test_double_ack_is_406(channel: BlockingChannel) -> None:
    q = fill(channel, 1)
    method, _p, _b = channel.basic_get(q)
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_qos(prefetch_count=1)
    assert info.value.reply_code == 406


def test_get_and_get_empty(channel: BlockingChannel) -> None:
    q = fill(channel, 2)
    method, _props, body = channel.basic_get(q)
    assert (body, method.message_count, method.redelivered) == (b"0", 1, False)
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _props, body = channel.basic_get(q)
    assert (body, method.redelivered) == (b"0", True)
    channel.basic_ack(method.delivery_tag)
    method, _props, body = channel.basic_get(q, auto_ack=True)
    assert (body, method.message_count) == (b"1", 0)
    assert channel.basic_get(q) == (None, None, None)  # get-empty
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_get(unique("absent"))
    assert info.value.reply_code == 404


def test_unacked_messages_return_when_the_channel_closes(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    q = fill(ch, 3)
    ch.basic_qos(prefetch_count=10)
    _tag, got = consume(ch, q)
    pump(conn, lambda: len(got) == 3)
    method, _p, _b = conn.channel().basic_get(q)  # nothing ready: all are out
    assert method is None
    ch.close()
    other = connect().channel()

    def count() -> int:
        return int(other.queue_declare(q, passive=True).method.message_count)

    deadline = time.monotonic() + WAIT
    while count() != 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    method, _p, _b = other.basic_get(q, auto_ack=True)
    assert method.redelivered


def test_basic_get_lease_returns_when_the_channel_closes(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    q = fill(ch, 1)
    method, _p, _b = ch.basic_get(q)
    assert method is not None
    ch.close()
    other = connect().channel()
    deadline = time.monotonic() + WAIT
    while True:
        m, _p, body = other.basic_get(q, auto_ack=True)
        if m is not None:
            assert (body, m.redelivered) == (b"0", True)
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_recover_requeues_everything_unacknowledged(channel: BlockingChannel) -> None:
    conn = channel.connection
    q = fill(channel, 3)
    _tag, got = consume(channel, q)
    pump(conn, lambda: len(got) == 3)
    channel.basic_recover(requeue=True)
    pump(conn, lambda: len(got) == 6)
    assert [b for _, _, b in got[3:]] == [b"0", b"1", b"2"]
    assert all(m.redelivered for m, _, _ in got[3:])


def test_no_ack_consumer(channel: BlockingChannel) -> None:
    conn = channel.connection
    q = fill(channel, 50)
    _tag, got = consume(channel, q, auto_ack=True)
    pump(conn, lambda: len(got) == 50)
    assert [b for _, _, b in got] == [str(i).encode() for i in range(50)]
    settle(conn)
    assert channel.queue_declare(q, passive=True).method.message_count == 0


def test_cancel_keeps_outstanding_deliveries_acknowledgeable(channel: BlockingChannel) -> None:
    conn = channel.connection
    q = fill(channel, 5)
    channel.basic_qos(prefetch_count=2)
    tag, got = consume(channel, q)
    pump(conn, lambda: len(got) == 2)
    channel.basic_cancel(tag)
    for m, _, _ in got:
        channel.basic_ack(m.delivery_tag)  # still fine after the cancel
    settle(conn)
    assert len(got) == 2
    ok = channel.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)


def test_consumer_tags(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    q = fill(ch, 0)
    tag = ch.basic_consume(q, lambda *a: None, consumer_tag="mine")
    assert tag == "mine"  # (a reused tag is a 530: see test_bad_input.py, pika refuses it)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as cinfo:
        ch.basic_consume(unique("absent"), lambda *a: None)
    assert cinfo.value.reply_code == 404


def test_exclusive_consumer(connect: Connect) -> None:
    a, b = connect().channel(), connect().channel()
    q = fill(a, 0)
    a.basic_consume(q, lambda *a: None, exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        b.basic_consume(q, lambda *a: None)
    assert info.value.reply_code == 403
    c = connect().channel()
    q2 = fill(c, 0)
    c.basic_consume(q2, lambda *a: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        connect().channel().basic_consume(q2, lambda *a: None, exclusive=True)
    assert info.value.reply_code == 403


def test_deleting_a_queue_cancels_its_consumers(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    q = fill(ch, 0)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume(q, lambda *a: None)
    connect().channel().queue_delete(q)
    pump(conn, lambda: bool(cancelled))
    assert cancelled[0].method.NAME == "Basic.Cancel"


def test_qos_prefetch_size_is_not_implemented(channel: BlockingChannel) -> None:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        channel.basic_qos(prefetch_size=1000, prefetch_count=1)
    assert info.value.reply_code == 540
