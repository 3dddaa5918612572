"""Consuming: subscriptions that the core pushes to (``Subscribe``, ``Unsubscribe``, ``Ack``,
``Nack``), pulls of queue leases (``Pull``, settled by ``Settle`` from any connection), and
cursor subscriptions that live in the core and are polled from any connection
(``CursorOpen``, ``CursorPoll``, ``CursorClose``).

A waiting pull or poll is answered with an awaitable: it resolves when messages come, at its
``wait`` deadline (with nothing), or at once when the broker stops.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from polymq.errors import BadRequest, NotFound, Unavailable
from polymq.events import (
    Ack,
    CursorClose,
    CursorOpen,
    CursorPoll,
    Nack,
    Polled,
    Pull,
    Pulled,
    Settle,
    Subscribe,
    Unsubscribe,
)
from polymq.types import Destination, Kind, Message, Outcome, SubscribeOptions
from polymq_server.auth.provider import Permission

from ..destinations.queue import Queue, Waiter
from ..destinations.subscription import SubscriberSession, Subscription
from ..identities import PEER_CLIENT
from .caller import Caller
from .cursors import Cursor, QueueCursor, StreamCursor, TopicCursor
from .sids import SidTable, shared_sid

if TYPE_CHECKING:
    from .context import HandlerContext


class ConsumerSession(Caller, SubscriberSession, Protocol):
    """The session a consuming request came on, as these handlers see it (a protocol, as
    the other handlers' :class:`~polymq_core.handlers.caller.Caller`: they need not import
    ``session.py``): who sent it, the subscriptions it owns by sid (it takes each delivery,
    :class:`~polymq_core.destinations.subscription.SubscriberSession`), and the first delivery tag
    of
    one that moved here from another node."""

    protocol: str
    subs: SidTable[Subscription]
    first_tags: dict[int, int]
    claims: dict[int, dict[str, int]]

    def add_sub(self, sub: Subscription) -> None: ...
    def remove_sub(self, sid: int) -> Subscription | None: ...


class ConsumeHandler:
    def __init__(self, context: HandlerContext) -> None:
        self.context = context

    # ---- subscriptions -------------------------------------------------------------------
    def subscribe(self, session: ConsumerSession, ev: Subscribe) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.READ, pattern=True)
        claims = _claims(session, ev)
        options = SubscribeOptions.from_dict(
            ev.options if claims is None else {k: v for k, v in ev.options.items() if k != CLAIM}
        )
        if ev.sid in session.subs:
            raise BadRequest(f"subscription id {ev.sid} is already in use on this connection")
        if len(session.subs) >= ctx.settings.max_subscriptions_per_connection:
            raise BadRequest(
                f"at most {ctx.settings.max_subscriptions_per_connection} subscriptions "
                "per connection"
            )
        sid = shared_sid(ev.sid)  # (the same sids recur on every connection)
        if dest.kind is Kind.TOPIC:
            sub = Subscription(session, sid, dest, options, ctx.topic_source)
            try:
                ctx.topics.add(dest.name, sub)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            session.add_sub(sub)
        else:
            key = ctx.holder_key(dest, options.role)
            holder = ctx.shard_for(key).get(key)
            if dest.kind is not Kind.STREAM and options.offset != "next":
                raise BadRequest("offset applies to streams only")
            sub = Subscription(session, sid, dest, options, holder)
            if claims is not None:
                top, held = claims
            else:
                top, held = session.first_tags.get(ev.sid, 1) - 1, session.claims.get(ev.sid, {})
            if top:  # a subscription moved here from another leader
                sub.next_tag = top + 1
            claimed = holder.claim(sub, held) if held and isinstance(holder, Queue) else []
            session.add_sub(sub)
            start = holder.attach(sub)
            ctx.sensors.on_subscription(dest.kind.value, 1)
            answer: dict[str, Any] = {"sid": ev.sid, "destination": str(dest)}
            if start is not None:  # a stream's: the seq it reads first (its answer's "seq")
                answer["seq"] = start
            if claims is not None:
                answer["claimed"] = claimed
            return answer
        ctx.sensors.on_subscription(dest.kind.value, 1)
        return {"sid": ev.sid, "destination": str(dest)}

    def unsubscribe(self, session: ConsumerSession, ev: Unsubscribe) -> Any:
        if session.remove_sub(ev.sid) is None:
            raise NotFound(f"no subscription {ev.sid} on this connection")
        return None

    def ack(self, session: ConsumerSession, ev: Ack) -> Any:
        sub = _sub(session, ev.sid)
        keys = sub.take(_tags(ev.tags), bool(ev.cumulative))
        if keys:
            self.context.sensors.on_ack(len(keys))
        written = sub.source.settle(sub, keys, Outcome.ACK)
        return _once_written(ev.rid, written, {"acked": len(keys)})

    def nack(self, session: ConsumerSession, ev: Nack) -> Any:
        sub = _sub(session, ev.sid)
        keys = sub.take(_tags(ev.tags), bool(ev.cumulative))
        written = sub.source.settle(sub, keys, Outcome.of_nack(bool(ev.requeue)))
        return _once_written(ev.rid, written, {"nacked": len(keys)})

    # ---- pull and leases -----------------------------------------------------------------
    def pull(self, session: ConsumerSession, ev: Pull) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.READ)
        if dest.kind is not Kind.QUEUE:
            raise BadRequest("pull works on queues")
        max_, wait = self._max_wait(ev.max, ev.wait)
        vis = ev.visibility
        if not isinstance(vis, int | float) or not 0 < vis <= 43200:
            raise BadRequest("visibility must be 0..43200 seconds")
        key = str(dest)
        holder = ctx.shard_for(key).get(key)
        assert isinstance(holder, Queue)
        got = _lease_or_wait(holder, max_, wait, float(vis))
        if isinstance(got, list):
            return _pulled(ev.rid, got)

        async def answer() -> Pulled:
            return _pulled(ev.rid, await got)

        return answer()

    def _max_wait(self, max_: Any, wait: Any) -> tuple[int, float]:
        settings = self.context.settings
        if not isinstance(max_, int) or not 1 <= max_ <= settings.max_pull:
            raise BadRequest(f"max must be an integer 1..{settings.max_pull}")
        if not isinstance(wait, int | float) or not 0 <= wait <= settings.max_wait:
            raise BadRequest(f"wait must be 0..{settings.max_wait} seconds")
        return max_, float(wait)

    def settle(self, session: ConsumerSession, ev: Settle) -> Any:
        ctx = self.context
        outcome = Outcome.parse(ev.action)
        if not isinstance(ev.leases, list) or not ev.leases:
            raise BadRequest("leases must be a non-empty list")
        settled = 0
        missing = []
        written: asyncio.Future[None] | None = None
        for lease in ev.leases:
            key, seq, delivery_id = self._lease(session, lease)
            holder = ctx.shard_for(key).holders.get(key)
            try:
                if not isinstance(holder, Queue):
                    raise NotFound("lease is unknown")
                written = holder.settle_lease(seq, delivery_id, outcome) or written
                settled += 1
            except NotFound:
                missing.append(lease)
        if outcome is Outcome.ACK and settled:
            ctx.sensors.on_ack(settled)
        if missing and not settled:
            raise NotFound(f"unknown or expired lease(s): {', '.join(missing[:5])}")
        return _once_written(ev.rid, written, {"settled": settled, "missing": missing})

    def _lease(self, session: Caller, lease: Any) -> tuple[str, int, int]:
        """A lease receipt's queue key, seq and delivery id, once ``session`` may read it."""
        key, seq, delivery_id = _parse_lease(lease)
        queue = Destination.parse(key)
        if session.principal is not None:
            self.context.auth.authorize(session.principal, Permission.READ, str(queue))
        return key, seq, delivery_id

    # ---- the shard each request is served by (its route's) ---------------------------------
    def subscribe_key(self, session: Caller, ev: Subscribe | CursorOpen) -> str | None:
        """A ``Subscribe``'s or ``CursorOpen``'s: None for a topic's."""
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.READ, pattern=True)
        if dest.kind is Kind.TOPIC:
            return None
        role: Any = ev.options.get("role") if isinstance(ev.options, dict) else None
        return ctx.holder_key(dest, role if dest.kind is Kind.CHANNEL else None)

    def pull_key(self, session: Caller, ev: Pull) -> str:
        return str(self.context.destination(session, ev.destination, Permission.READ))

    def settle_key(self, session: Caller, ev: Settle) -> str | None:
        """The queue the leases name (in a cluster, all of them on one shard)."""
        if not isinstance(ev.leases, list) or not ev.leases:
            return None  # (refused here)
        keys = {self._lease(session, lease)[0] for lease in ev.leases}
        if len({self.context.shard_for(k).index for k in keys}) > 1:
            raise BadRequest("in a cluster, settle the leases of one queue at a time")
        return next(iter(keys))

    # ---- cursor subscriptions (live in the core; polled from any connection) --------------
    def cursor_open(self, session: ConsumerSession, ev: CursorOpen) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.READ, pattern=True)
        return ctx.cursors.open(dest, ev.options)

    def _cursor(self, session: ConsumerSession, sub_id: Any) -> Cursor:
        ctx = self.context
        cur = ctx.cursors.get(sub_id)
        if session.principal is not None:
            ctx.auth.authorize(session.principal, Permission.READ, ctx.cursors.destination[sub_id])
        return cur

    def cursor_poll(self, session: ConsumerSession, ev: CursorPoll) -> Any:
        cur = self._cursor(session, ev.id)
        if not isinstance(cur, TopicCursor) and not cur.shard.leading:
            raise Unavailable(f"{cur.key}: its shard is moving to another node; poll again")
        max_, wait = self._max_wait(ev.max, ev.wait)
        c = ev.cursor
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 0):
            raise BadRequest("cursor must be a non-negative integer or null")
        if isinstance(cur, QueueCursor):
            got = _lease_or_wait(cur.queue(), max_, wait, cur.visibility)
            if isinstance(got, list):
                return _polled(ev.rid, c or 0, got)

            async def leased() -> Polled:
                cur.polling += 1
                try:
                    return _polled(ev.rid, c or 0, await got)
                finally:
                    cur.polling -= 1

            return leased()
        first = cur.poll(c, max_)
        if first[2] or wait == 0:
            return Polled(ev.rid, *first)
        cursors = self.context.cursors

        async def later() -> Polled:
            # a timer that wakes the future (not asyncio.wait_for, whose own future and
            # callback each of 10,000 polls woken by one topic message would pay for)
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            timer = loop.call_later(wait, _wake, fut)
            cur.waiters[fut] = None
            cur.polling += 1
            try:
                await fut
            finally:
                timer.cancel()
                cur.polling -= 1
                cur.waiters.pop(fut, None)
            if ev.id not in cursors.subs and isinstance(cur, StreamCursor):
                if not cur.shard.leading:  # it moved with its shard while this poll waited
                    raise Unavailable(f"{cur.key}: its shard moved to another node; poll again")
            return Polled(ev.rid, *cursors.get(ev.id).poll(c, max_))

        return later()

    def cursor_close(self, session: ConsumerSession, ev: CursorClose) -> Any:
        self._cursor(session, ev.id)
        return self.context.cursors.close(ev.id)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


