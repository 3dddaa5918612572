"""STOMP subscriptions: SUBSCRIBE, UNSUBSCRIBE, ACK and NACK.

One :class:`~polymq_stomp.delivery.StompSubscription` per SUBSCRIBE listens to one core
subscription (it is the :class:`polymq.client.DeliveryListener`); the session's
:class:`Subscriptions` holds them and checks and settles acknowledgements; its
:class:`~polymq_stomp.delivery.Deliveries` turns deliveries into MESSAGE frames
(``delivery.py``).

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
from collections.abc import Coroutine
from functools import partial
from itertools import count
from typing import TYPE_CHECKING, Any, Final, Protocol

from polymq.client import Subscription
from polymq.errors import NotFound, PolymqError, RequestError
from polymq.types import AckMode, Kind, Outcome, parse_offset
from polymq_server.auth.deadletter import for_user
from polymq_server.auth.provider import Permission, Principal
from polymq_server.link.corelink import CoreLink

from .delivery import Deliveries, DeliverySession, StompSubscription
from .destinations import Control, ExchangeRef, Target
from .frames import Frame
from .messages import parse_float, parse_int
from .queues import Backing, backing_queue, durable_asked, queue_arguments
from .refusal import Refused

if TYPE_CHECKING:
    from .metrics import StompMetrics

__all__ = ["SubscriptionSession", "Subscriptions", "release"]

_ACK_MODES: Final = {m.value: m for m in AckMode}
_BIG_BUFFER: Final = 1 << 40  # core buffer of window-bounded subscriptions: never reached
_CORE_TOPIC_BUFFER: Final = 16 * 1024 * 1024


class SubscriptionSession(DeliverySession, Protocol):
    """The session as its subscriptions see it: what the deliveries see (``delivery.py``),
    the client id and metrics, and tasks nothing waits for (the connection's own queues
    are its targets', ``targets.py``). A protocol, so that this module need not import
    ``session.py``, which imports it."""

    @property
    def client_id(self) -> str: ...
    @property
    def metrics(self) -> StompMetrics: ...

    principal: Principal | None

    def spawn(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None: ...


class Subscriptions:
    """The subscriptions of one session, and the frames that work on them."""

    def __init__(self, session: SubscriptionSession) -> None:
        self.session = session
        self.by_id: dict[str, StompSubscription] = {}
        self.by_ix: dict[int, StompSubscription] = {}
        self.by_msgid: dict[str, tuple[StompSubscription, int]] = {}  # STOMP < 1.2
        self.deliveries = Deliveries(session, self.by_msgid)
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
        if sid in self.by_id:  # named by RabbitMQ's consumer tag: T_<id>, or Q_<destination>
            tag = f"T_{sid}" if frame.get("id") is not None else f"Q_{sid}"
            raise Refused(
                "subscription",
                "Duplicated subscription identifier",
                f"A subscription identified by '{tag[:100]}' already exists.",
            )
        if len(self.by_id) >= s.stomp_max_subscriptions:
            raise Refused(
                "subscription",
                "Too many subscriptions",
                f"at most {s.stomp_max_subscriptions} subscriptions per connection",
            )
        target = session.targets.lookup(destination, pattern=True, command="SUBSCRIBE")
        if isinstance(target, ExchangeRef):
            target = await session.targets.exchange_target(target, subscribe=True)
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
        reads = target.core
        if target.temp:
            await session.targets.ensure_temp(target)
        arguments = queue_arguments(frame, session.vhost_prefix)
        if "dead_letter" in arguments:  # WRITE there, on this user's permission (an ERROR)
            assert session.principal is not None
            arguments = for_user(arguments, session.principal, session.authorize)
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
        await self.open(
            sid, target, mode, window, options, reads=reads, receipt=frame.get("receipt")
        )

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
            session.targets.own(backing.core)  # deleted with the subscription
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
        self,
        sid: str,
        target: Target,
        mode: AckMode,
        window: int,
        options: dict[str, Any],
        *,
        reads: str | None = None,
        receipt: str | None = None,
    ) -> None:
        """Subscribe at the core and start relaying (``reads``: what READ was authorized on,
        if not ``target``: the topic of the queue behind a topic subscription); the
        SUBSCRIBE's ``receipt`` goes out before any MESSAGE of the subscription."""
        session = self.session
        s = session.settings
        buffer_messages = int(options.pop("buffer_messages", s.stomp_buffer_messages))
        drop = options.pop("slow_policy", "disconnect") == "drop"
        as_json = bool(options.pop("as_json", False))
        sub = StompSubscription(
            self.deliveries,
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
        if reads is not None:
            sub.reads = reads
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
        # (again, remembered: a users reload may have come while the queue behind was made;
        # from here on the reload finds it among the subscriptions)
        session.authorize(Permission.READ, sub.reads)
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
            return
        if receipt is not None:
            session.receipt(receipt)
        sub.opened()

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
                f"Subscription to \"id='{sid[:100]}'\" not found.\n",
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
        drop = routed is not None and (session.targets.owns(routed) or durable_asked(frame))
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
            session.targets.disown(queue)
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
                    f'"{what}" must include the "id" header\n',
                )
            ix_s, _, tag_s = ack_id.partition(".")
            sub = self.by_ix.get(int(ix_s)) if _is_number(ix_s) else None
            tag = int(tag_s) if _is_number(tag_s) else 0
        else:
            ack_id = frame.get("message-id")
            if ack_id is None:
                raise Refused(
                    "ack",
                    "Missing header",
                    f'"{what}" must include the "message-id" header\n',
                )
            entry = self.by_msgid.get(ack_id)
            sub, tag = entry if entry is not None else (None, 0)
        if sub is None or not sub.owes(tag):  # (never delivered, acknowledged, or ack: auto)
            header = "id" if self.session.version == "1.2" else "message-id"
            raise Refused(
                "ack",
                "Invalid header",
                f'"{what}" must include a valid "{header}" header\n',
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
        target = self.session.targets.lookup(stomp_destination)
        assert isinstance(target, Target)
        return target

    async def reply_subscription(self, stomp_destination: str) -> None:
        """As RabbitMQ: a SEND with ``reply-to: /temp-queue/x`` subscribes this connection to
        that temp queue, with the subscription id ``/temp-queue/x`` (ack auto)."""
        session = self.session
        target = self.reply_target(stomp_destination)
        if self.on(target.core):
            return
        await session.targets.ensure_temp(target)
        session.authorize(Permission.READ, target.core)
        s = session.settings
        if stomp_destination in self.by_id or len(self.by_id) >= s.stomp_max_subscriptions:
            return
        await self.open(stomp_destination, target, AckMode.AUTO, s.stomp_prefetch, {})


def _is_number(text: str) -> bool:
    """ASCII digits that int() takes as an ack id's part: not "²", which isdigit() but
    int() refuses, nor more digits than int() takes (no index or tag has 19)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


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
