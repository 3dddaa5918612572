"""AMQP names and the core's, both ways: vhosts, exchanges, queues and routing keys.

Shared by the frontends that have virtual hosts: AMQP maps all of this; STOMP maps its
``host`` header (a vhost) with :attr:`VhostNames.prefix`, so that STOMP's ``/queue/x`` in
vhost ``v`` is AMQP's queue ``x`` in vhost ``v``.

The core's names are dot-separated segments of ``[A-Za-z0-9_:-]`` (at most 255 bytes);
AMQP's are almost any text. Each AMQP word is escaped into one core segment, reversibly:

- letters, digits, ``_`` and ``-`` stand for themselves;
- any other character is ``:`` and two upper-case hex digits per UTF-8 byte
  (``:`` itself is ``:3A``, a space ``:20``, ``é`` ``:C3:A9``);
- the empty word is a lone ``:`` (so ``a..b`` and a routing key ``""`` have segments too).

A routing key or queue name is split on ``.`` and each word escaped (:func:`escape_key`);
an exchange name or vhost becomes a single segment (:func:`escape_word`, its dots escaped).

======================================  ================================================
AMQP                                    core
======================================  ================================================
queue ``Q`` in vhost ``/``              ``queue/<Q>`` (``orders`` is ``queue/orders``:
                                        the queue STOMP's ``/queue/orders`` and HTTP use)
queue ``Q`` in vhost ``v``              ``queue/amqp:v<v>.<Q>``
exchange ``E`` in vhost ``/``           topics ``amqp.<E>.…``
exchange ``E`` in vhost ``v``           topics ``amqp:v<v>.<E>.…``
publish to ``E`` with key ``K``         ``topic/amqp.<E>.<K>``
``amq.topic`` in vhost ``/``, key ``K``  ``topic/<K>`` (the shared topic namespace)
``amq.topic`` in vhost ``v``, key ``K``  ``topic/amqp:v<v>.<K>``
default exchange, key ``K``             ``queue/<K>``
======================================  ================================================

``amq.topic`` (:data:`SHARED_TOPIC_EXCHANGE`) is the one exchange without a namespace of its
own: its topics are the vhost's plain ones, so that AMQP's ``amq.topic`` with key ``K``,
STOMP's ``/topic/K`` and ``/exchange/amq.topic/K``, and topic ``K`` of the HTTP, long-poll,
SSE and Avro frontends and of the native client are one topic, patterns included (AMQP's
``*`` and ``#`` are the core's). As in RabbitMQ, a binding ``#`` on ``amq.topic`` hears
every topic of the shared namespace; unlike RabbitMQ, that includes the topics of the other
exchanges (``amqp.<E>.…``), which live in it too. The broker's own ``system.…`` topics
are reached only by patterns that name ``system`` (``polymq_core.topics.trie``).

**Reserved names** (:func:`reserved`): what polymq uses for itself, whatever a user's grants
say. Every destination (topic, queue, stream, channel, and a topic pattern) whose first
segment is one of :data:`RESERVED_SEGMENTS`: ``system`` (``system.config``, ``system.peers``,
``system.alarms``, ``system.connections.*``) and ``amqp-reply`` (the channels of AMQP's
direct reply-to, ``topic/amqp-reply.<token>``: see ``polymq_amqp.replyto``); a prefix
pattern such as ``system*`` names it too. And the queues whose first segment is
:data:`TEMP_SEGMENT`, STOMP's temporary queues (``queue/tmp.<connection>.<name>``): the
STOMP connection that made one uses it on its grants; anyone else may only write a reply to
one by its exact name (a request's ``reply-to``), never read, declare or purge it. (The
key/value keys of the AMQP frontends' records, ``kv/amqp/...``, are not reserved: a ``kv/``
grant is how a frontend's own core login is narrowed to one vhost, see
:mod:`polymq_server.auth.provider`.)

What the core itself publishes on the reserved topics the frontends follow (reloads, alarms,
the admin API's connection requests) carries the header :data:`ORIGIN` (``core``,
:func:`core_headers`); the core takes that header off every message any other client
publishes, and the frontends obey a control message only if it has it (:func:`from_core`):
an administrator's publish on ``system.config`` reloads nothing.

``:v`` can never come out of escaping (``v`` is no hex digit), so another vhost's names can
never collide with those of ``/``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

__all__ = [
    "DEFAULT_VHOST",
    "ORIGIN",
    "REPLY_SEGMENT",
    "REPLY_TOPICS",
    "RESERVED_SEGMENTS",
    "SHARED_TOPIC_EXCHANGE",
    "TEMP_SEGMENT",
    "UnmappableName",
    "VhostNames",
    "core_headers",
    "escape_key",
    "escape_pattern",
    "escape_word",
    "from_core",
    "reply_target",
    "reserved",
    "unescape_key",
    "unescape_word",
]

DEFAULT_VHOST: Final = "/"
SHARED_TOPIC_EXCHANGE: Final = "amq.topic"
MAX_CORE_NAME: Final = 255
_PLAIN: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_PLAIN_RE: Final = re.compile(r"[A-Za-z0-9_\-]+\Z")
_ESCAPED_RE: Final = re.compile(r":([0-9A-F]{2})")
REPLY_SEGMENT: Final = "amqp-reply"  # the first segment of direct reply-to channels
RESERVED_SEGMENTS: Final = frozenset({"system", REPLY_SEGMENT})
# the first segment of STOMP's temporary queues (``queue/tmp.<connection>.<name>``): private
# to the connection that made them; others may only write a reply to one by its name
TEMP_SEGMENT: Final = "tmp"
# where frontends answer the core's connection requests, and nowhere else (.connections)
REPLY_TOPICS: Final = "topic/system.connections.reply."
_KINDS: Final = frozenset({"queue", "topic", "stream", "channel"})
ORIGIN: Final = "polymq-origin"  # the header of what the core itself publishes (docstring)
_CORE: Final = "core"


def core_headers() -> dict[str, str]:
    """The headers of a message the core itself publishes on a reserved topic."""
    return {ORIGIN: _CORE}


def from_core(headers: Mapping[str, Any]) -> bool:
    """Did the core itself publish the message with ``headers`` (not a client)?"""
    return headers.get(ORIGIN) == _CORE


def reserved(destination: str) -> str | None:
    """The reserved segment (``"system"``, ``"amqp-reply"``, a queue's ``"tmp"``) that
    ``destination`` (``kind/name`` or a topic pattern) falls in; None if it is not one of
    polymq's own names (module docstring)."""
    kind, slash, name = destination.partition("/")
    if not slash or kind not in _KINDS:
        return None
    first = name.partition(".")[0]
    if kind == "queue" and first == TEMP_SEGMENT:  # (a queue's name is never a pattern)
        return TEMP_SEGMENT
    if first.endswith("*") and len(first) > 1:  # a prefix pattern: "system*"
        first = first[:-1]
    return first if first in RESERVED_SEGMENTS else None


def reply_target(reply_to: object) -> str | None:
    """``reply_to`` if it names a destination (``kind/name``) a responder, or polymq itself,
    would write its answer to: its sender must itself be allowed to write there (every
    frontend checks it, and the core for its wire clients); None for any other text."""
    if isinstance(reply_to, str) and reply_to.partition("/")[0] in _KINDS:
        return reply_to
    return None


class UnmappableName(ValueError):
    """A name that cannot be mapped (too long once escaped, or not a core name)."""


@lru_cache(maxsize=4096)  # every publish maps its names: the same few, many times
def escape_word(word: str) -> str:
    """One AMQP word (no meaning given to dots) as one core segment."""
    if not word:
        return ":"
    if _PLAIN_RE.match(word):
        return word
    out: list[str] = []
    for ch in word:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f":{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def unescape_word(segment: str) -> str:
    """The AMQP word behind one core segment (the inverse of :func:`escape_word`)."""
    if segment == ":":
        return ""
    if ":" not in segment:
        return segment
    out = bytearray()
    i = 0
    n = len(segment)
    while i < n:
        ch = segment[i]
        if ch == ":" and _ESCAPED_RE.match(segment, i):
            out.append(int(segment[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(ch.encode("utf-8"))
            i += 1
    try:
        return out.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # not escaped by us (a name from another protocol)
        return out.decode("utf-8", "replace")


@lru_cache(maxsize=4096)
def escape_key(key: str) -> str:
    """A dotted AMQP name (routing key, queue name): each word escaped, dots kept."""
    if _PLAIN_RE.match(key.replace(".", "_")) and not _has_empty_word(key):
        return key
    return ".".join(escape_word(w) for w in key.split("."))


def unescape_key(name: str) -> str:
    return ".".join(unescape_word(s) for s in name.split("."))


def escape_pattern(key: str) -> str:
    """A topic exchange binding key as a core pattern: ``*`` and ``#`` words kept."""
    return ".".join(w if w in ("*", "#") else escape_word(w) for w in key.split("."))


def _has_empty_word(key: str) -> bool:
    return not key or key.startswith(".") or key.endswith(".") or ".." in key


def _check(name: str, what: str) -> str:
    if len(name.encode("utf-8")) > MAX_CORE_NAME:
        raise UnmappableName(
            f"{what} is too long once mapped to the core's alphabet "
            f"({len(name.encode())} > {MAX_CORE_NAME} bytes)"
        )
    return name


class VhostNames:
    """The core names of one vhost's queues and exchanges."""

    __slots__ = ("_queue_prefix", "_topic_prefix", "vhost")

    def __init__(self, vhost: str) -> None:
        self.vhost = vhost
        if vhost == DEFAULT_VHOST:
            self._queue_prefix = ""
            self._topic_prefix = "amqp."
        else:
            seg = "amqp:v" + escape_word(vhost)
            self._queue_prefix = seg + "."
            self._topic_prefix = seg + "."

    @property
    def prefix(self) -> str:
        """What starts the core name of each of this vhost's queues and exchange topics:
        ``""`` for ``/``, else ``amqp:v<vhost>.``."""
        return self._queue_prefix

    @property
    def key(self) -> str:
        """The vhost as one segment, for key/value keys."""
        return escape_word(self.vhost)

    # ---- queues ----------------------------------------------------------------------------
    def queue(self, name: str) -> str:
        """``queue/<...>`` of the AMQP queue ``name``; UnmappableName if too long."""
        return "queue/" + _check(self._queue_prefix + escape_key(name), f"queue name {name!r}")

    def queue_of(self, core: str) -> str | None:
        """The AMQP name of a core queue destination of this vhost (None if not one)."""
        if not core.startswith("queue/"):
            return None
        rest = self._local(core[6:])
        return None if rest is None else unescape_key(rest)

    def _local(self, name: str) -> str | None:
        """``name`` (a core name after its kind) without this vhost's prefix; None if it
        belongs to another vhost."""
        if self._queue_prefix:
            if not name.startswith(self._queue_prefix):
                return None
            return name[len(self._queue_prefix) :]
        return None if name.startswith("amqp:v") else name

    # ---- exchanges -------------------------------------------------------------------------
    def _topics_of(self, exchange: str) -> str:
        """What starts the names of the topics of ``exchange`` (ends with ``.``, or ``""``
        for ``amq.topic`` in ``/``)."""
        if exchange == SHARED_TOPIC_EXCHANGE:
            return self._queue_prefix
        return f"{self._topic_prefix}{escape_word(exchange)}."

    def exchange_base(self, exchange: str) -> str:
        """``amqp.<E>``: the topic namespace of exchange ``exchange`` (for ``amq.topic``,
        the vhost's shared one: ``""`` in ``/``)."""
        return self._topics_of(exchange)[:-1]

    def publish_topic(self, exchange: str, routing_key: str) -> str | None:
        """``topic/amqp.<E>.<K>`` for a publish (``topic/<K>`` for ``amq.topic``); None
        when too long for the core (no binding can name it exactly, and a pattern would need
        the name to exist)."""
        name = self._topics_of(exchange) + escape_key(routing_key)
        if len(name.encode("utf-8")) > MAX_CORE_NAME:
            return None
        return "topic/" + name

    def binding_topic(self, exchange: str, pattern: str) -> str:
        """``topic/amqp.<E>.<pattern>`` (``pattern`` already in the core's form)."""
        return "topic/" + _check(
            self._topics_of(exchange) + pattern, f"binding key for exchange {exchange!r}"
        )

    def route_of(self, topic: str) -> tuple[str, str] | None:
        """``(exchange, routing key)`` of a core topic in this vhost: an exchange's
        namespace, else the shared one (``amq.topic``). None for another vhost's topics."""
        if topic.startswith("topic/" + self._topic_prefix):
            rest = topic[6 + len(self._topic_prefix) :]
            seg, _, key = rest.partition(".")
            if seg:
                return unescape_word(seg), unescape_key(key) if key else ""
        if not topic.startswith("topic/"):
            return None
        shared = self._local(topic[6:])
        return None if shared is None else (SHARED_TOPIC_EXCHANGE, unescape_key(shared))