CLAIM = "claim"  # a subscribe option only peers give (relay.py): what a moved one holds


def _claims(session: ConsumerSession, ev: Subscribe) -> tuple[int, dict[str, int]] | None:
    """A moved subscription's ``claim`` option, given by the relay of the node its client
    is connected to (a peer; from anybody else it is an unknown option, refused as such):
    ``{"top": the highest tag handed out, "tags": [[tag, message id], ...]}``, the
    deliveries it has not settled. Returns (top, {message id: tag}); None without one."""
    options = ev.options
    if session.protocol != PEER_CLIENT or not isinstance(options, dict) or CLAIM not in options:
        return None
    claim = options[CLAIM]
    top = claim.get("top") if isinstance(claim, dict) else None
    tags = claim.get("tags", []) if isinstance(claim, dict) else None
    if not isinstance(top, int) or top < 0 or not isinstance(tags, list):
        raise BadRequest("claim must be {top, tags}")
    held: dict[str, int] = {}
    for pair in tags:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)):
            raise BadRequest("claim tags must be [tag, message id] pairs")
        if not (0 < pair[0] <= top and isinstance(pair[1], str)):
            raise BadRequest("a claimed tag must be 1..top, with a message id")
        held[pair[1]] = pair[0]
    return top, held


def _sub(session: ConsumerSession, sid: int) -> Subscription:
    sub = session.subs.get(sid)
    if sub is None:
        raise NotFound(f"no subscription {sid} on this connection")
    return sub


