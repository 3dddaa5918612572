"""queue.declare and its arguments, exclusive and auto-delete queues, purge and delete,
length limits (priorities: test_priorities.py), TTL and dead-lettering, with pika."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from .helpers import WAIT, eventually, unique

pytestmark = pytest.mark.timeout(60)
Connect = Callable[..., BlockingConnection]


def get_all(ch: BlockingChannel, name: str) -> list[bytes]:
    out = []
    while True:
        method, _props, body = ch.basic_get(name, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def refused(fn: Callable[[], object]) -> pika.exceptions.ChannelClosedByBroker:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        fn()
    return info.value


def test_declare_counts_and_passive(channel: BlockingChannel) -> None:
    q = unique("q")
    ok = channel.queue_declare(q, durable=True)
    assert (ok.method.queue, ok.method.message_count, ok.method.consumer_count) == (q, 0, 0)
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", q, body)
    channel.basic_consume(q, lambda *a: None)
    ok = channel.queue_declare(q, passive=True)
    eventually(lambda: channel.queue_declare(q, passive=True).method.consumer_count == 1)
    ok = channel.queue_declare(q, durable=True)  # equivalent: fine
    assert ok.method.consumer_count == 1


def test_server_named_and_the_last_declared_queue(channel: BlockingChannel) -> None:
    ok = channel.queue_declare("", exclusive=True)
    name = ok.method.queue
    assert name.startswith("amq.gen-")
    channel.queue_bind("", "amq.fanout")  # "" is the last declared queue
    channel.basic_publish("", name, b"x")
    _method, _props, body = channel.basic_get("", auto_ack=True)
    assert body == b"x"


def test_redeclare_with_other_arguments_is_406(connect: Connect) -> None:
    conn = connect()
    q = unique("q")
    conn.channel().queue_declare(q, durable=True, arguments={"x-max-length": 10})
    err = refused(lambda: conn.channel().queue_declare(q, durable=False))
    assert err.reply_code == 406 and "inequivalent arg 'durable'" in err.reply_text
    err = refused(
        lambda: conn.channel().queue_declare(q, durable=True, arguments={"x-max-length": 11})
    )
    assert err.reply_code == 406 and "x-max-length" in err.reply_text
    err = refused(lambda: conn.channel().queue_declare(unique("absent"), passive=True))
    assert err.reply_code == 404
    err = refused(lambda: conn.channel().queue_declare("amq.mine"))
    assert err.reply_code == 403
    err = refused(lambda: conn.channel().queue_declare(unique("q"), arguments={"x-overflow": 1}))
    assert err.reply_code == 406


def test_exclusive_queue_is_locked_for_others_and_deleted_with_its_connection(
    connect: Connect,
) -> None:
    owner, other = connect(), connect()
    q = unique("excl")
    och = owner.channel()
    och.queue_declare(q, exclusive=True)
    och.basic_publish("", q, b"mine")
    for attempt in (
        lambda ch: ch.queue_declare(q, exclusive=True),
        lambda ch: ch.basic_consume(q, lambda *a: None),
        lambda ch: ch.basic_get(q),
        lambda ch: ch.queue_purge(q),
        lambda ch: ch.queue_delete(q),
        lambda ch: ch.queue_bind(q, "amq.fanout"),
    ):
        err = refused(lambda: attempt(other.channel()))  # noqa: B023
        assert err.reply_code == 405, err
        assert "RESOURCE_LOCKED" in err.reply_text
    other.channel().basic_publish("", q, b"from another")  # publishing is allowed
    assert get_all(och, q) == [b"mine", b"from another"]
    owner.close()

    def gone() -> bool:
        ch = other.channel()
        try:
            ch.queue_declare(q, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code in (404, 405)  # 405 until the deletion is done
            return exc.reply_code == 404
        ch.close()
        return False

    eventually(gone, WAIT)


def test_auto_delete_queue_goes_with_its_last_consumer(channel: BlockingChannel) -> None:
    q = unique("auto")
    channel.queue_declare(q, auto_delete=True)
    t1 = channel.basic_consume(q, lambda *a: None)
    t2 = channel.basic_consume(q, lambda *a: None)
    channel.basic_cancel(t1)
    time.sleep(0.3)
    channel.queue_declare(q, passive=True)  # one consumer is left
    channel.basic_cancel(t2)
    conn = channel.connection

    def gone() -> bool:
        ch = conn.channel()
        try:
            ch.queue_declare(q, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code == 404
        ch.close()
        return False

    eventually(gone)


def test_purge_and_delete(connect: Connect) -> None:
    conn = connect()
    ch = conn.channel()
    q = unique("q")
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    assert ch.queue_purge(q).method.message_count == 5
    ch.basic_publish("", q, b"x")
    err = refused(lambda: ch.queue_delete(q, if_empty=True))
    assert err.reply_code == 406 and "not empty" in err.reply_text
    ch = conn.channel()
    ch.basic_consume(q, lambda *a: None)
    err = refused(lambda: ch.queue_delete(q, if_unused=True))
    assert err.reply_code == 406 and "in use" in err.reply_text
    ch = conn.channel()
    assert ch.queue_delete(q).method.message_count == 1
    assert refused(lambda: ch.queue_declare(q, passive=True)).reply_code == 404
    ch = conn.channel()
    assert ch.queue_delete(unique("never")).method.message_count == 0  # as RabbitMQ
    assert refused(lambda: ch.queue_purge(unique("never"))).reply_code == 404


def test_max_length_drops_the_head_by_default(channel: BlockingChannel) -> None:
    q = unique("len")
    channel.queue_declare(q, arguments={"x-max-length": 2})
    for i in range(5):
        channel.basic_publish("", q, str(i).encode())
    assert get_all(channel, q) == [b"3", b"4"]


def test_reject_publish_overflow_nacks_confirms(channel: BlockingChannel) -> None:
    q = unique("full")
    channel.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", q, b"1")
    channel.basic_publish("", q, b"2")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", q, b"3")
    assert get_all(channel, q) == [b"1", b"2"]
    channel.basic_publish("", q, b"4")  # room again


def test_message_ttl_expiry_dead_letters(channel: BlockingChannel) -> None:
    dlx, src, dlq = unique("dlx"), unique("src"), unique("dlq")
    channel.exchange_declare(dlx, "direct")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, dlx, "expired")
    channel.queue_declare(
        src,
        arguments={
            "x-message-ttl": 100,
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-routing-key": "expired",
        },
    )
    channel.basic_publish("", src, b"short-lived", pika.BasicProperties(headers={"k": "v"}))
    channel.basic_publish("", src, b"per-message", pika.BasicProperties(expiration="50"))
    time.sleep(0.4)
    assert channel.basic_get(src, auto_ack=True)[0] is None  # expired (found on the way)
    got = []
    for _ in range(2):
        method, props, body = channel.basic_get(dlq, auto_ack=True)
        assert method is not None
        got.append(body)
        assert (method.exchange, method.routing_key) == (dlx, "expired")
        assert props.headers["x-first-death-reason"] == "expired"
        assert props.headers["x-death"][0]["queue"] == src
    assert sorted(got) == [b"per-message", b"short-lived"]


def test_reject_without_requeue_dead_letters_to_the_default_exchange(
    channel: BlockingChannel,
) -> None:
    src, dlq = unique("src"), unique("dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(
        src, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    )
    channel.basic_publish("", src, b"bad", pika.BasicProperties(content_type="text/plain"))
    channel.basic_publish("", src, b"again")
    method, _props, body = channel.basic_get(src)
    assert body == b"bad"
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, _props, body = channel.basic_get(src)
    channel.basic_nack(method.delivery_tag, requeue=False)

    def dead() -> list[tuple[bytes, str]]:
        out = []
        while True:
            m, p, b = channel.basic_get(dlq, auto_ack=True)
            if m is None:
                return out
            out.append((b, p.headers["x-first-death-reason"]))

    got: list[tuple[bytes, str]] = []
    eventually(lambda: bool(got.extend(dead())) or len(got) >= 2)
    assert got == [(b"bad", "rejected"), (b"again", "rejected")]


def test_fanout_dead_letter_exchange_without_a_key(channel: BlockingChannel) -> None:
    dlx, src, dlq = unique("dlx"), unique("src"), unique("dlq")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, dlx)
    channel.queue_declare(src, arguments={"x-dead-letter-exchange": dlx})
    channel.basic_publish("", src, b"x")
    method, _props, _body = channel.basic_get(src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    eventually(lambda: channel.queue_declare(dlq, passive=True).method.message_count == 1)


def test_delivery_limit_dead_letters_after_requeues(channel: BlockingChannel) -> None:
    src, dlq = unique("src"), unique("dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(
        src,
        arguments={
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    channel.basic_publish("", src, b"poison")
    for redelivered in (False, True):
        method, _props, _body = channel.basic_get(src)
        assert method.redelivered is redelivered
        channel.basic_nack(method.delivery_tag, requeue=True)
    eventually(lambda: channel.queue_declare(dlq, passive=True).method.message_count == 1)
    assert channel.basic_get(src)[0] is None
