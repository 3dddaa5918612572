"""The queues a SUBSCRIBE makes, as RabbitMQ's STOMP plugin makes them.

**Queue arguments.** ``x-`` headers of a SUBSCRIBE are the arguments of the queue it
declares (RabbitMQ's names and units), translated into the core's declare options:

=============================  ===============================================================
``x-max-length``               ``max_length`` (messages)
``x-max-length-bytes``         ``max_bytes``
``x-overflow``                 ``drop-head`` (the default) or ``reject-publish``
``x-message-ttl``              ``message_ttl`` (milliseconds in, seconds at the core)
``x-expires``                  ``idle_ttl`` (milliseconds in, seconds at the core)
``x-max-priority``             ``max_priority`` (0..9 at the core; more counts as 9)
``x-dead-letter-exchange``     ``dead_letter``: ``""`` (with ``x-dead-letter-routing-key``) is
                               a queue, ``amq.topic`` a topic, ``amq.direct`` a queue
=============================  ===============================================================

A ``/queue/`` SUBSCRIBE with any of them declares its queue with them first (a queue that
exists with other options is refused by the core, as RabbitMQ refuses it). A dead-letter
target needs the user's write permission there, as a SEND there would (an ERROR frame
otherwise), and the core dead-letters only while that user may still write there
(``polymq_server.auth.deadletter``).

**The queue behind a topic subscription.** A ``/topic/`` (or ``/exchange/amq.topic/``)
SUBSCRIBE is served by a queue bound to its topic (pattern), whose messages wait there for
the subscriber, when it asks for one:

- ``durable: true`` (or the older ``persistent: true``) with ``auto-delete: false``: a durable
  queue named after the connection's ``client-id`` (CONNECT header, none if absent) and the
  subscription ``id``, kept while the subscriber is away; whoever subscribes again with the
  same client-id and id gets what was published meanwhile, and several connections with
  them share its messages. A plain UNSUBSCRIBE keeps it (a SUBSCRIBE again gets its
  RECEIPT, then what came meanwhile); UNSUBSCRIBE with ``durable: true`` (or
  ``persistent: true``) deletes it. ``durable: true``
  without an ``id`` header is ERROR ``Missing Header``. (RabbitMQ deletes a durable
  subscription's queue when it ends unless ``auto-delete: false``; so does polymq.)
- ``x-queue-name``: that queue (durable if asked as above, else deleted when the
  subscription ends); on ``/exchange/<E>/K`` it is bound to E with key K (AMQP's binding:
  a publish there, from AMQP or a STOMP SEND to the same destination, or to the default
  exchange with the queue's name, reaches it), as RabbitMQ makes it;
- ``ack: client`` or ``client-individual`` with a ``prefetch-count`` (or ``prefetch``): a
  private queue, so that deliveries wait for acknowledgements (flow control) rather than
  end the subscription with a slow-consumer ERROR (unless the SUBSCRIBE has polymq's own
  ``x-slow-policy``: then the window stays the slow-consumer bound). It holds at most
  ``stomp_buffer_messages`` messages / ``stomp_buffer_bytes`` bytes (dropping the oldest)
  unless ``x-`` arguments say otherwise, and goes with the subscription.

Other topic subscriptions take messages straight from the topic (nothing kept for them).
MESSAGE frames of a queue-backed subscription name the topic each message was sent to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from polymq.types import MAX_PRIORITY, AckMode, Overflow
from polymq_server.names import UnmappableName, VhostNames

from .config import StompSettings
from .destinations import Target
from .frames import Frame
from .messages import parse_int
from .refusal import Refused

__all__ = ["Backing", "backing_queue", "durable_asked", "queue_arguments"]

_TRUE: Final = frozenset({"true", "1", "yes"})
_OVERFLOWS: Final = {"drop-head": Overflow.DROP_OLDEST, "reject-publish": Overflow.REJECT}
_BIG: Final = 1 << 62


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def durable_asked(frame: Frame) -> bool:
    """``durable: true`` or ``persistent: true`` (RabbitMQ's older name)."""
    return _true(frame.get("durable")) or _true(frame.get("persistent"))


def _ms(name: str, raw: str) -> float:
    return parse_int(name, raw, 0, _BIG) / 1000.0


def queue_arguments(frame: Frame, vhost_prefix: str) -> dict[str, Any]:
    """The core declare options the ``x-`` headers of ``frame`` ask for (see the table)."""
    out: dict[str, Any] = {}
    raw = frame.get("x-max-length")
    if raw is not None:
        out["max_length"] = parse_int("x-max-length", raw, 0, _BIG)
    raw = frame.get("x-max-length-bytes")
    if raw is not None:
        out["max_bytes"] = parse_int("x-max-length-bytes", raw, 0, _BIG)
    raw = frame.get("x-overflow")
    if raw is not None:
        overflow = _OVERFLOWS.get(raw.strip())
        if overflow is None:
            raise Refused(
                "header", "Invalid header", f"x-overflow: {raw[:40]!r}: drop-head or reject-publish"
            )
        out["overflow"] = overflow.value
    elif "max_length" in out or "max_bytes" in out:
        out["overflow"] = Overflow.DROP_OLDEST.value  # RabbitMQ's default
    raw = frame.get("x-message-ttl")
    if raw is not None:
        out["message_ttl"] = _ms("x-message-ttl", raw)
    raw = frame.get("x-expires")
    if raw is not None:
        out["idle_ttl"] = max(_ms("x-expires", raw), 0.001)
    raw = frame.get("x-max-priority")
    if raw is not None:
        out["max_priority"] = min(parse_int("x-max-priority", raw, 0, 255), MAX_PRIORITY)
    raw = frame.get("x-dead-letter-exchange")
    if raw is not None:
        out["dead_letter"] = _dead_letter(raw, frame.get("x-dead-letter-routing-key"), vhost_prefix)
    return out


def _dead_letter(exchange: str, key: str | None, vhost_prefix: str) -> str:
    kinds = {"": "queue", "amq.direct": "queue", "amq.topic": "topic"}
    kind = kinds.get(exchange)
    if kind is None or not key:
        raise Refused(
            "header",
            "Invalid header",
            f"x-dead-letter-exchange: {exchange[:60]!r}: this frontend dead-letters to the "
            "default exchange, amq.direct or amq.topic, with an x-dead-letter-routing-key",
        )
    return f"{kind}/{vhost_prefix}{key}"


@dataclass(frozen=True, slots=True)
class Backing:
    """The queue behind one topic subscription."""

    core: str  # "queue/..."
    keep: bool  # outlives the subscription (durable, auto-delete: false)
    options: dict[str, Any]  # for the core's declare


def backing_queue(
    frame: Frame,
    target: Target,
    mode: AckMode,
    *,
    sid: str,
    client_id: str,
    vhost: str,
    private: str,
    settings: StompSettings,
    arguments: dict[str, Any],
) -> Backing | None:
    """The queue a topic SUBSCRIBE asks for, if any; ``private`` names a private one."""
    keep = durable_asked(frame) and (frame.get("auto-delete") or "").strip().lower() == "false"
    named = frame.get("x-queue-name")
    if named is None and keep:
        named = f"stomp-subscription-{client_id}-{sid}"
    if named is not None:
        try:
            core = VhostNames(vhost).queue(named)
        except UnmappableName as exc:
            raise Refused("header", "Invalid header", f"x-queue-name: {exc}") from None
        options = {"durable": keep, **arguments}
        if not keep:
            options.setdefault("idle_ttl", settings.stomp_temp_queue_ttl)
        return Backing(core, keep, options)
    flow = (
        mode is not AckMode.AUTO
        and ("prefetch-count" in frame or "prefetch" in frame)
        and "x-slow-policy" not in frame  # polymq's own: the window bounds a plain topic one
    )
    if not flow and not durable_asked(frame):
        return None
    options = {
        "durable": False,
        "idle_ttl": settings.stomp_temp_queue_ttl,  # in case this frontend dies first
        "max_length": settings.stomp_buffer_messages,
        "max_bytes": settings.stomp_buffer_bytes,
        "overflow": Overflow.DROP_OLDEST.value,
        **arguments,
    }
    return Backing(private, False, options)
