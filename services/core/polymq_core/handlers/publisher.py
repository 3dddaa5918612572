"""Publishing: the ``Publish`` request (idempotent batches included), the fanout of topic
messages to their subscribers, the routing of copies to the queues bound to a topic, and
dead letters.

A topic publish reaches every subscription whose pattern matches (transient: nothing is
kept) and, through :mod:`polymq_core.topics.bindings`, every bound queue once; a queue, stream or
channel publish is appended by the shard that owns the destination, and answered once
durable when persistent messages reach a durable destination (``Shard.commit``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from polymq.errors import BadRequest, QueueFull, Unavailable
from polymq.events import Publish
from polymq.types import ChannelRole, Destination, Kind, Message
from polymq_server.auth.provider import Permission
from polymq_server.names import ORIGIN

from ..destinations.batches import MAX_BATCH_ID, MAX_BATCH_TTL
from ..destinations.shard import Shard
from .answers import then
from .caller import Caller

if TYPE_CHECKING:
    from ..topics.mesh import Routed
    from .context import HandlerContext


class PublishCaller(Caller, Protocol):
    """The session a publish came on, as the publisher sees it: its protocol (a metrics
    label) and whether it is a leaving node handing its messages over."""

    protocol: str
    handing: bool
    speaks_for_core: bool  # the admin API's own link: its messages keep names.ORIGIN


log = logging.getLogger(__name__)

_NO_RETURN = frozenset({"expired", "max-length"})  # dead-letter reasons that never loop back


class PublishHandler:
    def __init__(self, context: HandlerContext) -> None:
        self.context = context

    # ---- Publish ---------------------------------------------------------------------------
    def publish(self, session: PublishCaller, ev: Publish) -> Any:
        ctx = self.context
        if session.principal is not None and ev.messages:  # where replies will be written
            ctx.auth.authorize_replies(session.principal, ev.messages)
        if ev.batch_id is None:
            return self._publish_now(
                session, ev, ctx.destination(session, ev.destination, Permission.WRITE)
            )
        batch_id, ttl = ev.batch_id, ev.batch_ttl
        if not isinstance(batch_id, str) or not 0 < len(batch_id) <= MAX_BATCH_ID:
            raise BadRequest(f"batch_id must be a string of 1..{MAX_BATCH_ID} characters")
        if ttl is None:
            ttl = ctx.settings.batch_window
        elif isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl:
            raise BadRequest("batch_ttl must be a positive number of seconds")
        dest = ctx.destination(session, ev.destination, Permission.WRITE)
        key = f"{dest}\x00{ev.role or ''}\x00{batch_id}"
        window = ctx.shard_for(str(dest)).batches
        answer = window.get(key)
        if answer is not None:
            ctx.sensors.on_duplicate_batch(session.protocol)
            return answer
        ttl = min(float(ttl), MAX_BATCH_TTL)
        result = self._publish_now(session, ev, dest, (key, time.time() + ttl))
        if isinstance(result, dict):
            result["duplicate"] = False
        else:
            result = _with(result, "duplicate", False)
        return window.remember(key, ttl, result)

    def publish_key(self, session: Caller, ev: Publish) -> str | None:
        """The shard key ``ev`` is served by (its route's): None for a topic's."""
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.WRITE)
        if session.principal is not None and ev.messages:  # where replies will be written
            ctx.auth.authorize_replies(session.principal, ev.messages)
        return None if dest.kind is Kind.TOPIC else _appended_to(dest, ev.role)

    def _publish_now(
        self,
        session: PublishCaller,
        ev: Publish,
        dest: Destination,
        batch: tuple[str, float] | None = None,
    ) -> Any:
        """``batch``: (key, expires) of an idempotent batch, kept with its messages in the
        store when they are (a queue's, stream's or channel's persistent messages)."""
        ctx = self.context
        msgs = ev.messages
        if not msgs:
            return {"count": 0}
        max_body = ctx.settings.max_body
        for m in msgs:
            m.validate(max_body)
            if ORIGIN in m.headers and not session.speaks_for_core:  # (the core's alone)
                m.headers = {k: v for k, v in m.headers.items() if k != ORIGIN}
        kind = dest.kind.value
        ctx.sensors.on_publish(session.protocol, kind, len(msgs))
        if dest.kind is Kind.TOPIC:
            n = self.publish_topic(dest.name, msgs)
            # (in a cluster: the other nodes' subscribers and bound queues; the future of
            # the answers of the leaders of the durable queues it must reach there, if any)
            remote = ctx.mesh.publish(dest.name, msgs) if ctx.mesh is not None else None
            result = {"count": len(msgs), "subscribers": n, "queues": 0, "refused": []}
            if not ctx.bindings.size and remote is None:  # the fanout path as it was
                return result
            return self.route(dest.name, msgs, result, remote)
        key = _appended_to(dest, ev.role)
        if key is None:
            raise BadRequest("a channel publish needs role 'server' or 'client'")
        fut = ctx.shard_for(key).publish(key, msgs, batch=batch, handed=session.handing)
        result = {"count": len(msgs), "ids": [m.id for m in msgs], "seqs": [m.seq for m in msgs]}
        if fut is None:
            return result
        return then(fut, result)

    # ---- topics and bound queues -------------------------------------------------------------
    def publish_topic(self, name: str, msgs: list[Message]) -> int:
        subs = self.context.topics.match(name)
        now = time.time()
        for m in msgs:
            m.destination = f"topic/{name}"
            m.timestamp = now
            m.delivery_count = 1
        if subs:
            nbytes = sum(len(m.body) for m in msgs)
            for sub in subs:
                sub.send_all(msgs, nbytes)
            self.context.sensors.on_deliver(len(subs) * len(msgs))
        return len(subs)

    def route(
        self,
        name: str,
        msgs: list[Message],
        result: dict[str, Any],
        remote: asyncio.Future[Routed] | None = None,
    ) -> Any:
        """Append a copy of ``msgs`` (just published to ``topic/<name>``) to every queue bound
        by a pattern that matches ``name``, each queue once. Fills in ``result["queues"]``
        (how many took them) and ``result["refused"]`` (the keys of those that refused them:
        full, under ``reject``); returns ``result``, or an awaitable of it when copies of
        persistent messages into durable queues must first be durable: here, and, with
        ``remote`` (the mesh's), on the other nodes that lead such queues (it adds theirs)."""
        taken, futs = self.route_copies(name, msgs, result["refused"])
        result["queues"] = taken
        if remote is not None:
            return _with_remote(result, [f for _, f in futs], remote)
        if not futs:
            return result
        return then(futs[0][1] if len(futs) == 1 else asyncio.gather(*(f for _, f in futs)), result)

    def route_copies(
        self, name: str, msgs: list[Message], refused: list[str], skip: str = ""
    ) -> tuple[int, list[tuple[int, asyncio.Future[None]]]]:
        """Copies of ``msgs`` of ``topic/<name>`` into the queues bound here (in a cluster:
        those of the shards this node leads), the keys of those that refuse them added to
        ``refused``: (how many took them, the shard and future of each durable append).
        ``skip``: a queue not to route to."""
        ctx = self.context
        if not ctx.bindings.size:
            return 0, []
        keys = ctx.bindings.match(name)
        futs: list[tuple[int, asyncio.Future[None]]] = []
        taken = 0
        for key in sorted(keys) if len(keys) > 1 else keys:
            if key == skip:
                continue
            copies = [_copy(m) for m in msgs]
            shard = ctx.shard_for(key)
            try:
                fut = shard.publish(key, copies, routed=True)
            except QueueFull:
                refused.append(key)
                continue
            taken += 1
            if fut is not None:
                futs.append((shard.index, fut))
        return taken, futs

    # ---- dead letters ------------------------------------------------------------------------
    def dead_letter(
        self, msg: Message, target: str, reason: str, source: str = ""
    ) -> asyncio.Future[None] | None:
        """Send ``msg``, which left queue ``source`` unacked for ``reason``, to ``target``;
        the future of its copies' durability (None: nothing to wait for), which the source
        waits for before it forgets ``msg`` (a dead letter that failed leaves it in the
        source's store: at least once, never lost).

        A topic target goes through the same routing as a publish (subscribers and bindings;
        in a cluster, the leaders elsewhere of the durable queues it reaches answer too); a
        queue whose shard another node leads gets it through that leader (the mesh's
        append).
        A message that left on its own (``expired``, or dropped as the oldest of a full
        queue: ``max-length``) never comes back into the queue it left, through a binding or
        directly: a full queue under drop-oldest would loop forever (RabbitMQ drops such
        cycles too). What a consumer rejected, or gave up on, may come back."""
        try:
            dest = Destination.parse(target)
        except BadRequest:
            log.warning("dead-letter destination %r is invalid; message dropped", target)
            return None
        headers = {
            **{k: v for k, v in msg.headers.items() if k != ORIGIN},  # (a copy: not the core's)
            "x-death-reason": reason,
            "x-original-destination": msg.destination,
            "x-original-id": msg.id,
            "x-delivery-count": str(msg.delivery_count),
        }
        if source and msg.destination != source:  # it came into the queue through a binding
            headers["x-original-queue"] = source
        dl = Message(
            body=msg.body,
            content_type=msg.content_type,
            headers=headers,
            priority=msg.priority,
            persistent=msg.persistent,
            correlation_id=msg.correlation_id,
            reply_to=msg.reply_to,
        )
        skip = source if reason in _NO_RETURN else ""
        if dest.kind is Kind.TOPIC:
            self.publish_topic(dest.name, [dl])
            mesh = self.context.mesh
            remote = mesh.publish(dest.name, [dl]) if mesh is not None else None
            refused: list[str] = []
            _, futs = self.route_copies(dest.name, [dl], refused, skip)
            if refused:
                log.warning("dead-lettering to %s: refused by %s", target, ", ".join(refused))
            return _durable(target, [f for _, f in futs], remote)
        key = str(dest)
        if key == skip:
            log.warning("%s dead-letters to itself (%s); message dropped", key, reason)
            return None
        shard = self.context.shard_for(key)
        mesh = self.context.mesh
        if not shard.leading and mesh is not None:  # (a cluster's: its leader appends it)
            return _durable(target, [], mesh.append(key, shard.index, [dl]))
        try:
            fut = shard.publish(key, [dl])
        except Exception as exc:  # a full dead-letter queue must not break the source queue
            log.warning("dead-lettering to %s failed: %s", key, exc)
            return None
        return None if fut is None else _durable(target, [fut], None)


def _copy(m: Message) -> Message:
    """What a bound queue gets of a topic message: the producer's fields (the headers dict is
    shared: the core never changes a message's headers), the topic in ``destination``; the
    queue assigns the rest."""
    return Message(
        m.body,
        m.content_type,
        m.headers,
        m.priority,
        m.persistent,
        m.expires,
        m.ack_timeout,
        m.correlation_id,
        m.reply_to,
        destination=m.destination,
    )


def _durable(
    target: str, futs: list[asyncio.Future[None]], remote: asyncio.Future[Routed] | None
) -> asyncio.Future[None] | None:
    """One future for the durability of a dead letter's copies (here and, ``remote``, on
    the nodes leading the durable queues it reached elsewhere); a failure is logged."""
    waits: list[asyncio.Future[Any]] = [*futs, *([remote] if remote is not None else [])]
    if not waits:
        return None
    done = waits[0] if len(waits) == 1 else asyncio.gather(*waits)
    out: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settled(f: asyncio.Future[Any]) -> None:
        exc = Unavailable("cancelled") if f.cancelled() else f.exception()
        if exc is not None:
            log.warning("a message dead-lettered to %s may not be durable: %s", target, exc)
            out.set_exception(exc)
            out.exception()  # (seen: the source only checks whether it failed)
        else:
            out.set_result(None)

    done.add_done_callback(settled)
    return out


async def _with_remote(
    result: dict[str, Any], local: list[asyncio.Future[None]], remote: asyncio.Future[Routed]
) -> dict[str, Any]:
    """``result`` once the copies routed here are durable and the leaders of those routed
    elsewhere answered that theirs are (adding the queues they took and refused)."""
    if local:
        await asyncio.shield(local[0] if len(local) == 1 else asyncio.gather(*local))
    routed = await asyncio.shield(remote)
    result["queues"] += routed.queues
    result["refused"] += routed.refused
    return result


def _appended_to(dest: Destination, role: Any) -> str | None:
    """The shard key a publish to ``dest`` (not a topic) is appended to: a channel's, the
    inbox of the other side than the publisher's ``role`` (None: a role that names no side,
    refused by a publish that sends something)."""
    if dest.kind is not Kind.CHANNEL:
        return str(dest)
    if role is not None and not ChannelRole.named(role):
        return None
    return Shard.key_of(dest, ChannelRole.of(role, ChannelRole.CLIENT).other)


async def _with(answer: Awaitable[dict[str, Any]], key: str, value: Any) -> dict[str, Any]:
    result = await answer
    result[key] = value
    return result
