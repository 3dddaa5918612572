"""queue.declare arguments: RabbitMQ's ``x-`` names as core declare options.

===========================  ==========================================================
argument                     core declare option
===========================  ==========================================================
``x-message-ttl`` (ms)       ``message_ttl`` (0 counts as 1 ms; at most 2^32 - 1, as in
                             RabbitMQ)
``x-expires`` (ms)           ``idle_ttl``: deleted after that long unused (at most 2^32 - 1)
``x-max-length``             ``max_length`` (at least 1)
``x-max-length-bytes``       ``max_bytes``
``x-overflow``               ``drop-head`` -> ``drop-oldest`` (RabbitMQ's default),
                             ``reject-publish`` and ``reject-publish-dlx`` -> ``reject``
``x-dead-letter-exchange``   ``dead_letter``: ``topic/amqp.<DLX>.<DLRK>``; ``queue/<DLRK>``
``x-dead-letter-routing-     for the default exchange. Without a routing key the queue's
key``                        own name is used (RabbitMQ would use each message's own key,
                             which the core cannot do; a fanout DLX ignores it anyway)
``x-delivery-limit``         ``max_deliveries`` = limit + 1 (then dead-lettered)
``x-max-priority``           ``max_priority``: priorities 0..max order the queue (the core
                             has levels 0..9: above 9 counts as 9); without it a queue is
                             strictly FIFO (``max_priority=0``), as in RabbitMQ
``x-queue-type``             ``classic`` or ``quorum`` (both a polymq queue)
``x-single-active-consumer`` only ``false``
===========================  ==========================================================

Other arguments are kept with the queue and compared on redeclaration, as RabbitMQ does.
A malformed value is a 406 PRECONDITION_FAILED naming the argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polymq_server.names import UnmappableName, VhostNames

from .errors import PRECONDITION_FAILED, ChannelException

__all__ = ["queue_options"]


_MAX_MS = 2**32 - 1  # the longest x-message-ttl and x-expires (RabbitMQ's bound, ~49.7 days)


def _int(
    args: Mapping[str, Any], name: str, low: int, queue: str, high: int | None = None
) -> int | None:
    v = args.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        bounds = f">= {low}" if high is None else f"from {low} to {high}"
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg '{name}' for queue '{queue}': {v!r} is not an integer {bounds}",
        )
    return v


def _str(args: Mapping[str, Any], name: str, queue: str) -> str | None:
    v = args.get(name)
    if v is None:
        return None
    if isinstance(v, bytes | bytearray):
        v = bytes(v).decode("utf-8", "replace")
    if not isinstance(v, str):
        raise ChannelException(
            PRECONDITION_FAILED, f"invalid arg '{name}' for queue '{queue}': {v!r} is no string"
        )
    return v


def queue_options(
    args: Mapping[str, Any],
    names: VhostNames,
    queue: str,
    *,
    durable: bool,
    exclusive: bool,
    exclusive_ttl: float,
) -> dict[str, Any]:
    """The core declare options of an AMQP queue."""
    options: dict[str, Any] = {"durable": durable and not exclusive}
    ttl = _int(args, "x-message-ttl", 0, queue, _MAX_MS)
    if ttl is not None:
        options["message_ttl"] = max(ttl, 1) / 1000.0
    expires = _int(args, "x-expires", 1, queue, _MAX_MS)
    if expires is not None:
        options["idle_ttl"] = expires / 1000.0
    elif exclusive:  # a safety net: deleted with its connection, or by the core if we die
        options["idle_ttl"] = exclusive_ttl
    max_length = _int(args, "x-max-length", 0, queue)
    if max_length == 0:
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-max-length' for queue '{queue}': polymq queues hold at least 1",
        )
    max_bytes = _int(args, "x-max-length-bytes", 1, queue)
    if max_length is not None:
        options["max_length"] = max_length
    if max_bytes is not None:
        options["max_bytes"] = max_bytes
    overflow = _str(args, "x-overflow", queue)
    if overflow is None:
        if max_length is not None or max_bytes is not None:
            options["overflow"] = "drop-oldest"
    elif overflow == "drop-head":
        options["overflow"] = "drop-oldest"
    elif overflow in ("reject-publish", "reject-publish-dlx"):
        options["overflow"] = "reject"
    else:
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-overflow' for queue '{queue}': {overflow!r} is not drop-head, "
            "reject-publish or reject-publish-dlx",
        )
    dlx = _str(args, "x-dead-letter-exchange", queue)
    dlrk = _str(args, "x-dead-letter-routing-key", queue)
    if dlrk is not None and dlx is None:
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-dead-letter-routing-key' for queue '{queue}': "
            "x-dead-letter-routing-key is set, but x-dead-letter-exchange is not",
        )
    if dlx is not None:
        key = dlrk if dlrk is not None else queue
        try:
            if dlx == "":
                options["dead_letter"] = names.queue(key)
            else:
                topic = names.publish_topic(dlx, key)
                if topic is None:
                    raise UnmappableName("dead-letter routing key too long")
                options["dead_letter"] = topic
        except UnmappableName as exc:
            raise ChannelException(
                PRECONDITION_FAILED, f"invalid dead-lettering for queue '{queue}': {exc}"
            ) from None
    limit = _int(args, "x-delivery-limit", 0, queue)
    if limit is not None:
        options["max_deliveries"] = limit + 1
    priority = _int(args, "x-max-priority", 0, queue)
    if priority is not None and priority > 255:
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-max-priority' for queue '{queue}': {priority} is above 255",
        )
    options["max_priority"] = 0 if priority is None else priority
    qtype = _str(args, "x-queue-type", queue)
    if qtype is not None and qtype not in ("classic", "quorum"):
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-queue-type' for queue '{queue}': {qtype!r} is not supported "
            "(classic and quorum are)",
        )
    if qtype == "quorum" and (exclusive or not durable):
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-queue-type' for queue '{queue}': quorum queues are durable "
            "and not exclusive",
        )
    sac = args.get("x-single-active-consumer")
    if sac not in (None, False):
        raise ChannelException(
            PRECONDITION_FAILED,
            f"invalid arg 'x-single-active-consumer' for queue '{queue}': single active "
            "consumers are not supported",
        )
    return options
