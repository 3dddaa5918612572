"""basic.publish: properties kept end to end, large bodies, mandatory returns, publisher
confirms (single and multiple acks, nacks) and transactions, with pika and raw AMQP."""

from __future__ import annotations

import datetime
import decimal
import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pamqp import commands, header
from pamqp.body import ContentBody
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from .helpers import QUIET, WAIT, Broker, RawAmqp, Target, unique

pytestmark = pytest.mark.timeout(60)
Connect = Callable[..., BlockingConnection]


def test_properties_survive_the_round_trip(channel: BlockingChannel) -> None:
    q = unique("q")
    channel.queue_declare(q)
    sent = pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={
            "s": "text",
            "i": 42,
            "neg": -70000,
            "big": 2**40,
            "b": True,
            "d": decimal.Decimal("3.14"),
            "t": datetime.datetime(2024, 1, 2, 3, 4, 5),
            "nested": {"k": [1, "two", {"x": False}]},
            "none": None,
        },
        delivery_mode=2,
        priority=7,
        correlation_id="corr-1",
        reply_to="answers",
        expiration="60000",
        message_id="mid-1",
        timestamp=1_700_000_000,
        type="order.created",
        user_id="guest",
        app_id="tests",
    )
    channel.basic_publish("", q, b'{"x": 1}', sent)
    _method, got, body = channel.basic_get(q, auto_ack=True)
    assert body == b'{"x": 1}'
    for attr in (
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        assert getattr(got, attr) == getattr(sent, attr), attr
    assert got.expiration == "60000"
    h = got.headers
    assert h["s"] == "text" and h["i"] == 42 and h["neg"] == -70000 and h["big"] == 2**40
    assert h["b"] is True and h["d"] == decimal.Decimal("3.14")
    assert h["t"].replace(tzinfo=None) == datetime.datetime(2024, 1, 2, 3, 4, 5)
    assert h["nested"] == {"k": [1, b"two", {"x": False}]} or h["nested"] == {
        "k": [1, "two", {"x": False}]
    }
    assert "none" in h and h["none"] is None
    assert not any(k.startswith("x-amqp-") for k in h)  # the frontend's own stay hidden


def test_a_message_without_properties_has_none(channel: BlockingChannel) -> None:
    q = unique("q")
    channel.queue_declare(q)
    channel.basic_publish("", q, b"bare")
    _m, props, _b = channel.basic_get(q, auto_ack=True)
    assert props.content_type is None
    assert props.headers is None
    assert props.delivery_mode == 1


@pytest.mark.parametrize("size", [0, 1, 131072 - 8, 131072, 5 * 131072 + 17, 3_000_000])
def test_bodies_of_any_size(channel: BlockingChannel, size: int) -> None:
    q = unique("q")
    channel.queue_declare(q)
    body = bytes(i % 251 for i in range(size))
    channel.basic_publish("", q, body)
    _m, _p, got = channel.basic_get(q, auto_ack=True)
    assert got == body


def test_mandatory_unroutable_message_is_returned(channel: BlockingChannel) -> None:
    returned: list[tuple[Any, Any, bytes]] = []
    channel.add_on_return_callback(lambda _ch, m, p, b: returned.append((m, p, b)))
    ex = unique("ex")
    channel.exchange_declare(ex, "direct")
    channel.basic_publish(
        ex, "nobody", b"lost", pika.BasicProperties(content_type="text/plain"), mandatory=True
    )
    channel.basic_publish("", unique("noqueue"), b"lost too", mandatory=True)
    q = unique("q")
    channel.queue_declare(q)
    channel.basic_publish("", q, b"routed", mandatory=True)
    deadline = time.monotonic() + WAIT
    while len(returned) < 2:
        assert time.monotonic() < deadline
        channel.connection.process_data_events(time_limit=0.05)
    channel.connection.process_data_events(time_limit=QUIET)
    assert [(m.reply_code, m.reply_text, m.exchange, b) for m, _, b in returned] == [
        (312, "NO_ROUTE", ex, b"lost"),
        (312, "NO_ROUTE", "", b"lost too"),
    ]
    assert returned[0][1].content_type == "text/plain"


def test_mandatory_with_confirms(channel: BlockingChannel) -> None:
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", unique("noqueue"), b"x", mandatory=True)
    channel.basic_publish("", unique("noqueue"), b"x")  # not mandatory: acked, dropped


def test_a_return_comes_before_the_answer_to_a_later_method(target: Target) -> None:
    """An unroutable mandatory publish's basic.return is sent in the channel's order: before
    the answer to the method that follows the publish on that channel (confirm.select-ok,
    the start of pika's ``confirm_delivery()``; basic.qos-ok; channel.close-ok), as
    RabbitMQ's channel sends it, whatever the exchange the publish went to."""
    raw = RawAmqp(target.port)
    try:
        raw.handshake()
        raw.open_channel(1)
        ex = unique("ex")
        raw.method(1, commands.Exchange.Declare(exchange=ex, exchange_type="direct"))
        raw.expect(commands.Exchange.DeclareOk)
        cases = [
            ("amq.topic", commands.Confirm.Select(), commands.Confirm.SelectOk),
            ("amq.fanout", commands.Basic.Qos(prefetch_count=5), commands.Basic.QosOk),
            (ex, commands.Confirm.Select(), commands.Confirm.SelectOk),
            ("", commands.Channel.Close(200, "bye", 0, 0), commands.Channel.CloseOk),
        ]
        for number, (exchange, method, answer) in enumerate(cases, start=2):
            raw.open_channel(number)
            raw.publish(number, exchange, unique("nobody"), b"lost", mandatory=True)
            raw.method(number, method)
            got = [raw.read(), raw.read()]
            assert [(ch, type(f)) for ch, f in got] == [
                (number, commands.Basic.Return),
                (number, header.ContentHeader),
            ], (exchange, got)
            assert isinstance(raw.read()[1], ContentBody)
            assert raw.expect(answer) is not None
    finally:
        raw.close()


def test_confirms_of_many_publishes_use_multiple(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.handshake()
        raw.open_channel(1)
        q = unique("q")
        raw.method(1, commands.Queue.Declare(queue=q))
        raw.expect(commands.Queue.DeclareOk)
        raw.method(1, commands.Confirm.Select())
        raw.expect(commands.Confirm.SelectOk)
        n = 200
        for i in range(n):
            raw.publish(1, "", q, str(i).encode())
        acked: set[int] = set()
        frames = []
        while len(acked) < n:
            _, ack = raw.read()
            assert isinstance(ack, commands.Basic.Ack), ack
            frames.append(ack)
            low = min(set(range(1, n + 1)) - acked)
            if ack.multiple:
                acked |= set(range(low, ack.delivery_tag + 1))
            else:
                acked.add(ack.delivery_tag)
        assert acked == set(range(1, n + 1))
        assert any(a.multiple for a in frames)
        assert len(frames) < n
    finally:
        raw.close()


def test_transaction_commit_and_rollback(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    q = unique("q")
    ch.queue_declare(q)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    ch.tx_rollback()
    ch.basic_publish("", q, b"committed 1")
    ch.basic_publish("", q, b"committed 2")
    other = connect().channel()
    assert other.queue_declare(q, passive=True).method.message_count == 0  # not yet
    ch.tx_commit()
    assert other.queue_declare(q, passive=True).method.message_count == 2
    method, _p, body = ch.basic_get(q)
    assert body == b"committed 1"
    ch.basic_ack(method.delivery_tag)  # held until the commit
    ch.tx_rollback()  # ... and dropped: the message stays unacknowledged
    ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    _m, _p, body = other.basic_get(q, auto_ack=True)
    assert body == b"committed 2"
    assert other.basic_get(q) == (None, None, None)


@pytest.mark.parametrize("twice", ["same tag", "multiple then one of its tags"])
def test_a_bad_ack_in_a_transaction_is_refused_at_once_and_nothing_of_it_applies(
    connect: Connect, twice: str
) -> None:
    """A tag settled twice in one transaction is a 406 when it is sent, as in RabbitMQ;
    the channel's transaction is thrown away (not half applied at tx.commit, as it was)."""
    conn = connect()
    setup = conn.channel()
    src, dst = unique("q"), unique("q")
    setup.queue_declare(src)
    setup.queue_declare(dst)
    setup.confirm_delivery()
    setup.basic_publish("", src, b"1")
    setup.basic_publish("", src, b"2")
    ch = conn.channel()
    first, _p, _b = ch.basic_get(src)
    second, _p, _b = ch.basic_get(src)
    ch.tx_select()
    ch.basic_publish("", dst, b"in the transaction")
    if twice == "same tag":
        ch.basic_ack(first.delivery_tag)
        ch.basic_ack(first.delivery_tag)
    else:
        ch.basic_ack(second.delivery_tag, multiple=True)  # both
        ch.basic_ack(first.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_commit()
    assert info.value.reply_code == 406
    assert f"unknown delivery tag {first.delivery_tag}" in info.value.reply_text
    other = connect().channel()
    assert other.queue_declare(dst, passive=True).method.message_count == 0
    assert other.queue_declare(src, passive=True).method.message_count == 2  # both back


def test_tx_and_confirm_modes_exclude_each_other(connect: Connect) -> None:
    ch = connect().channel()
    ch.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.confirm_delivery()
    assert info.value.reply_code == 406
    ch = connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_commit()
    assert info.value.reply_code == 406


def test_user_id_must_be_the_logged_in_user(channel: BlockingChannel) -> None:
    q = unique("q")
    channel.queue_declare(q)
    channel.basic_publish("", q, b"x", pika.BasicProperties(user_id="guest"))
    _m, props, _b = channel.basic_get(q, auto_ack=True)
    assert props.user_id == "guest"
    channel.basic_publish("", q, b"x", pika.BasicProperties(user_id="someone-else"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_qos(prefetch_count=1)
    assert info.value.reply_code == 406
    assert "user_id property set to 'someone-else'" in info.value.reply_text


def test_invalid_expiration_is_406(channel: BlockingChannel) -> None:
    q = unique("q")
    channel.queue_declare(q)
    channel.basic_publish("", q, b"x", pika.BasicProperties(expiration="soon"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_qos(prefetch_count=1)
    assert info.value.reply_code == 406
