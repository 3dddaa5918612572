"""The delivery side of a STOMP subscription: the listener of one core subscription, the
acknowledgements it owes, and the MESSAGE frames made of what the core delivers.

One :class:`StompSubscription` per SUBSCRIBE is the :class:`polymq.client.DeliveryListener`
of its core subscription and counts what it delivered and what is acknowledged (the table of
ack modes is in ``subscription.py``, whose :class:`~polymq_stomp.subscription.Subscriptions`
handles the frames that make and settle them). The session's :class:`Deliveries` turns each
delivery into MESSAGE frames (``ack`` ids, per-message destinations, a topic's slow-consumer
bound) and hands them to the session's output buffer; with ``accept: application/json`` it
shows Avro records as JSON, holding deliveries in order while their schemas load.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from typing import TYPE_CHECKING, Protocol

from polymq.client import Subscription
from polymq.types import AckMode, Kind, Message
from polymq_server.messages.avro import SchemaCache
from polymq_server.messages.avroview import json_value, load_schemas, schema_of
from polymq_server.names import VhostNames

from .destinations import Target, from_core
from .exchange import shown
from .frames import Command, Frame, LocalStompError
from .messages import message_headers
from .parts import PartSession

if TYPE_CHECKING:
    from .codec import StompConnection

__all__ = ["Deliveries", "DeliverySession", "StompSubscription"]


class StompSubscription:
    """A :class:`polymq.client.DeliveryListener` relaying to one session."""

    __slots__ = (
        "ack_on_write",
        "as_json",
        "base_headers",
        "buffer_bytes",
        "buffer_messages",
        "closed",
        "core",
        "drop",
        "early",
        "held",
        "high",
        "id",
        "ids",
        "ix",
        "low",
        "mode",
        "owner",
        "reads",
        "target",
        "topic",
        "unacked",
        "unwritten",
        "unwritten_bytes",
        "window",
    )

    def __init__(
        self,
        owner: Deliveries,
        sid: str,
        ix: int,
        target: Target,
        mode: AckMode,
        *,
        window: int,
        buffer_messages: int,
        buffer_bytes: int,
        drop: bool,
        as_json: bool = False,
    ) -> None:
        self.owner = owner
        self.id = sid
        self.ix = ix
        self.target = target
        self.reads = target.core  # what it was authorized to read (a topic behind a queue)
        self.mode = mode
        self.window = window
        self.buffer_messages = buffer_messages
        self.buffer_bytes = buffer_bytes
        self.drop = drop  # slow policy for topics: drop (True) or disconnect
        self.as_json = as_json  # Avro records as JSON (`accept: application/json`)
        # deliveries waiting for Avro schemas to load (in order; as_json only)
        self.held: deque[tuple[list[int], list[Message]]] = deque()
        # deliveries that came before the SUBSCRIBE's RECEIPT went out, until opened()
        self.early: list[tuple[list[int], list[Message]]] | None = []
        self.topic = target.kind is Kind.TOPIC
        self.ack_on_write = mode is AckMode.AUTO and not self.topic
        self.core: Subscription | None = None
        self.closed = False
        # ack: client -> (low, high]: delivered and not acked; client-individual -> unacked
        self.low = 0
        self.high = 0
        self.unacked: dict[int, str] = {}  # tag -> message-id
        self.ids: deque[tuple[int, str]] = deque()  # client mode, STOMP < 1.2: (tag, id)
        # messages encoded but not yet handed to the socket (topics: the slow-consumer bound)
        self.unwritten = 0
        self.unwritten_bytes = 0
        self.base_headers: tuple[tuple[str, str], ...] = (("subscription", sid),)
        if not target.per_message:
            self.base_headers += (("destination", target.stomp),)

    # ---- polymq.client.DeliveryListener -------------------------------------------------
    def on_deliver(self, sub: Subscription, tags: list[int], messages: list[Message]) -> None:
        if self.core is None:
            self.core = sub  # deliveries may come before subscribe() returns
        if self.early is not None:
            self.early.append((tags, messages))
        elif not self.closed:
            self.owner.deliver(self, tags, messages)

    def opened(self) -> None:
        """The SUBSCRIBE is answered (its RECEIPT written): MESSAGE frames may follow, those
        of the deliveries that came before first (RabbitMQ's order)."""
        early, self.early = self.early, None
        for tags, messages in early or ():
            if not self.closed:
                self.owner.deliver(self, tags, messages)

    def on_end(self, sub: Subscription, error: BaseException) -> None:
        if not self.closed:
            self.owner.session.subscription_ended(self, error)

    # ---- acknowledgements ------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Messages delivered and not yet acknowledged (client modes)."""
        if self.mode is AckMode.CLIENT:
            return self.high - self.low
        return len(self.unacked)

    def delivered(self, tag: int, message_id: str, keep_id: bool) -> None:
        """Track an unacknowledged delivery; ``keep_id``: ACK will name its message-id."""
        if self.mode is AckMode.CLIENT:
            self.high = tag
            if keep_id:
                self.ids.append((tag, message_id))
        else:
            self.unacked[tag] = message_id

    def owes(self, tag: int) -> bool:
        """Is ``tag`` delivered and not yet acknowledged?"""
        if self.mode is AckMode.CLIENT:
            return self.low < tag <= self.high
        if self.mode is AckMode.AUTO:
            return False
        return tag in self.unacked

    def settle(self, tag: int) -> list[tuple[int, str]]:
        """Mark ``tag`` (and, in client mode, every earlier one) acknowledged; returns the
        deliveries ``(tag, message-id)`` that no longer need to be found."""
        if self.mode is AckMode.CLIENT:
            self.low = max(self.low, tag)
            gone: list[tuple[int, str]] = []
            ids = self.ids
            while ids and ids[0][0] <= tag:
                gone.append(ids.popleft())
            return gone
        mid = self.unacked.pop(tag, None)
        return [] if mid is None else [(tag, mid)]

    def __repr__(self) -> str:
        return f"<StompSubscription {self.id!r} {self.target.stomp} {self.mode.value}>"


class DeliverySession(PartSession, Protocol):
    """The session as the deliveries see it: a part's view (``parts.py``), the protocol
    version and the codec, the writes of messages, and the news of a subscription that is
    slow or ended. A protocol, so that this module need not import ``session.py``."""

    @property
    def version(self) -> str: ...
    @property
    def codec(self) -> StompConnection: ...
    @property
    def open(self) -> bool: ...

    def write_messages(
        self, sub: StompSubscription, frames: list[bytes], nbytes: int, last_tag: int
    ) -> None: ...
    def log_unsendable(self, exc: LocalStompError) -> None: ...
    def slow_consumer(self, sub: StompSubscription) -> None: ...
    def subscription_ended(self, sub: StompSubscription, error: BaseException) -> None: ...


class Deliveries:
    """The MESSAGE frames of one session's subscriptions."""

    def __init__(
        self, session: DeliverySession, by_msgid: dict[str, tuple[StompSubscription, int]]
    ) -> None:
        self.session = session
        self.by_msgid = by_msgid  # STOMP < 1.2: the subscriptions' table, filled here

    # ---- MESSAGE frames ----------------------------------------------------------------------
    def deliver(self, sub: StompSubscription, tags: list[int], messages: list[Message]) -> None:
        """MESSAGE frames for ``sub`` (called by the core client as deliveries arrive)."""
        session = self.session
        if not session.open:
            return
        if sub.as_json:
            cache = session.hub.link.schemas
            if sub.held or any(
                (sid := schema_of(m)) is not None and sid not in cache for m in messages
            ):  # a schema to load first: hold this (and what follows) in order meanwhile
                sub.held.append((tags, messages))
                if len(sub.held) == 1:
                    session.hub.link.spawn(self._release_held(sub), "loading Avro schemas")
                return
            messages = [_as_json(cache, m) for m in messages]
        self._frames(sub, tags, messages)

    async def _release_held(self, sub: StompSubscription) -> None:
        cache = self.session.hub.link.schemas
        while sub.held and not sub.closed and self.session.open:
            await load_schemas(cache, sub.held[0][1])
            tags, messages = sub.held.popleft()
            self._frames(sub, tags, [_as_json(cache, m) for m in messages])
        sub.held.clear()

    def _frames(self, sub: StompSubscription, tags: list[int], messages: list[Message]) -> None:
        session = self.session
        version = session.version
        keep_id = version != "1.2"
        conn_id = session.conn_id
        send = session.codec.send
        track = sub.mode is not AckMode.AUTO
        topic = sub.topic
        per_message = sub.target.per_message
        prefix = sub.target.topic_prefix
        skip = 6 + len(sub.target.vhost_prefix)  # "topic/" and the vhost's prefix
        vprefix = session.vhost_prefix
        names = VhostNames(session.vhost) if sub.target.exchange is not None else None
        base = sub.base_headers
        ix = sub.ix
        by_msgid = self.by_msgid
        frames: list[bytes] = []
        nbytes = 0
        last_tag = 0
        for tag, msg in zip(tags, messages, strict=True):
            if topic and (
                sub.unwritten >= sub.buffer_messages
                or sub.unwritten_bytes >= sub.buffer_bytes
                or (track and sub.outstanding >= sub.window)
            ):
                if sub.drop:
                    continue
                session.slow_consumer(sub)
                return
            mid = msg.id or f"T.{conn_id}.{ix}.{tag}"
            headers = [*base, ("message-id", mid)]
            if per_message:
                d = msg.destination
                if d[:6] != "topic/":
                    named = from_core(d, conn_id, vprefix)
                elif names is not None:  # an exchange's: /exchange/<E>/<K>, as RabbitMQ
                    named = shown(names, msg)
                else:
                    named = prefix + d[skip:]
                headers.append(("destination", named or d))
            if track:
                if not keep_id:
                    headers.append(("ack", f"{ix}.{tag}"))
                sub.delivered(tag, mid, keep_id)
                if keep_id:
                    by_msgid[mid] = (sub, tag)
            headers += message_headers(msg, version, conn_id, vprefix)
            try:
                data = send(Frame(Command.MESSAGE, tuple(headers), msg.body))
            except LocalStompError as exc:  # pragma: no cover - message_headers keeps it sendable
                session.log_unsendable(exc)
                continue
            frames.append(data)
            nbytes += len(data)
            last_tag = tag
            if topic:
                sub.unwritten += 1
                sub.unwritten_bytes += len(data)
        if frames:
            session.write_messages(sub, frames, nbytes, last_tag)


def _as_json(cache: SchemaCache, message: Message) -> Message:
    """``message`` with its Avro record as a JSON body (the same message if not Avro)."""
    value, error = json_value(cache, message)
    if value is None and error is None:
        return message
    shown = copy.copy(message)
    if error is None:
        shown.body = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        shown.content_type = "application/json"
    else:
        shown.headers = {**message.headers, "x-avro-error": error[:500]}
    return shown
