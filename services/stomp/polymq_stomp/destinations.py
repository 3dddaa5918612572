"""STOMP destinations and the core's, both ways.

=================================  ============================  ===========================
STOMP                              core                          notes
=================================  ============================  ===========================
``/queue/x``                       ``queue/x``
``/topic/x``                       ``topic/x``                   SUBSCRIBE may use ``*``,
                                                                 ``#`` and a trailing ``*``
``/stream/x``                      ``stream/x``                  ``x-stream-offset`` header
``/temp-queue/x``                  ``queue/tmp.<conn-id>.x``     private to the connection,
                                                                 deleted when it closes
``/amq/queue/x``                   ``queue/x``                   RabbitMQ
``/exchange/amq.topic/<key>``      ``topic/<key>``               RabbitMQ
``/exchange/<E>[/<key>]``          an :class:`ExchangeRef`:      RabbitMQ; ``exchange.py``
                                   where AMQP's exchange ``E``   finds its type (any) and
                                   routes (SEND), the topics it  routes SENDs as AMQP
                                   routes in (SUBSCRIBE)
                                   (``polymq_server.exchanges.resolution``)
``/control/count-msgs/queue/x``    stats of ``queue/x``          ocamlmq, SEND only
``/control/count-subscribers/...`` stats of ``queue/x``,         ocamlmq, SEND only
                                   ``topic/x``, ``stream/x``
=================================  ============================  ===========================

``/exchange/amq.direct/<key>`` is an exchange like the others, as in RabbitMQ and AMQP: a
SEND reaches the queues bound to amq.direct with that key (a SUBSCRIBE's to the same
destination, with or without ``x-queue-name``: ``queues.py``), not the queue ``<key>``, which
is the default exchange's (``/queue/<key>``, ``/amq/queue/<key>``).

In a vhost other than ``/`` (the CONNECT frame's ``host`` header, see ``vhost.py``) every
core name but a temp queue's starts with that vhost's prefix (``amqp:v<vhost>.``, the one
AMQP gives the vhost's queues: :attr:`polymq_server.names.VhostNames.prefix`), so that vhosts
never share a destination.

Names are the core's (:func:`polymq.types.Destination.parse`): letters, digits, ``_ . : -``;
a ``/`` inside a name has no meaning in the core and is refused, as is anything else. Every
refusal is a :class:`~polymq_stomp.refusal.Refused` (reason ``destination``), in RabbitMQ's
words where RabbitMQ refuses the same (its ``rabbit_routing_util:parse_endpoint``): no
destination header is ``Missing destination``; ``/queue``, ``/topic``, ``/amq/queue``,
``/temp-queue`` (and ``/stream``) followed by anything but ``/<name>``, and ``/exchange``
by anything but ``/<name>`` or ``/<name>/<key>``, are ``Invalid destination`` ``'<what
follows>' is not a valid <queue|topic|amqqueue|temp_queue|exchange> destination``; any other
prefix is ``Unknown destination``. A name the core cannot take is ``Invalid destination``
in polymq's words, which name the forms accepted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from polymq.errors import BadRequest
from polymq.types import Destination, Kind

from .refusal import Refused

__all__ = [
    "ACCEPTED",
    "Control",
    "ControlOp",
    "ExchangeRef",
    "Target",
    "from_core",
    "parse_destination",
    "temp_queue_name",
]

ACCEPTED = (
    "Valid destinations are: /queue/<name>, /topic/<name or pattern>, /stream/<name>, "
    "/temp-queue/<name>, /amq/queue/<name>, /exchange/amq.topic/<key>, "
    "/exchange/<exchange>[/<key>], and for SEND with a receipt "
    "/control/count-msgs/queue/<name>, "
    "/control/count-subscribers/queue/<name> or /control/count-subscribers/topic/<name>; "
    "names use letters, digits, '_', '.', ':' and '-'"
)


class ControlOp(enum.Enum):
    COUNT_MESSAGES = "count-msgs"
    COUNT_SUBSCRIBERS = "count-subscribers"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a STOMP destination leads in the core."""

    core: str  # "queue/x"
    kind: Kind
    stomp: str  # as the client wrote it
    temp: bool = False  # a /temp-queue of this connection
    topic_prefix: str = "/topic/"  # how MESSAGE frames name the topic a message came from
    vhost_prefix: str = ""  # what starts the core names of the connection's vhost
    routed: bool = False  # a queue behind a topic subscription (see queues.py)
    exchange: str | None = None  # the topics of this AMQP exchange (see exchange.py)
    routing_key: str | None = None  # a SEND's to ``exchange``: routed per message there

    @property
    def is_pattern(self) -> bool:
        return self.kind is Kind.TOPIC and ("*" in self.core or "#" in self.core)

    @property
    def per_message(self) -> bool:
        """Do MESSAGE frames name each message's own destination (a pattern's topic, the
        topic a message came through into a queue behind a subscription)?"""
        return (
            self.routed
            or self.is_pattern
            or self.exchange is not None
            or (self.kind is Kind.TOPIC and not self.stomp.startswith(self.topic_prefix))
        )


