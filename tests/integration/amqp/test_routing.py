"""Routing through every exchange type (direct, topic, fanout, headers, the default one and
the predeclared amq.*), exchange declarations and bindings, with pika."""

from __future__ import annotations

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from .helpers import unique

pytestmark = pytest.mark.timeout(60)


def queue(ch: BlockingChannel, **kw: object) -> str:
    name = unique("q")
    ch.queue_declare(name, **kw)  # type: ignore[arg-type]
    return name


def drain(ch: BlockingChannel, name: str) -> list[bytes]:
    """Every message in ``name`` (basic.get with auto-ack until get-empty)."""
    out = []
    while True:
        method, _props, body = ch.basic_get(name, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def test_default_exchange_routes_to_the_queue_named_by_the_key(channel: BlockingChannel) -> None:
    q = queue(channel)
    channel.basic_publish("", q, b"one")
    channel.basic_publish("", unique("nosuchqueue"), b"lost")  # dropped: no such queue
    method, _props, body = channel.basic_get(q, auto_ack=True)
    assert body == b"one"
    assert (method.exchange, method.routing_key) == ("", q)
    assert drain(channel, q) == []


def test_direct_exchange(channel: BlockingChannel) -> None:
    ex = unique("direct")
    channel.exchange_declare(ex, "direct")
    qa, qb = queue(channel), queue(channel)
    channel.queue_bind(qa, ex, "red")
    channel.queue_bind(qb, ex, "green")
    channel.queue_bind(qb, ex, "red")
    for key in ("red", "green", "blue", "red.x", "#"):
        channel.basic_publish(ex, key, key.encode())
    assert drain(channel, qa) == [b"red"]
    assert sorted(drain(channel, qb)) == [b"green", b"red"]


def test_direct_exchange_keys_with_odd_characters(channel: BlockingChannel) -> None:
    ex = unique("direct")
    channel.exchange_declare(ex, "direct")
    q = queue(channel)
    keys = ["", "a..b", ".lead", "sp ace", "ü:#*", "a.b"]
    for key in keys:
        channel.queue_bind(q, ex, key)
    for key in [*keys, "a", "b", "a.b.c"]:
        channel.basic_publish(ex, key, key.encode())
    got = []
    while True:
        method, _props, body = channel.basic_get(q, auto_ack=True)
        if method is None:
            break
        assert method.routing_key == body.decode()  # the key as it was published
        got.append(body.decode())
    assert sorted(got) == sorted(keys)


def test_topic_exchange_with_star_and_hash(channel: BlockingChannel) -> None:
    ex = unique("topic")
    channel.exchange_declare(ex, "topic")
    star, hash_, exact, all_ = queue(channel), queue(channel), queue(channel), queue(channel)
    channel.queue_bind(star, ex, "stock.*.nyse")
    channel.queue_bind(hash_, ex, "stock.#")
    channel.queue_bind(exact, ex, "stock.ibm.nyse")
    channel.queue_bind(all_, ex, "#")
    keys = ["stock.ibm.nyse", "stock.nyse", "stock", "stock.a.b.nyse", "bond.x.nyse"]
    for key in keys:
        channel.basic_publish(ex, key, key.encode())
    assert drain(channel, star) == [b"stock.ibm.nyse"]
    assert sorted(drain(channel, hash_)) == sorted(
        [b"stock.ibm.nyse", b"stock.nyse", b"stock", b"stock.a.b.nyse"]
    )
    assert drain(channel, exact) == [b"stock.ibm.nyse"]
    assert sorted(drain(channel, all_)) == sorted(k.encode() for k in keys)


def test_fanout_exchange_ignores_the_key(channel: BlockingChannel) -> None:
    ex = unique("fanout")
    channel.exchange_declare(ex, "fanout")
    qs = [queue(channel) for _ in range(3)]
    for i, q in enumerate(qs):
        channel.queue_bind(q, ex, f"whatever{i}")
    channel.basic_publish(ex, "", b"a")
    channel.basic_publish(ex, "x.y", b"b")
    for q in qs:
        assert drain(channel, q) == [b"a", b"b"]


def test_headers_exchange_all_and_any(channel: BlockingChannel) -> None:
    ex = unique("headers")
    channel.exchange_declare(ex, "headers")
    all_, any_ = queue(channel), queue(channel)
    channel.queue_bind(all_, ex, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    channel.queue_bind(any_, ex, arguments={"x-match": "any", "format": "pdf", "size": 10})

    def pub(body: bytes, headers: dict[str, object]) -> None:
        channel.basic_publish(ex, "", body, pika.BasicProperties(headers=headers))

    pub(b"both", {"format": "pdf", "type": "report"})
    pub(b"format", {"format": "pdf"})
    pub(b"size", {"size": 10})
    pub(b"size-as-text", {"size": "10"})
    pub(b"none", {"other": "x"})
    assert drain(channel, all_) == [b"both"]
    assert drain(channel, any_) == [b"both", b"format", b"size"]


def test_predeclared_exchanges(channel: BlockingChannel) -> None:
    q = queue(channel)
    channel.queue_bind(q, "amq.direct", q)
    channel.queue_bind(q, "amq.topic", f"{q}.#")
    channel.queue_bind(q, "amq.fanout")
    channel.queue_bind(q, "amq.headers", arguments={"k": q})
    channel.basic_publish("amq.direct", q, b"direct")
    channel.basic_publish("amq.topic", f"{q}.a.b", b"topic")
    channel.basic_publish("amq.headers", "", b"headers", pika.BasicProperties(headers={"k": q}))
    got = drain(channel, q)
    assert {b"direct", b"topic", b"headers"} <= set(got)
    for name, kind in (("amq.direct", "direct"), ("amq.topic", "topic")):
        channel.exchange_declare(name, kind, passive=True)
        channel.exchange_declare(name, kind, durable=True)  # equivalent: fine


def test_exchange_declare_rules(connect: object) -> None:
    conn = connect()  # type: ignore[operator]
    ch = conn.channel()
    ex = unique("ex")
    ch.exchange_declare(ex, "topic", durable=True)
    ch.exchange_declare(ex, "topic", durable=True)  # the same: fine
    ch.exchange_declare(ex, passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(ex, "direct", durable=True)
    assert info.value.reply_code == 406
    assert "inequivalent arg 'type'" in info.value.reply_text
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(unique("absent"), passive=True)
    assert info.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare("amq.mine", "direct")
    assert info.value.reply_code == 403
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_delete("amq.direct")
    assert info.value.reply_code == 403
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish(unique("absent"), "k", b"x")
        ch.basic_qos(prefetch_count=1)  # a round trip: the channel.close comes before it
    assert info.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as cinfo:
        ch.exchange_declare(unique("bad"), "no-such-type")
    assert cinfo.value.reply_code == 503


def test_an_exchange_declared_without_a_type_is_503(channel: BlockingChannel) -> None:
    """An empty type is no type (RabbitMQ: 503), not "direct"."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        channel.exchange_declare(unique("untyped"), exchange_type="")
    assert info.value.reply_code == 503
    assert "invalid exchange type ''" in info.value.reply_text


def test_exchange_delete_if_unused_and_bindings_go_with_it(channel: BlockingChannel) -> None:
    ex = unique("ex")
    channel.exchange_declare(ex, "direct")
    q = queue(channel)
    channel.queue_bind(q, ex, "k")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_delete(ex, if_unused=True)
    assert info.value.reply_code == 406
    ch = channel.connection.channel()
    ch.exchange_delete(ex)
    ch.exchange_declare(ex, "direct")  # a new exchange of that name has no bindings
    ch.basic_publish(ex, "k", b"x")
    assert drain(ch, q) == []
    ch.exchange_delete(unique("never"))  # deleting what is absent is fine (as RabbitMQ)


def test_unbind(channel: BlockingChannel) -> None:
    ex = unique("topic")
    channel.exchange_declare(ex, "topic")
    q = queue(channel)
    channel.queue_bind(q, ex, "a.*")
    channel.queue_bind(q, ex, "a.*", arguments={"x-other": 1})  # same pattern, another binding
    channel.queue_unbind(q, ex, "a.*")
    channel.basic_publish(ex, "a.b", b"still bound")
    channel.queue_unbind(q, ex, "a.*", arguments={"x-other": 1})
    channel.basic_publish(ex, "a.c", b"unbound")
    channel.queue_unbind(q, ex, "never.bound")  # fine
    assert drain(channel, q) == [b"still bound"]


def test_auto_delete_exchange_goes_with_its_last_binding(channel: BlockingChannel) -> None:
    ex = unique("auto")
    channel.exchange_declare(ex, "fanout", auto_delete=True)
    q = queue(channel)
    channel.queue_bind(q, ex)
    channel.queue_unbind(q, ex)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_declare(ex, passive=True)
    assert info.value.reply_code == 404


def test_internal_exchange_refuses_publishes(channel: BlockingChannel) -> None:
    ex = unique("internal")
    channel.exchange_declare(ex, "fanout", internal=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_publish(ex, "", b"x")
        channel.basic_qos(prefetch_count=1)
    assert info.value.reply_code == 403


def test_bind_errors(connect: object) -> None:
    conn = connect()  # type: ignore[operator]
    ch = conn.channel()
    q = queue(ch)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind(q, unique("noex"), "k")
    assert info.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind(unique("noq"), "amq.direct", "k")
    assert info.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind(q, "", "k")
    assert info.value.reply_code == 403
