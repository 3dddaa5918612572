"""Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to``): RPC replies without a reply queue.

A requester consumes from the pseudo-queue ``amq.rabbitmq.reply-to`` in no-ack mode, then
publishes requests on the same channel with ``reply_to = "amq.rabbitmq.reply-to"``. The
frontend gives the channel a name of its own, ``amq.rabbitmq.reply-to.<token>``, which the
requests carry instead; a responder publishes its reply to the default exchange with that
name as the routing key, and it is delivered to the requester's consumer.

In the core the name is the transient topic ``topic/amqp-reply.<token>``, to which the
consumer is subscribed (auto-acknowledged, dropping what a slow requester cannot take): a
reply reaches the requester through whichever frontend the responder uses, and nothing is
kept when the requester is gone (a mandatory reply is then returned, 312 NO_ROUTE). Another
protocol's responder sees the reply-to as that topic (STOMP ``/topic/amqp-reply.<token>``)
and can send its reply there.

The channels are reserved names (:func:`polymq_server.names.reserved`): only the requester's
own frontend subscribes to one, no user's subscription, binding or pattern (``#``,
``amqp-reply.#``) reaches them whatever its grants, and a responder writes its reply to one
by its exact name (as its grants allow).

As RabbitMQ: consuming from the pseudo-queue needs no-ack (406 otherwise) and one such
consumer per channel (406 for a second); a request naming ``amq.rabbitmq.reply-to`` on a
channel without one is a 406; ``queue.declare`` of the pseudo-queue (passive) succeeds.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

from polymq_server.names import REPLY_SEGMENT

__all__ = ["CORE_PREFIX", "PREFIX", "PSEUDO_QUEUE", "amqp_name", "core_topic", "new_name"]

PSEUDO_QUEUE: Final = "amq.rabbitmq.reply-to"
PREFIX: Final = PSEUDO_QUEUE + "."
CORE_PREFIX: Final = f"topic/{REPLY_SEGMENT}."
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9_\-]{1,64}\Z")


def new_name() -> str:
    """A reply-to name for one channel: ``amq.rabbitmq.reply-to.<token>``."""
    return PREFIX + secrets.token_urlsafe(18)


def core_topic(name: str) -> str | None:
    """The core topic of a reply-to name; None if ``name`` is not one."""
    if not name.startswith(PREFIX):
        return None
    token = name[len(PREFIX) :]
    return CORE_PREFIX + token if _TOKEN_RE.match(token) else None


def amqp_name(core: str) -> str | None:
    """The reply-to name of a core topic; None if ``core`` is not one."""
    if not core.startswith(CORE_PREFIX):
        return None
    token = core[len(CORE_PREFIX) :]
    return PREFIX + token if _TOKEN_RE.match(token) else None
