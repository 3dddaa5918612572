"""The broker: routes each request of a session to the shard that owns its destination,
or to the topic router, after checking the session's permission.

Handlers answer with a plain result (sent as ``Ok``), an ``Event``, or an awaitable (a
persistent publish waits for the store; a pull may wait for messages). Errors are raised as
``RequestError`` and sent as ``Fail`` by the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from polymq.auth import AuthProvider, Permission, Principal
from polymq.errors import BadRequest, NotFound, QueueFull, Unauthorized, Unavailable
from polymq.events import (
    Ack,
    Bind,
    Bindings,
    CursorClose,
    CursorOpen,
    CursorPoll,
    Declare,
    Delete,
    Event,
    Hello,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    MetaGet,
    MetaSet,
    Nack,
    Ping,
    Polled,
    Publish,
    Pull,
    Pulled,
    Purge,
    Settle,
    Stats,
    Subscribe,
    Unbind,
    Unsubscribe,
)
from polymq.types import DeclareOptions, Destination, Kind, Message, SubscribeOptions

from .batches import MAX_BATCH_ID, MAX_BATCH_TTL
from .bindings import BindingTable
from .cursors import Cursor, Cursors, QueueCursor
from .queue import Queue, Waiter
from .routing import TopicRouter, validate_pattern
from .shard import Shard
from .store import SqliteStore
from .subscription import Subscription

if TYPE_CHECKING:
    from .config import CoreSettings
    from .metrics import Sensors
    from .session import Session

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 1024
MAX_KV_VALUE = 1024 * 1024
MAX_KV_LIST = 100_000
MAX_BINDINGS_PER_QUEUE = 100_000
_NO_RETURN = frozenset({"expired", "max-length"})  # dead-letter reasons that never loop back


class TopicSource:
    """The topic side of a subscription: transient fanout through the router."""

    __slots__ = ("router",)

    def __init__(self, router: TopicRouter[Subscription]) -> None:
        self.router = router  # one for every topic subscription: the pattern is theirs

    def detach(self, sub: Subscription, *, requeue: list[Message]) -> None:
        self.router.remove(sub.destination[len("topic/") :], sub)

    def settle(self, sub: Subscription, keys: list[Any], action: str) -> None:
        pass  # topic messages are transient: nothing to redeliver

    def unsent(self, sub: Subscription, msg: Message) -> None:
        pass

    def pump(self) -> None:
        pass


class Broker:
    def __init__(self, settings: CoreSettings, sensors: Sensors, auth: AuthProvider) -> None:
        self.settings = settings
        self.sensors = sensors
        self.auth = auth
        self.server_name = f"polymq-core/{settings.node_name}"
        self.bindings = BindingTable()  # every queue's bindings; the shards store durable ones
        self.shards = [
            Shard(self, i, SqliteStore(settings.data_dir / f"shard-{i:03d}.db"), sensors)
            for i in range(settings.shards)
        ]
        self.topics: TopicRouter[Subscription] = TopicRouter()
        self.topic_source = TopicSource(self.topics)
        self.cursors = Cursors(self)
        self.sessions: set[Session] = set()
        self.started = time.time()
        self.ready = False
        self._handlers: dict[type[Event], Callable[[Session, Any], Any]] = {
            Publish: self._publish,
            Declare: self._declare,
            Delete: self._delete,
            Purge: self._purge,
            Subscribe: self._subscribe,
            Unsubscribe: self._unsubscribe,
            Ack: self._ack,
            Nack: self._nack,
            Pull: self._pull,
            Settle: self._settle,
            Stats: self._stats,
            MetaGet: self._meta_get,
            MetaSet: self._meta_set,
            KvGet: self._kv_get,
            KvPut: self._kv_put,
            KvDelete: self._kv_delete,
            KvList: self._kv_list,
            Bind: self._bind,
            Unbind: self._unbind,
            Bindings: self._bindings,
            Ping: lambda s, e: "pong",
            CursorOpen: self._cursor_open,
            CursorPoll: self._cursor_poll,
            CursorClose: self._cursor_close,
        }

    # ---- life cycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        for shard in self.shards:
            await shard.open()
        self.cursors.start()
        self.ready = True

    async def stop(self, grace: float = 10.0) -> None:
        """Read no more requests, answer those already read (persistent publishes once
        durable; waiting pulls with what they have), say goodbye, flush the stores."""
        self.ready = False
        sessions = list(self.sessions)
        for session in sessions:
            session.quiesce()
        for shard in self.shards:
            shard.wake_waiters()
        for cur in self.cursors.subs.values():
            if not isinstance(cur, QueueCursor):
                cur.wake()
        answered = [asyncio.ensure_future(s.answered()) for s in sessions]
        if answered:
            _, late = await asyncio.wait(answered, timeout=grace)
            if late:
                log.warning("%d sessions still had unanswered requests at shutdown", len(late))
                for t in late:
                    t.cancel()
        for session in sessions:
            session.close("shutdown", "the server is shutting down")
        await self.cursors.stop()
        for shard in self.shards:
            await shard.close()

    def session_opened(self, session: Session) -> None:
        self.sessions.add(session)

    def session_closed(self, session: Session) -> None:
        if session in self.sessions:
            self.sessions.discard(session)
            if session.principal is not None:
                self.sensors.on_connection(session.protocol, -1)

    async def authenticate(self, hello: Hello) -> Principal:
        if not self.ready:
            raise Unavailable("the core is not ready")
        if hello.token:
            return await self.auth.authenticate_token(str(hello.token))
        if hello.user:
            return await self.auth.authenticate_password(str(hello.user), str(hello.password or ""))
        try:
            return await self.auth.anonymous()
        except Unauthorized:
            raise Unauthorized("this core needs credentials: user/password or a token") from None

    # ---- dispatch ------------------------------------------------------------------------
    def handle(self, session: Session, event: Event) -> Any:
        handler = self._handlers.get(type(event))
        if handler is None:
            raise BadRequest(f"{type(event).__name__} is not a request")
        return handler(session, event)

    def shard_for(self, key: str) -> Shard:
        base = key.partition(">")[0]
        return self.shards[zlib.crc32(base.encode()) % len(self.shards)]

    def _dest(
        self, session: Session, text: Any, perm: Permission, *, pattern: bool = False
    ) -> Destination:
        dest = Destination.parse(text, pattern=pattern)
        if dest.is_pattern:
            try:
                validate_pattern(dest.name)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        if session.principal is not None:
            self.auth.authorize(session.principal, perm, str(dest))
        return dest

    def _box_key(self, dest: Destination, role: Any) -> str:
        if role is not None and not isinstance(role, str):
            raise BadRequest("role must be a string")
        return Shard.key_of(dest, role)

    # ---- publish ------------------------------------------------------------------------
    def _publish(self, session: Session, ev: Publish) -> Any:
        if ev.batch_id is None:
            return self._publish_now(session, ev)
        batch_id, ttl = ev.batch_id, ev.batch_ttl
        if not isinstance(batch_id, str) or not 0 < len(batch_id) <= MAX_BATCH_ID:
            raise BadRequest(f"batch_id must be a string of 1..{MAX_BATCH_ID} characters")
        if ttl is None:
            ttl = self.settings.batch_window
        elif isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl:
            raise BadRequest("batch_ttl must be a positive number of seconds")
        dest = self._dest(session, ev.destination, Permission.WRITE)
        key = f"{dest}\x00{ev.role or ''}\x00{batch_id}"
        window = self.shard_for(str(dest)).batches
        answer = window.get(key)
        if answer is not None:
            self.sensors.on_duplicate_batch(session.protocol)
            return answer
        result = self._publish_now(session, ev)
        if isinstance(result, dict):
            result["duplicate"] = False
        else:
            result = _with(result, "duplicate", False)
        return window.remember(key, min(float(ttl), MAX_BATCH_TTL), result)

    def _publish_now(self, session: Session, ev: Publish) -> Any:
        dest = self._dest(session, ev.destination, Permission.WRITE)
        msgs = ev.messages
        if not msgs:
            return {"count": 0}
        max_body = self.settings.max_body
        for m in msgs:
            m.validate(max_body)
        kind = dest.kind.value
        self.sensors.on_publish(session.protocol, kind, len(msgs))
        if dest.kind is Kind.TOPIC:
            n = self.publish_topic(dest.name, msgs)
            result = {"count": len(msgs), "subscribers": n, "queues": 0, "refused": []}
            if not self.bindings.size:  # nothing bound anywhere: the fanout path as it was
                return result
            return self.route(dest.name, msgs, result)
        if dest.kind is Kind.CHANNEL:
            role = ev.role or "client"
            other = "server" if role == "client" else "client"
            if role not in ("server", "client"):
                raise BadRequest("a channel publish needs role 'server' or 'client'")
            key = Shard.key_of(dest, other)
        else:
            key = str(dest)
        fut = self.shard_for(key).publish(key, msgs)
        result = {"count": len(msgs), "ids": [m.id for m in msgs], "seqs": [m.seq for m in msgs]}
        if fut is None:
            return result
        return _then(fut, result)

    def publish_topic(self, name: str, msgs: list[Message]) -> int:
        subs = self.topics.match(name)
        now = time.time()
        for m in msgs:
            m.destination = f"topic/{name}"
            m.timestamp = now
            m.delivery_count = 1
        for sub in subs:
            for m in msgs:
                sub.send(m)
        if subs:
            self.sensors.on_deliver(len(subs) * len(msgs))
        return len(subs)

    def route(self, name: str, msgs: list[Message], result: dict[str, Any]) -> Any:
        """Append a copy of ``msgs`` (just published to ``topic/<name>``) to every queue bound
        by a pattern that matches ``name``, each queue once. Fills in ``result["queues"]``
        (how many took them) and ``result["refused"]`` (the keys of those that refused them:
        full, under ``reject``); returns ``result``, or an awaitable of it when copies of
        persistent messages into durable queues must first be durable."""
        taken, futs = self._route(name, msgs, result["refused"])
        result["queues"] = taken
        if not futs:
            return result
        return _then(futs[0] if len(futs) == 1 else asyncio.gather(*futs), result)

    def _route(
        self, name: str, msgs: list[Message], refused: list[str], skip: str = ""
    ) -> tuple[int, list[asyncio.Future[None]]]:
        """(queues that took a copy, futures of their durable appends); ``skip``: a queue
        not to route to."""
        keys = self.bindings.match(name)
        futs: list[asyncio.Future[None]] = []
        taken = 0
        for key in sorted(keys) if len(keys) > 1 else keys:
            if key == skip:
                continue
            copies = [_copy(m) for m in msgs]
            try:
                fut = self.shard_for(key).publish(key, copies, routed=True)
            except QueueFull:
                refused.append(key)
                continue
            taken += 1
            if fut is not None:
                futs.append(fut)
        return taken, futs

    def dead_letter(self, msg: Message, target: str, reason: str, source: str = "") -> None:
        """Send ``msg``, which left queue ``source`` unacked for ``reason``, to ``target``.

        A topic target goes through the same routing as a publish (subscribers and bindings).
        A message that left on its own (``expired``, or dropped as the oldest of a full
        queue: ``max-length``) never comes back into the queue it left, through a binding or
        directly: a full queue under drop-oldest would loop forever (RabbitMQ drops such
        cycles too). What a consumer rejected, or gave up on, may come back."""
        try:
            dest = Destination.parse(target)
        except BadRequest:
            log.warning("dead-letter destination %r is invalid; message dropped", target)
            return
        headers = {
            **msg.headers,
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
            if self.bindings.size:
                refused: list[str] = []
                _, futs = self._route(dest.name, [dl], refused, skip)
                if refused:
                    log.warning("dead-lettering to %s: refused by %s", target, ", ".join(refused))
                for fut in futs:  # nobody waits for these, but a failure is told
                    fut.add_done_callback(_log_failure)
            return
        key = str(dest)
        if key == skip:
            log.warning("%s dead-letters to itself (%s); message dropped", key, reason)
            return
        try:
            self.shard_for(key).publish(key, [dl])
        except Exception as exc:  # a full dead-letter queue must not break the source queue
            log.warning("dead-lettering to %s failed: %s", key, exc)

    # ---- bindings -----------------------------------------------------------------------
    def _binding(self, session: Session, pattern: Any, queue: Any) -> tuple[str, str]:
        """(pattern without ``topic/``, queue key) of a Bind or Unbind, with permissions:
        CONFIGURE on the queue and READ on the topic pattern (to bind is to subscribe)."""
        q = self._dest(session, queue, Permission.CONFIGURE)
        if q.kind is not Kind.QUEUE:
            raise BadRequest(f"bindings go to queues ('queue/<name>'), not {str(q)[:80]!r}")
        p = self._dest(session, pattern, Permission.READ, pattern=True)
        if p.kind is not Kind.TOPIC:
            raise BadRequest(f"a binding's pattern is 'topic/<pattern>', not {str(p)[:80]!r}")
        return p.name, str(q)

    def _bind(self, session: Session, ev: Bind) -> Any:
        pattern, key = self._binding(session, ev.pattern, ev.queue)
        if self.bindings.count(key) >= MAX_BINDINGS_PER_QUEUE and not self.bindings.has(
            pattern, key
        ):
            raise BadRequest(f"{key} has {MAX_BINDINGS_PER_QUEUE} bindings, the most allowed")
        try:
            added, fut = self.shard_for(key).bind(key, pattern)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        result = {"added": int(added)}
        return result if fut is None else _then(fut, result)

    def _unbind(self, session: Session, ev: Unbind) -> Any:
        pattern, key = self._binding(session, ev.pattern, ev.queue)
        removed, fut = self.shard_for(key).unbind(key, pattern)
        result = {"removed": int(removed)}
        return result if fut is None else _then(fut, result)

    def _bindings(self, session: Session, ev: Bindings) -> Any:
        q = self._dest(session, ev.queue, Permission.READ)
        if q.kind is not Kind.QUEUE:
            raise BadRequest(f"bindings go to queues ('queue/<name>'), not {str(q)[:80]!r}")
        return [f"topic/{p}" for p in self.bindings.of(str(q))]

    # ---- declare / delete / purge -------------------------------------------------------
    def _declare(self, session: Session, ev: Declare) -> Any:
        dest = self._dest(session, ev.destination, Permission.CONFIGURE)
        options = DeclareOptions.from_dict(ev.options)
        if dest.kind is Kind.TOPIC:
            return {"destination": str(dest)}  # topics are transient: nothing to keep
        keys = _keys(dest)
        futs = [f for k in keys if (f := self.shard_for(k).declare(k, options)) is not None]
        result = {"destination": str(dest), "options": options.to_dict()}
        return _then(asyncio.gather(*futs), result) if futs else result

    def _delete(self, session: Session, ev: Delete) -> Any:
        dest = self._dest(session, ev.destination, Permission.CONFIGURE)
        if dest.kind is Kind.TOPIC:
            raise BadRequest("topics are transient and cannot be deleted")
        keys = _keys(dest)
        futs = [f for k in keys if (f := self.shard_for(k).delete(k)) is not None]
        return _then(asyncio.gather(*futs), {"deleted": str(dest)})

    def _purge(self, session: Session, ev: Purge) -> Any:
        dest = self._dest(session, ev.destination, Permission.CONFIGURE)
        if dest.kind is Kind.TOPIC:
            raise BadRequest("topics hold no messages to purge")
        keys = _keys(dest)
        return {"purged": sum(self.shard_for(k).purge(k) for k in keys)}

    # ---- subscribe ----------------------------------------------------------------------
    def _subscribe(self, session: Session, ev: Subscribe) -> Any:
        dest = self._dest(session, ev.destination, Permission.READ, pattern=True)
        options = SubscribeOptions.from_dict(ev.options)
        if ev.sid in session.subs:
            raise BadRequest(f"subscription id {ev.sid} is already in use on this connection")
        if len(session.subs) >= self.settings.max_subscriptions_per_connection:
            raise BadRequest(
                f"at most {self.settings.max_subscriptions_per_connection} subscriptions "
                "per connection"
            )
        if dest.kind is Kind.TOPIC:
            sub = Subscription(session, ev.sid, str(dest), options, self.topic_source)
            try:
                self.topics.add(dest.name, sub)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            session.add_sub(sub)
        else:
            key = self._box_key(dest, options.role)
            box = self.shard_for(key).get(key)
            if dest.kind is not Kind.STREAM and options.offset != "next":
                raise BadRequest("offset applies to streams only")
            sub = Subscription(session, ev.sid, str(dest), options, box)
            session.add_sub(sub)
            box.attach(sub)
        self.sensors.on_subscription(dest.kind.value, 1)
        return {"sid": ev.sid, "destination": str(dest)}

    def _unsubscribe(self, session: Session, ev: Unsubscribe) -> Any:
        if session.remove_sub(ev.sid) is None:
            raise NotFound(f"no subscription {ev.sid} on this connection")
        return None

    def _sub(self, session: Session, sid: int) -> Subscription:
        sub = session.subs.get(sid)
        if sub is None:
            raise NotFound(f"no subscription {sid} on this connection")
        return sub

    def _ack(self, session: Session, ev: Ack) -> Any:
        sub = self._sub(session, ev.sid)
        keys = sub.take(_tags(ev.tags), bool(ev.cumulative))
        if keys:
            self.sensors.on_ack(len(keys))
        sub.source.settle(sub, keys, "ack")
        return {"acked": len(keys)}

    def _nack(self, session: Session, ev: Nack) -> Any:
        sub = self._sub(session, ev.sid)
        keys = sub.take(_tags(ev.tags), bool(ev.cumulative))
        sub.source.settle(sub, keys, "requeue" if ev.requeue else "reject")
        return {"nacked": len(keys)}

    # ---- pull and leases ----------------------------------------------------------------
    def _pull(self, session: Session, ev: Pull) -> Any:
        dest = self._dest(session, ev.destination, Permission.READ)
        if dest.kind is not Kind.QUEUE:
            raise BadRequest("pull works on queues")
        max_, wait = self._max_wait(ev.max, ev.wait)
        vis = ev.visibility
        if not isinstance(vis, int | float) or not 0 < vis <= 43200:
            raise BadRequest("visibility must be 0..43200 seconds")
        key = str(dest)
        box = self.shard_for(key).get(key)
        assert isinstance(box, Queue)
        got = _lease_or_wait(box, max_, wait, float(vis))
        if isinstance(got, list):
            return _pulled(ev.rid, got)

        async def answer() -> Pulled:
            return _pulled(ev.rid, await got)

        return answer()

    def _max_wait(self, max_: Any, wait: Any) -> tuple[int, float]:
        if not isinstance(max_, int) or not 1 <= max_ <= self.settings.max_pull:
            raise BadRequest(f"max must be an integer 1..{self.settings.max_pull}")
        if not isinstance(wait, int | float) or not 0 <= wait <= self.settings.max_wait:
            raise BadRequest(f"wait must be 0..{self.settings.max_wait} seconds")
        return max_, float(wait)

    # ---- cursor subscriptions (live in the core; polled from any connection) --------------
    def _cursor_open(self, session: Session, ev: CursorOpen) -> Any:
        dest = self._dest(session, ev.destination, Permission.READ, pattern=True)
        return self.cursors.open(dest, ev.options)

    def _cursor(self, session: Session, sub_id: Any) -> Cursor:
        cur = self.cursors.get(sub_id)
        if session.principal is not None:
            self.auth.authorize(
                session.principal, Permission.READ, self.cursors.destination[sub_id]
            )
        return cur

    def _cursor_poll(self, session: Session, ev: CursorPoll) -> Any:
        cur = self._cursor(session, ev.id)
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

        async def later() -> Polled:
            fut = asyncio.get_running_loop().create_future()
            cur.waiters.append(fut)
            cur.polling += 1
            try:
                await asyncio.wait_for(fut, wait)
            except TimeoutError:
                pass
            finally:
                cur.polling -= 1
                if fut in cur.waiters:
                    cur.waiters.remove(fut)
            return Polled(ev.rid, *self.cursors.get(ev.id).poll(c, max_))

        return later()

    def _cursor_close(self, session: Session, ev: CursorClose) -> Any:
        self._cursor(session, ev.id)
        self.cursors.close(ev.id)
        return None

    def _settle(self, session: Session, ev: Settle) -> Any:
        action = {"ack": "ack", "nack": "requeue", "requeue": "requeue", "reject": "reject"}.get(
            ev.action
        )
        if action is None:
            raise BadRequest("action must be ack, nack (requeue) or reject (dead-letter)")
        if not isinstance(ev.leases, list) or not ev.leases:
            raise BadRequest("leases must be a non-empty list")
        settled = 0
        missing = []
        for lease in ev.leases:
            key, seq, did = _parse_lease(lease)
            dest = Destination.parse(key)
            if session.principal is not None:
                self.auth.authorize(session.principal, Permission.READ, str(dest))
            box = self.shard_for(key).boxes.get(key)
            try:
                if not isinstance(box, Queue):
                    raise NotFound("lease is unknown")
                box.settle_lease(seq, did, action)
                settled += 1
            except NotFound:
                missing.append(lease)
        if action == "ack" and settled:
            self.sensors.on_ack(settled)
        if missing and not settled:
            raise NotFound(f"unknown or expired lease(s): {', '.join(missing[:5])}")
        return {"settled": settled, "missing": missing}

    # ---- stats, metadata, kv ------------------------------------------------------------
    def _stats(self, session: Session, ev: Stats) -> Any:
        dest = self._dest(session, ev.destination, Permission.READ, pattern=True)
        if dest.kind is Kind.TOPIC:
            return {
                "destination": str(dest),
                "subscribers": len(self.topics.match(dest.name))
                if not dest.is_pattern
                else self.topics.count(dest.name),
            }
        if dest.kind is Kind.CHANNEL:
            out: dict[str, Any] = {"destination": str(dest)}
            for role in ("server", "client"):
                k = Shard.key_of(dest, role)
                out[role] = self.shard_for(k).stats(k)
            return out
        key = str(dest)
        return self.shard_for(key).stats(key)

    def _meta_get(self, session: Session, ev: MetaGet) -> Any:
        dest = self._dest(session, ev.destination, Permission.READ)
        key = self._box_key(dest, "server" if dest.kind is Kind.CHANNEL else None)
        shard = self.shard_for(key)
        if not shard.exists(key):
            raise NotFound(f"{dest} does not exist")
        return dict(shard.get(key).metadata)

    def _meta_set(self, session: Session, ev: MetaSet) -> Any:
        dest = self._dest(session, ev.destination, Permission.CONFIGURE)
        if dest.kind is Kind.TOPIC:
            raise BadRequest("topics are transient and carry no metadata")
        meta = ev.metadata
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise BadRequest("metadata must map strings to strings")
        if len(meta) > 256 or sum(len(k) + len(v) for k, v in meta.items()) > 65536:
            raise BadRequest("metadata is limited to 256 keys and 64 KiB")
        key = self._box_key(dest, "server" if dest.kind is Kind.CHANNEL else None)
        return _then(self.shard_for(key).set_metadata(key, meta), dict(meta))

    def _kv_key(self, session: Session, key: Any, perm: Permission) -> str:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise BadRequest(f"key must be a string of 1..{MAX_KEY_LENGTH} characters")
        if session.principal is not None:
            self.auth.authorize(session.principal, perm, f"kv/{key}")
        return key

    def _kv_get(self, session: Session, ev: KvGet) -> Any:
        key = self._kv_key(session, ev.key, Permission.READ)

        async def get() -> Any:
            value = await self.shard_for("kv/" + key).store.kv_get(key)
            if value is None:
                raise NotFound(f"no value under {key!r}")
            return value

        return get()

    def _kv_put(self, session: Session, ev: KvPut) -> Any:
        key = self._kv_key(session, ev.key, Permission.WRITE)
        if not isinstance(ev.value, bytes) or len(ev.value) > MAX_KV_VALUE:
            raise BadRequest(f"value must be bytes of at most {MAX_KV_VALUE}")
        return _then(self.shard_for("kv/" + key).commit("kv_put", key, ev.value), None)

    def _kv_delete(self, session: Session, ev: KvDelete) -> Any:
        key = self._kv_key(session, ev.key, Permission.WRITE)
        return _then(self.shard_for("kv/" + key).commit("kv_delete", key), None)

    def _kv_list(self, session: Session, ev: KvList) -> Any:
        prefix, limit = ev.prefix, ev.limit
        if not isinstance(prefix, str) or len(prefix) > MAX_KEY_LENGTH:
            raise BadRequest(f"prefix must be a string of at most {MAX_KEY_LENGTH} characters")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_KV_LIST:
            raise BadRequest(f"limit must be 1..{MAX_KV_LIST}")
        if session.principal is not None:  # listing reads every key under the prefix
            self.auth.authorize(session.principal, Permission.READ, f"kv/{prefix}*")

        async def keys() -> list[str]:
            found = await asyncio.gather(*(s.store.kv_keys(prefix, limit) for s in self.shards))
            return sorted(k for ks in found for k in ks)[:limit]

        return keys()

    # ---- introspection -------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "server": self.server_name,
            "uptime_seconds": round(time.time() - self.started, 3),
            "connections": len(self.sessions),
            "topic_subscriptions": len(self.topics),
            "bindings": len(self.bindings),
            "shards": [s.describe() for s in self.shards],
        }

    def depth(self, kind: str) -> int:
        """Ready messages over the in-memory destinations of one kind."""
        prefix = kind + "/"
        return sum(
            box.count if isinstance(box, Queue) else len(box.entries)
            for shard in self.shards
            for key, box in shard.boxes.items()
            if key.startswith(prefix)
        )

    def in_flight(self) -> int:
        return sum(
            len(box.inflight)
            for shard in self.shards
            for box in shard.boxes.values()
            if isinstance(box, Queue)
        )

    def destinations(self, limit: int = 1000) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for shard in self.shards:
            for box in shard.boxes.values():
                out.append(box.stats())
                if len(out) >= limit:
                    return out
        return out


def _keys(dest: Destination) -> list[str]:
    """The shard keys behind a destination: a channel is two queues, one per role."""
    if dest.kind is Kind.CHANNEL:
        return [Shard.key_of(dest, "server"), Shard.key_of(dest, "client")]
    return [str(dest)]


async def _then(fut: Awaitable[Any], result: Any) -> Any:
    await fut
    return result


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


def _log_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("a dead-lettered message may not be durable: %s", fut.exception())


async def _with(answer: Awaitable[dict[str, Any]], key: str, value: Any) -> dict[str, Any]:
    result = await answer
    result[key] = value
    return result


def _lease_or_wait(
    box: Queue, max_: int, wait: float, vis: float
) -> list[tuple[str, Message]] | asyncio.Future[list[tuple[str, Message]]]:
    """Lease what is there now; if nothing and ``wait``, a future of what comes within it."""
    got = box.lease(max_, vis, time.time())
    if got or wait == 0:
        return got
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[tuple[str, Message]]] = loop.create_future()
    box.waiters.append(Waiter(fut, max_, vis))

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
        key, seq, did = str(lease).rsplit("|", 2)
        return key, int(seq), int(did)
    except ValueError:
        raise NotFound(f"malformed lease {str(lease)[:80]!r}") from None
