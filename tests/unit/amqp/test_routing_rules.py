"""Tests for polymq_server.exchanges.kinds, polymq_amqp.arguments and polymq_amqp.config."""

from __future__ import annotations

from typing import Any

import pytest

from polymq.types import DeclareOptions
from polymq_amqp.arguments import queue_options
from polymq_amqp.config import AmqpSettings
from polymq_amqp.errors import ChannelException
from polymq_server.config import ConfigError, from_env
from polymq_server.exchanges.kinds import ExchangeType, binding_pattern, headers_match
from polymq_server.names import VhostNames

NAMES = VhostNames("/")


# ---- exchanges -----------------------------------------------------------------------------
def test_binding_patterns() -> None:
    assert binding_pattern(ExchangeType.FANOUT, "ignored") == "#"
    assert binding_pattern(ExchangeType.TOPIC, "a.*.#") == "a.*.#"
    assert binding_pattern(ExchangeType.DIRECT, "a.*.#") == "a.:2A.:23"
    assert binding_pattern(ExchangeType.HEADERS, "k") is None


@pytest.mark.parametrize(
    ("args", "headers", "match"),
    [
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 0}, True),
        ({"a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
        ({"x-match": "any", "a": 1}, {"a": 2}, False),
        ({"a": 1}, {"a": "1"}, False),  # types matter, as in RabbitMQ
        ({"a": "s"}, {"a": b"s"}, True),  # a long string is a long string
        ({"a": True}, {"a": 1}, False),
        ({"a": None}, {"a": "anything"}, True),  # void: presence only
        ({"x-match": "all", "x-k": 1}, {}, True),  # x- arguments are not compared
        ({"x-match": "all-with-x", "x-k": 1}, {}, False),
        ({}, None, True),
        ({"x-match": "any"}, {"a": 1}, False),
    ],
)
def test_headers_matching(
    args: dict[str, Any], headers: dict[str, Any] | None, match: bool
) -> None:
    assert headers_match(args, headers) is match


# ---- queue arguments -----------------------------------------------------------------------
def options(args: dict[str, Any], **kw: Any) -> dict[str, Any]:
    kw.setdefault("durable", True)
    kw.setdefault("exclusive", False)
    out = queue_options(args, NAMES, "q", exclusive_ttl=60.0, **kw)
    DeclareOptions.from_dict(out)  # the core takes them
    return out


def test_queue_arguments() -> None:
    assert options({}) == {"durable": True, "max_priority": 0}  # strictly FIFO
    assert options({}, durable=True, exclusive=True) == {
        "durable": False,
        "idle_ttl": 60.0,
        "max_priority": 0,
    }
    got = options(
        {
            "x-message-ttl": 1500,
            "x-expires": 60_000,
            "x-max-length": 10,
            "x-max-length-bytes": 1000,
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "dead.k",
            "x-delivery-limit": 3,
            "x-max-priority": 10,
            "x-queue-type": "quorum",
        }
    )
    assert got == {
        "durable": True,
        "message_ttl": 1.5,
        "idle_ttl": 60.0,
        "max_length": 10,
        "max_bytes": 1000,
        "overflow": "drop-oldest",
        "dead_letter": "topic/amqp.dlx.dead.k",
        "max_deliveries": 4,
        "max_priority": 10,
    }
    assert options({"x-message-ttl": 0})["message_ttl"] == 0.001
    assert options({"x-max-length": 1, "x-overflow": "reject-publish"})["overflow"] == "reject"
    assert options({"x-dead-letter-exchange": ""})["dead_letter"] == "queue/q"
    assert (
        options({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "d"})["dead_letter"]
        == "queue/d"
    )
    assert options({"x-dead-letter-exchange": b"fan"})["dead_letter"] == "topic/amqp.fan.q"
    assert options({"x-unknown": "kept elsewhere"}) == {"durable": True, "max_priority": 0}
    assert options({"x-max-priority": 0})["max_priority"] == 0
    assert options({"x-message-ttl": 2**32 - 1})["message_ttl"] == (2**32 - 1) / 1000


@pytest.mark.parametrize(
    "args",
    [
        {"x-message-ttl": -1},
        {"x-message-ttl": "1000"},
        {"x-expires": 0},
        {"x-expires": 2**32},  # RabbitMQ's bound: 2^32 - 1 ms
        {"x-message-ttl": 2**62},
        {"x-max-length": 0},
        {"x-max-length": True},
        {"x-overflow": "explode"},
        {"x-dead-letter-routing-key": "k"},
        {"x-max-priority": 256},
        {"x-queue-type": "stream"},
        {"x-single-active-consumer": True},
    ],
)
def test_bad_queue_arguments_are_406(args: dict[str, Any]) -> None:
    with pytest.raises(ChannelException) as info:
        options(args)
    assert info.value.reply_code == 406


def test_quorum_queues_are_durable() -> None:
    with pytest.raises(ChannelException):
        options({"x-queue-type": "quorum"}, durable=False)


# ---- settings ------------------------------------------------------------------------------
def test_settings_from_the_environment() -> None:
    s = from_env(
        AmqpSettings,
        env={
            "POLYMQ_AMQP_PORT": "0",
            "POLYMQ_CORE_HOST": "core.svc",
            "POLYMQ_AMQP_VHOSTS": "/, test",
            "POLYMQ_AMQP_HEARTBEAT": "30",
        },
    )
    assert (s.amqp_port, s.core_host, s.amqp_heartbeat) == (0, "core.svc", 30)
    assert s.vhost_allowed("test") and s.vhost_allowed("/") and not s.vhost_allowed("x")
    assert AmqpSettings(amqp_vhosts="*").vhost_allowed("anything")


@pytest.mark.parametrize(
    "env",
    [
        {"POLYMQ_AMQP_PORT": "70000"},
        {"POLYMQ_AMQP_FRAME_MAX": "100"},
        {"POLYMQ_AMQP_VHOSTS": " , "},
        {"POLYMQ_TLS_CERT": "/no/such/cert.pem", "POLYMQ_TLS_KEY": "/no/such/key.pem"},
        {"POLYMQ_TLS_CERT": "/x"},
        {"POLYMQ_CORE_PORT": "0"},
        {"POLYMQ_AMQP_HEARTBEAT": "soon"},
    ],
)
def test_bad_settings(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        from_env(AmqpSettings, env=env)
