"""Client connections as the operator sees them: each frontend's table of its own, and how a
core's admin API asks every frontend for it.

Frontends share one link to the core, so the core sees them and not their clients. Each
frontend (and the core, for its own wire clients) keeps a :class:`ConnectionTable`: its
sessions :meth:`~ConnectionTable.open` an entry when a client connects, update its user and
counters as they go, and :meth:`~ConnectionTable.close` it at the end. An entry's id starts
with the table's instance id (``stomp-1f2e3d4c.17``), so that the owner of any id is known.

The request/reply, over two system topics (the MailerQ ``list-cluster`` way)::

    admin ── topic/system.connections.list  {"reply_to"?}           ──▶ every frontend
          ◀── its reply_to topic: {"frontend", "protocol", "node", "connections": [..]}
    admin ── topic/system.connections.close {"id"}                  ──▶ every frontend
          ◀── the owner alone: {"frontend", "id", "closed": true}

A request message carries the topic to answer on in its ``reply_to`` (and a
``correlation_id`` the answer repeats), one of :data:`REPLY_TOPICS`: a frontend answers
nowhere else (its link may write where the asker may not), and only polymq's own links and
administrators may publish a request (``system.*`` is reserved:
:mod:`polymq_server.auth.principals`). :class:`Responder` is the frontend's side, subscribed
on each connection of its :class:`~polymq_server.link.corelink.CoreLink`; the asking side is the
core's
(``polymq_core.connlist``). Topics cross a cluster's mesh, so any node lists every frontend.

A users reload reaches every open connection through its table too
(:meth:`ConnectionTable.recheck`).

Nothing here imports aiohttp or prometheus: the table is plain data, the responder speaks
through a :class:`~polymq.client.Client`.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from polymq.errors import PolymqError
from polymq.types import Message

from ..names import REPLY_TOPICS, from_core

if TYPE_CHECKING:
    from polymq.client import Client, Subscription

    from ..auth.principals import Principal

__all__ = [
    "CLOSE_TOPIC",
    "LIST_TOPIC",
    "PROTOCOLS",
    "REPLY_TOPICS",
    "ConnectionTable",
    "Responder",
    "Tracked",
    "instance_id",
    "node_of",
    "revoked",
]

log = logging.getLogger(__name__)

LIST_TOPIC = "system.connections.list"
CLOSE_TOPIC = "system.connections.close"
PROTOCOLS = ("stomp", "stomp-ws", "amqp", "http", "longpoll", "avro", "native")
_JSON = "application/json"


def instance_id(service: str) -> str:
    """A new instance id for frontend ``service``: ``stomp-1f2e3d4c``."""
    return f"{service}-{secrets.token_hex(4)}"


@dataclass(eq=False, slots=True)
class Tracked:
    """One client connection. Its session updates ``user``, ``vhost`` and the counters;
    ``counts`` (if given) says how many subscriptions (and channels) it has right now;
    ``closer(reason)`` closes it with its protocol's close (STOMP ERROR, AMQP
    ``connection.close`` 320, ...); ``recheck()`` (if given) has it check its login again
    after a users reload (:meth:`ConnectionTable.recheck`)."""

    id: str
    protocol: str
    peer: str
    closer: Callable[[str], None]
    counts: Callable[[], dict[str, int]] | None = None
    recheck: Callable[[], None] | None = None
    user: str | None = None
    vhost: str | None = None
    client: str | None = None  # what the client calls itself, where its protocol says
    messages_in: int = 0
    messages_out: int = 0
    connected_at: float = field(default_factory=time.time)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "protocol": self.protocol,
            "peer": self.peer,
            "user": self.user,
            "subscriptions": 0,
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
            "connected_at": round(self.connected_at, 3),
        }
        if self.vhost is not None:
            out["vhost"] = self.vhost
        if self.client is not None:
            out["client"] = self.client
        if self.counts is not None:
            out.update(self.counts())
        return out


class ConnectionTable:
    """The client connections of one frontend instance (``id``), by connection id."""

    def __init__(self, id: str, service: str) -> None:
        self.id = id
        self.service = service
        self.entries: dict[str, Tracked] = {}
        self._numbers = itertools.count(1)

    def __len__(self) -> int:
        return len(self.entries)

    def open(
        self,
        protocol: str,
        peer: str,
        closer: Callable[[str], None],
        counts: Callable[[], dict[str, int]] | None = None,
    ) -> Tracked:
        entry = Tracked(f"{self.id}.{next(self._numbers)}", protocol, peer, closer, counts)
        self.entries[entry.id] = entry
        return entry

    def close(self, entry: Tracked) -> None:
        """The connection is gone (closing one twice is no error)."""
        self.entries.pop(entry.id, None)

    def owns(self, conn_id: str) -> bool:
        return conn_id.rpartition(".")[0] == self.id

    def describe(self) -> list[dict[str, Any]]:
        return [entry.describe() for entry in list(self.entries.values())]

    def shut(self, conn_id: str, reason: str) -> bool:
        """Close connection ``conn_id`` with ``reason``; False if this table has none such."""
        entry = self.entries.get(conn_id)
        if entry is None:
            return False
        entry.closer(reason)
        return True

    def recheck(self) -> None:
        """The users were reloaded: every connection checks its login again (one that lost
        it is closed with its protocol's error; one whose grants changed goes on with the
        new ones, and loses the subscriptions they no longer allow)."""
        for entry in list(self.entries.values()):
            if entry.recheck is None:
                continue
            try:
                entry.recheck()
            except Exception:  # pragma: no cover - one session's bug must not spare the others
                log.exception("%s: %s: checking its login again failed", self.id, entry.id)

    def answer(self, node: str) -> dict[str, Any]:
        """What this table answers to a list request (``node``: the core it reaches)."""
        rows = self.describe()
        for row in rows:
            row.setdefault("frontend", self.id)
            row.setdefault("node", node)
        return {
            "frontend": self.id,
            "protocol": self.service,
            "node": node,
            "connections": rows,
        }


def revoked(principal: Principal) -> str:
    """Why a session whose login a users reload took away is closed (its protocol's error
    carries it)."""
    if principal.anonymous:
        return "anonymous access was turned off by a users reload: log in"
    return (
        f"user {principal.name[:100]!r} was removed, or the password or token it logged in "
        "with changed, by a users reload: log in again"
    )


def node_of(client: Client) -> str:
    """The node name a client's core gave in its Welcome (``polymq-core/<node>``)."""
    return client.server.removeprefix("polymq-core/")


