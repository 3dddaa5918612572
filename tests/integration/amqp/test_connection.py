"""The connection: handshake, server properties, logins, vhosts, tuning, heartbeats both
ways, channels, and the admin endpoints (health, readiness, metrics)."""

from __future__ import annotations

import time
from collections.abc import Callable

import aio_pika
import pika
import pytest
import requests
from pamqp import commands, encode

from .helpers import WAIT, Broker, RawAmqp, Target, unique

pytestmark = pytest.mark.timeout(60)
Connect = Callable[..., pika.BlockingConnection]


def test_server_properties_and_capabilities(connect: Connect) -> None:
    conn = connect()
    props = conn._impl.server_properties
    assert props["product"] in (b"polymq", "polymq")
    caps = conn._impl.server_capabilities
    for cap in (
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "per_consumer_qos",
        "exchange_exchange_bindings",
        "direct_reply_to",
    ):
        assert caps[cap] is True, cap


def test_tune_offers_the_defaults(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        tune = raw.handshake()
        assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    finally:
        raw.close()


def test_login_with_plain_and_any_password_in_anonymous_mode(broker: Broker) -> None:
    creds = pika.PlainCredentials("someone", "whatever")
    conn = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, credentials=creds)
    )
    conn.channel().queue_declare(unique("q"))
    conn.close()


def test_login_with_amqplain(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.send(b"AMQP\x00\x00\x09\x01")
        start = raw.expect(commands.Connection.Start)
        assert set(start.mechanisms.split()) == {"PLAIN", "AMQPLAIN"}
        table = encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
        raw.method(0, commands.Connection.StartOk({}, "AMQPLAIN", table.decode(), "en_US"))
        raw.expect(commands.Connection.Tune)
    finally:
        raw.close()


def test_unknown_mechanism_is_refused(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.send(b"AMQP\x00\x00\x09\x01")
        raw.expect(commands.Connection.Start)
        raw.method(0, commands.Connection.StartOk({}, "CRAM-MD5", "x", "en_US"))
        close = raw.expect(commands.Connection.Close)
        assert close.reply_code == 403
        assert raw.closed_by_server()
    finally:
        raw.close()


async def test_aio_pika_connects(broker: Broker) -> None:
    conn = await aio_pika.connect(broker.amqp_url(), timeout=WAIT)
    ch = await conn.channel()
    await ch.declare_queue(unique("q"))
    await conn.close()


def test_unknown_vhost_is_refused_with_530(broker: Broker) -> None:
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port, virtual_host="nope")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(params)
    assert "530" in str(info.value) and "vhost nope not found" in str(info.value)


def test_many_channels_and_channel_reuse(connect: Connect) -> None:
    conn = connect()
    channels = [conn.channel() for _ in range(20)]
    for ch in channels[::2]:
        ch.close()
    again = conn.channel()  # a closed number is reused
    again.queue_declare(unique("q"))
    for ch in channels[1::2]:
        ch.queue_declare(unique("q"))


def test_idle_client_with_heartbeat_1s_stays_connected(connect: Connect) -> None:
    conn = connect(heartbeat=1)
    ch = conn.channel()
    conn.sleep(3.5)  # pika answers heartbeats while it sleeps
    assert conn.is_open
    ch.queue_declare(unique("q"))


def test_server_sends_heartbeats(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.handshake(heartbeat=1)
        raw.sock.settimeout(WAIT)
        data = b""
        deadline = time.monotonic() + 3
        while b"\x08\x00\x00\x00\x00\x00\x00\xce" not in data:
            assert time.monotonic() < deadline, data
            raw.heartbeat()  # we keep ours going
            data += raw.sock.recv(4096)
    finally:
        raw.close()


def test_silent_client_is_closed_after_missed_heartbeats(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.handshake(heartbeat=1)
        started = time.monotonic()
        assert raw.closed_by_server(timeout=WAIT)
        assert 1.5 < time.monotonic() - started < 6
    finally:
        raw.close()


def test_handshake_timeout_closes_a_silent_socket(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.send(b"AMQP\x00\x00\x09\x01")
        raw.expect(commands.Connection.Start)
        started = time.monotonic()
        assert raw.closed_by_server(timeout=15)  # no start-ok: closed (3 s in these tests)
        assert time.monotonic() - started < 6
    finally:
        raw.close()


def test_connection_close_is_answered(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.handshake()
        raw.method(0, commands.Connection.Close(200, "bye", 0, 0))
        raw.expect(commands.Connection.CloseOk)
        assert raw.closed_by_server()
    finally:
        raw.close()


def test_channel_flow(broker: Broker) -> None:
    raw = RawAmqp(broker.amqp_port)
    try:
        raw.handshake()
        raw.open_channel(1)
        raw.method(1, commands.Channel.Flow(active=True))
        assert raw.expect(commands.Channel.FlowOk).active is True
        raw.method(1, commands.Channel.Flow(active=False))
        close = raw.expect(commands.Connection.Close)
        assert close.reply_code == 540
    finally:
        raw.close()


def test_admin_endpoints(broker: Broker, connect: Connect) -> None:
    ch = connect().channel()
    q = unique("q")
    ch.queue_declare(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x")
    ch.basic_get(q, auto_ack=True)
    base = broker.url("amqp_admin")
    assert requests.get(f"{base}/healthz", timeout=WAIT).status_code == 200
    ready = requests.get(f"{base}/readyz", timeout=WAIT)
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    text = requests.get(f"{base}/metrics", timeout=WAIT).text
    for needle in (
        'polymq_amqp_methods_total{direction="in",method="basic.publish"}',
        'polymq_amqp_methods_total{direction="out",method="basic.get-ok"}',
        'polymq_amqp_confirms_total{result="ack"}',
        'polymq_amqp_deliveries_total{kind="get"}',
        "polymq_amqp_connections ",
        "polymq_amqp_channels ",
        "polymq_amqp_core_connected 1.0",
    ):
        assert needle in text, needle


def test_update_secret(target: Target) -> None:
    """connection.update-secret (a token refresh) is answered, and the connection goes on:
    here the same password again (polymq's anonymous mode, RabbitMQ's guest)."""
    conn = target.pika()
    try:
        ch = conn.channel()
        q = unique("secret")
        ch.queue_declare(q, auto_delete=True)
        conn.update_secret("guest", "token refresh")
        ch.basic_publish("", q, b"after")
        assert ch.basic_get(q, auto_ack=True)[2] == b"after"
        caps = conn._impl.server_capabilities
        assert caps["consumer_priorities"] is True
    finally:
        conn.close()