PAGE_WAIT = 5.0  # seconds a pull without a wait waits for paged messages to be read back


def _lease_or_wait(
    holder: Queue, max_: int, wait: float, vis: float
) -> list[tuple[str, Message]] | asyncio.Future[list[tuple[str, Message]]]:
    """Lease what is there now; if nothing and ``wait``, a future of what comes within it.
    A queue whose ready messages are all in the store (paged) has them read back (the lease
    asked for the page): a pull waits for that read even without ``wait`` (it answered
    nothing while the queue held messages), for at most PAGE_WAIT seconds."""
    got = holder.lease(max_, vis, time.time())
    if got:
        return got
    if wait == 0:
        if not holder.paged:
            return got
        wait = PAGE_WAIT
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[tuple[str, Message]]] = loop.create_future()
    holder.waiters.append(Waiter(fut, max_, vis))

    def give_up() -> None:
        if not fut.done():
            fut.set_result([])

    handle = loop.call_later(wait, give_up)
    fut.add_done_callback(lambda f: handle.cancel())
    return fut


def _polled(rid: int, cursor: int, got: list[tuple[str, Message]]) -> Polled:
    return Polled(rid, cursor, [lease for lease, _ in got], [m for _, m in got])


def _pulled(rid: int, got: list[tuple[str, Message]]) -> Pulled:
    return Pulled(rid, [lease for lease, _ in got], [m for _, m in got])


def _tags(tags: Any) -> list[int]:
    if not isinstance(tags, list) or not all(isinstance(t, int) for t in tags):
        raise BadRequest("tags must be a list of integers")
    return tags


def _parse_lease(lease: Any) -> tuple[str, int, int]:
    try:
        key, seq, delivery_id = str(lease).rsplit("|", 2)
        return key, int(seq), int(delivery_id)
    except ValueError:
        raise NotFound(f"malformed lease {str(lease)[:80]!r}") from None


def _once_written(rid: int, written: asyncio.Future[None] | None, answer: Any) -> Any:
    """Answer a settlement (request ``rid``; 0: nobody waits for the answer) once what it
    removed from the store is written: an ack that could not be written (a full disk) is
    answered ``unavailable``, never done (its removal is tried again; until then a
    restart would deliver the message again)."""
    if not rid or written is None:
        return answer
    if written.done() and not written.cancelled() and written.exception() is None:
        return answer

    async def later() -> Any:
        try:
            await asyncio.shield(written)
        except Unavailable as exc:
            raise Unavailable(f"settled, but not written: {exc.message}") from None
        return answer

    return later()