@dataclass(frozen=True, slots=True)
class ExchangeRef:
    """``/exchange/<name>[/<key>]`` of an exchange other than amq.topic: a
    :class:`Target` once its type is known (``exchange.py``)."""

    name: str
    key: str
    stomp: str


@dataclass(frozen=True, slots=True)
class Control:
    """An ocamlmq control destination: answered in the RECEIPT of a SEND."""

    op: ControlOp
    core: str  # the destination to count
    kind: Kind


def temp_queue_name(conn_id: str, name: str) -> str:
    return f"queue/tmp.{conn_id}.{name}"


_PREFIXES: tuple[tuple[str, Kind, str], ...] = (
    ("/queue/", Kind.QUEUE, ""),
    ("/topic/", Kind.TOPIC, "/topic/"),
    ("/stream/", Kind.STREAM, ""),
    ("/amq/queue/", Kind.QUEUE, ""),
    ("/exchange/amq.topic/", Kind.TOPIC, "/topic/"),  # MESSAGE frames say /topic/, as RabbitMQ
)


# The prefixes RabbitMQ checks the shape of (its name for each, in its errors), and polymq's
# /stream: ``<prefix>/<name>`` (an exchange: ``<prefix>/<name>[/<key>]``) and nothing else.
_SHAPES: Final = (
    ("/queue", "queue"),
    ("/topic", "topic"),
    ("/exchange", "exchange"),
    ("/amq/queue", "amqqueue"),
    ("/temp-queue", "temp_queue"),
    ("/stream", "stream"),
)
_TYPES: Final = "/temp-queue, /exchange, /topic, /queue, /amq/queue, /stream, /control"


def _check_shape(destination: str) -> None:
    """Refuse, in RabbitMQ's words, a known prefix followed by a wrong number of parts."""
    for prefix, kind in _SHAPES:
        if destination != prefix and not destination.startswith(prefix + "/"):
            continue
        rest = destination[len(prefix) :]  # "" or "/..."
        parts = rest.split("/")[1:]
        if kind == "exchange":
            good = 1 <= len(parts) <= 2 and parts[0] != ""
        else:
            good = len(parts) == 1 and parts[0] != ""
        if not good:
            raise Refused(
                "destination",
                "Invalid destination",
                f"'{rest[:200]}' is not a valid {kind} destination\n",
            )
        return


def _refuse(destination: str, why: str) -> Refused:
    """RabbitMQ's ``Invalid destination`` (a known prefix, a name it cannot take)."""
    shown = destination[:200]
    return Refused(
        "destination",
        "Invalid destination",
        f"{shown!r} is not a valid destination: {why}.\n{ACCEPTED}",
    )


def _core(kind: Kind, name: str, stomp: str, *, pattern: bool) -> Destination:
    try:
        return Destination.parse(f"{kind.value}/{name}", pattern=pattern)
    except BadRequest as exc:
        if "/" in name:
            raise _refuse(stomp, f"a name cannot contain '/' (in {name[:100]!r})") from None
        raise _refuse(stomp, exc.message) from None


