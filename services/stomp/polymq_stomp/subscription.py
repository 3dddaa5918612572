"""STOMP subscriptions: SUBSCRIBE, UNSUBSCRIBE, ACK, NACK and the MESSAGE frames.

One :class:`StompSubscription` per SUBSCRIBE listens to one core subscription (it is the
:class:`polymq.client.DeliveryListener`); the session's :class:`Subscriptions` holds them,
turns deliveries into MESSAGE frames and checks and settles acknowledgements.

=========================  ==============================  ====================================
STOMP ``ack``              core subscription               acknowledgement
=========================  ==============================  ====================================
queue/stream ``auto``      ``client`` (cumulative),        the frontend acks each message as it
                           prefetch = the window           hands it to the socket: a slow
                                                           client slows its own window only,
                                                           and what it never got is requeued
queue/stream ``client``    ``client``, the window          ACK is cumulative
queue/stream ``client-     ``client-individual``, the      ACK names one message
individual``               window
topic, any mode            ``auto`` (topics keep nothing   ACK/NACK are checked but settle
                           to redeliver)                   nothing; past ``x-buffer-messages``
                                                           waiting for the socket, or past the
                                                           window unacknowledged, the slow-
                                                           consumer policy applies
=========================  ==============================  ====================================

A topic subscription that is durable, names its queue (``x-queue-name``) or asks for a
window with a client ack mode reads from a queue bound to its topic instead, and is a queue
subscription in this table (see ``queues.py``); ``x-`` headers of a SUBSCRIBE are queue
arguments there too.

A NACK is the core's nack: with ``requeue: true`` (the default) the message goes back to its
queue, ahead of later ones, for any subscriber; with ``requeue: false`` it is rejected
(dead-lettered if the queue has a dead-letter destination, else dropped). In ``client``
mode a NACK, like an ACK, covers every earlier unacknowledged message of the subscription.

Ack ids: STOMP 1.2 MESSAGE frames carry ``ack: <subscription index>.<tag>``, the id ACK and
NACK name; STOMP 1.0 and 1.1 name the ``message-id`` (and 1.1 the ``subscription``). An id
that names no unacknowledged message of the connection (never delivered, already
acknowledged, or of an ``ack: auto`` subscription) is an ERROR.

SUBSCRIBE headers: ``id`` (the destination in STOMP 1.0 when absent), ``destination``,
``ack``, ``prefetch-count`` (RabbitMQ) or ``prefetch`` (ocamlmq): the window, 0 for the
largest allowed; ``ack-timeout`` (seconds, client modes: an unacknowledged message goes to
another subscriber after it); ``x-stream-offset`` on ``/stream/`` destinations (``first``,
``last``, ``next``, a sequence number, ``offset=<n>``, ``@<unix seconds>``,
``timestamp=<unix seconds>``); ``x-buffer-messages`` and ``x-slow-policy``
(``disconnect`` or ``drop``) for topics; ``accept: application/json`` shows Avro records
(content type ``avro/binary``, single-object encoding) as JSON, with ``content-type:
application/json`` and the ``avro-schema-id`` header kept (a record whose schema is not
registered comes as it is, with ``x-avro-error`` saying why).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections import deque
from collections.abc import Coroutine
from functools import partial
from itertools import count
from typing import TYPE_CHECKING, Any, Final, Protocol

from polymq.client import Subscription
from polymq.errors import NotFound, PolymqError, RequestError
from polymq.types import AckMode, Kind, Message, Outcome, parse_offset
from polymq_server.auth import Permission
from polymq_server.avro import SchemaCache
from polymq_server.avroview import json_value, load_schemas, schema_of
from polymq_server.corelink import CoreLink
from polymq_server.names import VhostNames

from .destinations import Control, ExchangeRef, Target, from_core
from .exchange import shown
from .frames import Command, Frame, LocalStompError
from .messages import message_headers, parse_float, parse_int
from .parts import PartSession
from .queues import Backing, backing_queue, durable_asked, queue_arguments
from .refusal import Refused

if TYPE_CHECKING:
    from .codec import StompConnection
    from .metrics import StompMetrics

__all__ = ["StompSubscription", "SubscriptionSession", "Subscriptions", "release"]

_ACK_MODES: Final = {m.value: m for m in AckMode}
_BIG_BUFFER: Final = 1 << 40  # core buffer of window-bounded subscriptions: never reached
_CORE_TOPIC_BUFFER: Final = 16 * 1024 * 1024


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
        "held",
        "high",
        "id",
        "ids",
        "ix",
        "low",
        "mode",
        "owner",
        "target",
        "topic",
        "unacked",
        "unwritten",
        "unwritten_bytes",
        "window",
    )

    def __init__(
        self,
        owner: Subscriptions,
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
        self.mode = mode
        self.window = window
        self.buffer_messages = buffer_messages
        self.buffer_bytes = buffer_bytes
        self.drop = drop  # slow policy for topics: drop (True) or disconnect
        self.as_json = as_json  # Avro records as JSON (`accept: application/json`)
        # deliveries waiting for Avro schemas to load (in order; as_json only)
        self.held: deque[tuple[list[int], list[Message]]] = deque()
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


class SubscriptionSession(PartSession, Protocol):
    """The session as its subscriptions see it: a part's view (``parts.py``), the protocol
    version, the codec and metrics, the connection's own queues, the writes of messages, and
    the news of a subscription that is slow or ended. A protocol, so that this module need
    not import ``session.py``, which imports it."""

    @property
    def version(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def codec(self) -> StompConnection: ...
    @property
    def metrics(self) -> StompMetrics: ...
    @property
    def open(self) -> bool: ...

    def spawn(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None: ...
    def own_queue(self, core: str) -> None: ...
    def owns_queue(self, core: str) -> bool: ...
    def disown_queue(self, core: str) -> None: ...
    def write_messages(
        self, sub: StompSubscription, frames: list[bytes], nbytes: int, last_tag: int
    ) -> None: ...
    def log_unsendable(self, exc: LocalStompError) -> None: ...
    def slow_consumer(self, sub: StompSubscription) -> None: ...
    def subscription_ended(self, sub: StompSubscription, error: BaseException) -> None: ...


class Subscriptions:
    """The subscriptions of one session, and the frames that work on them."""

    def __init__(self, session: SubscriptionSession) -> None:
        self.session = session
        self.by_id: dict[str, StompSubscription] = {}
        self.by_ix: dict[int, StompSubscription] = {}
        self.by_msgid: dict[str, tuple[StompSubscription, int]] = {}  # STOMP < 1.2
        self._ixs = count(1)
        self._private = count(1)  # names of private queues behind topic subscriptions

    def __len__(self) -> int:
        return len(self.by_id)

    def on(self, core: str) -> bool:
        """Is there a subscription to core destination ``core``?"""
        return any(sub.target.core == core for sub in self.by_id.values())

    def close_all(self) -> list[StompSubscription]:
        subs = list(self.by_id.values())
        self.by_id.clear()
        self.by_ix.clear()
        self.by_msgid.clear()
        for sub in subs:
            sub.closed = True
        if subs:
            self.session.metrics.subscriptions.dec(len(subs))
        return subs

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

    # ---- SUBSCRIBE -----------------------------------------------------------------------
    async def subscribe(self, frame: Frame) -> None:
        session = self.session
        s = session.settings
        destination = frame.get("destination")
        sid = frame.get("id")
        if sid is None and durable_asked(frame):
            raise Refused(
                "subscription",
                "Missing Header",
                "Header 'id' is required for durable subscriptions",
            )
        if sid is None:
            if session.version != "1.0":
                raise Refused(
                    "subscription", "Missing header", "'SUBSCRIBE' must include an 'id' header"
                )
            sid = destination or ""
        if sid in self.by_id:
            raise Refused(
                "subscription",
                "Duplicated subscription identifier",
                f"A subscription identified by {sid[:100]!r} already exists.",
            )
        if len(self.by_id) >= s.stomp_max_subscriptions:
            raise Refused(
                "subscription",
                "Too many subscriptions",
                f"at most {s.stomp_max_subscriptions} subscriptions per connection",
            )
        target = session.target(destination, pattern=True, command="SUBSCRIBE")
        if isinstance(target, ExchangeRef):
            target = await session.exchange_target(target, subscribe=True)
        if isinstance(target, Control):
            raise Refused(
                "destination",
                "Invalid destination",
                f"{target.stomp if isinstance(target, Target) else destination!r} cannot be "
                "subscribed to: control destinations answer a SEND that has a receipt header",
            )
        ack = frame.get("ack") or "auto"
        mode = _ACK_MODES.get(ack)
        if mode is None:
            raise Refused(
                "header",
                "Invalid header",
                f"ack: {ack[:40]!r}: expected auto, client or client-individual",
            )
        window, options = self._options(frame, target, mode)
        session.authorize(Permission.READ, target.core)
        if target.temp:
            await session.ensure_temp(target)
        arguments = queue_arguments(frame, session.vhost_prefix)
        if target.kind is Kind.TOPIC:
            backing = backing_queue(
                frame,
                target,
                mode,
                sid=sid,
                client_id=session.client_id,
                vhost=session.vhost,
                private=f"queue/tmp.{session.conn_id}.sub-{next(self._private)}",
                settings=s,
                arguments=arguments,
            )
            if backing is not None:
                target = await self._bind(backing, target)
        elif arguments and target.kind is Kind.QUEUE and not target.temp:
            session.authorize(Permission.CONFIGURE, target.core)
            client = session.client()
            await session.hub.link.guard(client, client.declare(target.core, **arguments))
        await self.open(sid, target, mode, window, options)
        receipt = frame.get("receipt")
        if receipt is not None:
            session.receipt(receipt)

    async def _bind(self, backing: Backing, topic: Target) -> Target:
        """Declare the queue behind a topic subscription and bind it to the topic; the
        target the subscription reads from."""
        session = self.session
        session.authorize(Permission.CONFIGURE, backing.core)
        client = session.client()
        guard = session.hub.link.guard
        await guard(client, client.declare(backing.core, **backing.options))
        await guard(client, client.bind(topic.core, backing.core))
        if not backing.keep:
            session.own_queue(backing.core)  # deleted with the subscription
        return Target(
            backing.core,
            Kind.QUEUE,
            topic.stomp,
            topic_prefix=topic.topic_prefix,
            vhost_prefix=topic.vhost_prefix,
            routed=True,
            exchange=topic.exchange,
        )

    def _options(self, frame: Frame, target: Target, mode: AckMode) -> tuple[int, dict[str, Any]]:
        s = self.session.settings
        window = s.stomp_prefetch
        options: dict[str, Any] = {}
        for name in ("prefetch-count", "prefetch"):
            raw = frame.get(name)
            if raw is not None:
                window = parse_int(name, raw, 0, 1 << 31) or s.stomp_max_prefetch
                window = min(window, s.stomp_max_prefetch)
                break
        raw = frame.get("ack-timeout")
        if raw is not None:
            timeout = parse_float("ack-timeout", raw)
            if mode is not AckMode.AUTO:  # auto: acked as it goes out, nothing to time out
                options["ack_timeout"] = timeout
        raw = frame.get("x-stream-offset")
        if raw is not None:
            if target.kind is not Kind.STREAM:
                raise Refused(
                    "header",
                    "Invalid header",
                    f"x-stream-offset applies to streams: {target.stomp} is not a /stream/ "
                    "destination",
                )
            options["offset"] = _stream_offset(raw)
        raw = frame.get("x-buffer-messages")
        if raw is not None:
            options["buffer_messages"] = parse_int("x-buffer-messages", raw, 1, 10_000_000)
        raw = frame.get("accept")
        if raw is not None:
            media = {part.split(";", 1)[0].strip().lower() for part in raw.split(",")}
            options["as_json"] = "application/json" in media
        raw = frame.get("x-slow-policy")
        if raw is not None:
            if raw not in ("drop", "disconnect"):
                raise Refused(
                    "header",
                    "Invalid header",
                    f"x-slow-policy: {raw[:40]!r}: expected drop or disconnect",
                )
            options["slow_policy"] = raw
        return window, options

    async def open(
        self, sid: str, target: Target, mode: AckMode, window: int, options: dict[str, Any]
    ) -> None:
        """Subscribe at the core and start relaying."""
        session = self.session
        s = session.settings
        buffer_messages = int(options.pop("buffer_messages", s.stomp_buffer_messages))
        drop = options.pop("slow_policy", "disconnect") == "drop"
        as_json = bool(options.pop("as_json", False))
        sub = StompSubscription(
            self,
            sid,
            next(self._ixs),
            target,
            mode,
            window=window,
            buffer_messages=buffer_messages,
            buffer_bytes=s.stomp_buffer_bytes,
            drop=drop,
            as_json=as_json,
        )
        if target.kind is Kind.TOPIC:
            # Topics keep nothing: the core hands every message over at once (and drops for
            # a frontend too slow as a whole, rather than cut every connection it carries);
            # the session applies each client's own slow-consumer policy.
            core_options: dict[str, Any] = {
                "ack_mode": "auto",
                "buffer_messages": max(buffer_messages, s.stomp_buffer_messages),
                "buffer_bytes": max(s.stomp_buffer_bytes, _CORE_TOPIC_BUFFER),
                "slow_policy": "drop",
            }
        else:
            individual = mode is AckMode.CLIENT_INDIVIDUAL
            core_options = {
                "ack_mode": "client-individual" if individual else "client",
                "prefetch": window,
                "buffer_messages": max(window, 10_000),
                "buffer_bytes": _BIG_BUFFER,
                **options,
            }
        self.by_id[sid] = sub
        self.by_ix[sub.ix] = sub
        session.metrics.subscriptions.inc()
        link = session.hub.link
        client = session.client()
        task = asyncio.ensure_future(client.subscribe(target.core, listener=sub, **core_options))
        try:
            core = await link.guard(client, asyncio.shield(task))
        except asyncio.CancelledError:
            # the session went away meanwhile: a subscription made after all is released
            task.add_done_callback(partial(_release_late, link))
            raise
        except BaseException:
            if self.by_id.get(sid) is sub:
                del self.by_id[sid]
                self.by_ix.pop(sub.ix, None)
                session.metrics.subscriptions.dec()
            raise
        sub.core = core
        if sub.closed:  # the session closed while we waited: release it now
            link.spawn(release([core], [], link), "releasing a subscription")

    # ---- UNSUBSCRIBE ---------------------------------------------------------------------
    def unsubscribe(self, frame: Frame) -> None:
        session = self.session
        sid = frame.get("id")
        if sid is None and session.version == "1.0":
            sid = frame.get("destination")
        if sid is None:
            raise Refused(
                "subscription",
                "Missing destination or id",
                "UNSUBSCRIBE must include a 'destination' or 'id' header",
            )
        sub = self.by_id.pop(sid, None)
        if sub is None:
            raise Refused(
                "subscription",
                "No subscription found",
                "UNSUBSCRIBE must refer to an existing subscription.\n"
                f"Subscription to \"id='{sid[:100]}'\" not found.",
            )
        self.by_ix.pop(sub.ix, None)
        sub.closed = True
        session.metrics.subscriptions.dec()
        if self.by_msgid:
            for mid in [m for m, (s, _) in self.by_msgid.items() if s is sub]:
                del self.by_msgid[mid]
        core = sub.core
        receipt = frame.get("receipt")
        # the queue behind a topic subscription goes with it, a durable one when asked
        routed = sub.target.core if sub.target.routed else None
        drop = routed is not None and (session.owns_queue(routed) or durable_asked(frame))
        if core is not None or drop:
            session.spawn(self._unsubscribe(core, routed if drop else None, receipt), frame)
        elif receipt is not None:
            session.receipt(receipt)

    async def _unsubscribe(
        self, core: Subscription | None, queue: str | None, receipt: str | None
    ) -> None:
        session = self.session
        guard = session.hub.link.guard
        if core is not None and not core.client.closed:
            await guard(core.client, core.unsubscribe())
        if queue is not None:
            session.authorize(Permission.CONFIGURE, queue)
            client = session.client()
            with contextlib.suppress(NotFound):
                await guard(client, client.delete(queue))
            session.disown_queue(queue)
        if receipt is not None:
            session.receipt(receipt)

    # ---- ACK / NACK ---------------------------------------------------------------------------
    def resolve(self, frame: Frame, what: str) -> tuple[StompSubscription, int]:
        """The unacknowledged delivery an ACK or NACK names, or Refused."""
        sub: StompSubscription | None
        if self.session.version == "1.2":
            ack_id = frame.get("id")
            if ack_id is None:
                raise Refused(
                    "ack",
                    "Missing header",
                    f'"{what}" must include the "id" header (the MESSAGE\'s ack)',
                )
            ix_s, _, tag_s = ack_id.partition(".")
            sub = self.by_ix.get(int(ix_s)) if ix_s.isdigit() else None
            tag = int(tag_s) if tag_s.isdigit() else 0
        else:
            ack_id = frame.get("message-id")
            if ack_id is None:
                raise Refused(
                    "ack",
                    "Missing header",
                    f'"{what}" must include the "message-id" header of the MESSAGE',
                )
            entry = self.by_msgid.get(ack_id)
            sub, tag = entry if entry is not None else (None, 0)
        if sub is None or not sub.owes(tag):
            auto = sub is not None and sub.mode is AckMode.AUTO
            header = "id" if self.session.version == "1.2" else "message-id"
            raise Refused(
                "ack",
                "Invalid header",
                f'"{what}" must include a valid "{header}" header: '
                f"{ack_id[:100]!r} names no unacknowledged message of this connection"
                + (" (its subscription uses ack: auto)" if auto else "")
                + ": already acknowledged, or never delivered",
            )
        return sub, tag

    def settle(self, sub: StompSubscription, tag: int, outcome: Outcome) -> None:
        """Acknowledge (or nack) ``tag``; the core hears of it in this loop iteration."""
        by_msgid = self.by_msgid
        for settled, mid in sub.settle(tag):
            entry = by_msgid.get(mid)  # a redelivery of the same message may have replaced it
            if entry is not None and entry[0] is sub and entry[1] == settled:
                del by_msgid[mid]
        core = sub.core
        if sub.topic or sub.closed or core is None or core.closed:
            return  # topic messages are gone once delivered: nothing to settle
        with contextlib.suppress(PolymqError):
            core.settle(tag, outcome)

    def reply_target(self, stomp_destination: str) -> Target:
        target = self.session.target(stomp_destination)
        assert isinstance(target, Target)
        return target

    async def reply_subscription(self, stomp_destination: str) -> None:
        """As RabbitMQ: a SEND with ``reply-to: /temp-queue/x`` subscribes this connection to
        that temp queue, with the subscription id ``/temp-queue/x`` (ack auto)."""
        session = self.session
        target = self.reply_target(stomp_destination)
        if self.on(target.core):
            return
        await session.ensure_temp(target)
        session.authorize(Permission.READ, target.core)
        s = session.settings
        if stomp_destination in self.by_id or len(self.by_id) >= s.stomp_max_subscriptions:
            return
        await self.open(stomp_destination, target, AckMode.AUTO, s.stomp_prefetch, {})


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


def _stream_offset(raw: str) -> str | int | float:
    """``first``, ``last``, ``next``, a sequence number, ``@<unix seconds>``, or RabbitMQ's
    ``offset=<n>`` / ``timestamp=<unix seconds>``."""
    v = raw.strip()
    if v.startswith("offset="):
        v = v[7:]
    elif v.startswith("timestamp="):
        v = "@" + v[10:]
    try:
        return parse_offset(v)
    except RequestError:
        raise Refused(
            "header",
            "Invalid header",
            f"x-stream-offset: {raw[:60]!r}: expected first, last, next, a sequence number, "
            "offset=<n>, @<unix seconds> or timestamp=<unix seconds>",
        ) from None


async def release(cores: list[Subscription], temps: list[str], link: CoreLink) -> None:
    """Unsubscribe (unacknowledged messages go back to their queues), then delete temp
    queues, for a connection that closed."""
    for core in cores:
        if not core.client.closed:
            with contextlib.suppress(PolymqError, TimeoutError):
                await asyncio.wait_for(core.unsubscribe(), 10.0)
    client = link.client
    for temp in temps:
        if client is not None and not client.closed:
            with contextlib.suppress(PolymqError, TimeoutError):
                await asyncio.wait_for(client.delete(temp), 10.0)


def _release_late(link: CoreLink, task: asyncio.Future[Subscription]) -> None:
    if task.cancelled() or task.exception() is not None:
        return
    link.spawn(release([task.result()], [], link), "releasing a late subscription")