def _request(message: Message) -> dict[str, Any] | None:
    try:
        body = json.loads(message.body) if message.body else {}
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class Responder:
    """A frontend's answers to the list and close requests, on ``client`` (one of its link's
    connections), for ``table``. :meth:`start` subscribes to both topics."""

    def __init__(self, client: Client, table: ConnectionTable) -> None:
        self.client = client
        self.table = table

    async def start(self) -> None:
        await self.client.subscribe(f"topic/{LIST_TOPIC}", listener=self)
        await self.client.subscribe(f"topic/{CLOSE_TOPIC}", listener=self)

    def on_deliver(self, sub: Subscription, tags: list[int], messages: list[Message]) -> None:
        for message in messages:
            request = _request(message)
            if request is None or not str(message.reply_to or "").startswith(REPLY_TOPICS):
                continue
            if not from_core(message.headers):  # (only polymq's own may ask: names.ORIGIN)
                continue
            if sub.destination.endswith(LIST_TOPIC):
                answer = self.table.answer(node_of(self.client))
            else:
                conn_id = request.get("id")
                if not isinstance(conn_id, str) or not self.table.owns(conn_id):
                    continue
                reason = str(request.get("reason") or "closed by an administrator")[:200]
                closed = self.table.shut(conn_id, reason)
                answer = {"frontend": self.table.id, "id": conn_id, "closed": closed}
            self._reply(message, answer)

    def _reply(self, request: Message, answer: dict[str, Any]) -> None:
        reply = Message(json.dumps(answer).encode(), _JSON, correlation_id=request.correlation_id)
        try:
            self.client.publish_nowait(str(request.reply_to), [reply])
        except PolymqError as exc:  # (the connection is closing)
            log.debug("connections: cannot answer %s: %s", request.reply_to, exc)

    def on_end(self, sub: Subscription, error: BaseException) -> None:
        pass  # the connection is gone: the link's next one subscribes again
