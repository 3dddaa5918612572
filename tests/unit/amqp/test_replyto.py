"""Tests for polymq_amqp.replyto: direct reply-to names and their core topics, both ways,
and how a message's reply_to carries them (polymq_amqp.properties)."""

from __future__ import annotations

from pamqp import commands

from polymq.types import Destination
from polymq_amqp import replyto
from polymq_amqp.properties import delivery_properties, from_publish
from polymq_server.names import VhostNames

from .test_messages import decoded

NAMES = VhostNames("/")


def test_names_and_their_topics_both_ways() -> None:
    a, b = replyto.new_name(), replyto.new_name()
    assert a != b and a.startswith("amq.rabbitmq.reply-to.")
    topic = replyto.core_topic(a)
    assert topic is not None and topic.startswith("topic/amqp-reply.")
    Destination.parse(topic)  # a core name
    assert replyto.amqp_name(topic) == a
    for other in ("amq.rabbitmq.reply-to", "amq.rabbitmq.reply-to.", "amq.rabbitmq.reply-to.a.b"):
        assert replyto.core_topic(other) is None
    for other in ("topic/amqp-reply.", "topic/amqp-reply.a.b", "queue/amqp-reply.a"):
        assert replyto.amqp_name(other) is None


def test_a_message_carries_the_reply_to_as_its_topic() -> None:
    name = replyto.new_name()
    props = commands.Basic.Properties(reply_to=name)
    message = from_publish(props, b"x", "", "rpc", NAMES)
    assert message.reply_to == replyto.core_topic(name)  # another protocol can answer there
    assert decoded(delivery_properties(message, NAMES)).reply_to == name