def parse_destination(
    destination: str | None,
    conn_id: str,
    *,
    pattern: bool = False,
    vhost_prefix: str = "",
    command: str = "SEND",
) -> Target | Control | ExchangeRef:
    """The core destination behind a STOMP one. ``pattern`` (SUBSCRIBE) admits topic
    wildcards; ``conn_id`` names this connection's temp queues; ``vhost_prefix`` starts the
    core names of the connection's vhost; ``command`` is named in errors."""
    if not destination:
        raise Refused(
            "destination",
            "Missing destination",
            f"\"{command}\" must include a 'destination' header\n",
        )
    _check_shape(destination)
    if destination.startswith("/temp-queue/"):
        name = destination[len("/temp-queue/") :]
        _core(Kind.QUEUE, name, destination, pattern=False)  # the client's part must be valid
        return Target(temp_queue_name(conn_id, name), Kind.QUEUE, destination, temp=True)
    if destination.startswith("/control/"):
        return _control(destination, vhost_prefix)
    for prefix, kind, topic_prefix in _PREFIXES:
        if destination.startswith(prefix):
            name = destination[len(prefix) :]
            wild = pattern and kind is Kind.TOPIC
            dest = _core(kind, name, destination, pattern=wild)
            if vhost_prefix:  # (checked without it first: errors name the client's name)
                dest = _core(kind, vhost_prefix + name, destination, pattern=wild)
            core = str(dest)
            if kind is Kind.TOPIC:
                return Target(
                    core, kind, destination, topic_prefix=topic_prefix, vhost_prefix=vhost_prefix
                )
            return Target(core, kind, destination, vhost_prefix=vhost_prefix)
    if destination.startswith("/exchange/"):
        name, _, key = destination[len("/exchange/") :].partition("/")
        return ExchangeRef(name, key, destination)
    raise Refused(
        "destination",
        "Unknown destination",
        f"'{destination[:200]}' is not a valid destination.\n"
        f"Valid destination types are: {_TYPES}.\n",
    )


def _control(destination: str, vhost_prefix: str) -> Control:
    rest = destination[len("/control/") :]
    op_s, _, target = rest.partition("/")
    try:
        op = ControlOp(op_s)
    except ValueError:
        raise _refuse(
            destination, "control destinations are count-msgs and count-subscribers"
        ) from None
    kind_s, _, name = target.partition("/")
    kinds = {"queue": Kind.QUEUE, "topic": Kind.TOPIC, "stream": Kind.STREAM}
    kind = kinds.get(kind_s)
    if kind is None or (op is ControlOp.COUNT_MESSAGES and kind is Kind.TOPIC):
        raise _refuse(
            destination,
            "count-msgs takes queue/<name> or stream/<name>; count-subscribers takes "
            "queue/<name>, topic/<name> or stream/<name>",
        )
    dest = _core(kind, vhost_prefix + name, destination, pattern=kind is Kind.TOPIC)
    return Control(op, str(dest), kind)


def from_core(core: str, conn_id: str | None = None, vhost_prefix: str = "") -> str | None:
    """The STOMP form of a core destination (``queue/x`` -> ``/queue/x``); this connection's
    temp queues come back as ``/temp-queue/x``. None if ``core`` is not one (or not one of
    the vhost whose names start with ``vhost_prefix``)."""
    kind, sep, name = core.partition("/")
    if not sep or not name:
        return None
    if kind == "queue" and conn_id is not None and name.startswith(f"tmp.{conn_id}."):
        return "/temp-queue/" + name[len(conn_id) + 5 :]
    if vhost_prefix:
        if not name.startswith(vhost_prefix):
            return None
        name = name[len(vhost_prefix) :]
    if kind == "queue":
        return "/queue/" + name
    if kind in ("topic", "stream"):
        return f"/{kind}/{name}"
    return None
