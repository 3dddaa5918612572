"""The destinations as things to manage: ``Declare``, ``Delete`` and ``Purge``; a queue's
bindings to topic patterns (``Bind``, ``Unbind``, ``Bindings``); metadata (``MetaGet``,
``MetaSet``), ``Stats`` and ``Peek`` (answered ``Peeked``: see
:mod:`polymq_core.destinations.peek`).

A channel is two queues, one per role (see ``Shard.key_of``); its metadata is kept on the
server side. Topics are transient: they can be declared (nothing is kept) and counted, not
deleted, purged or given metadata. Durable changes go through ``Shard.commit``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from polymq.errors import BadRequest, Conflict, NotFound
from polymq.events import (
    Bind,
    Bindings,
    Declare,
    Delete,
    MetaGet,
    MetaSet,
    Peek,
    Peeked,
    Purge,
    Stats,
    Unbind,
)
from polymq.types import ChannelRole, DeclareOptions, Destination, Kind
from polymq_server.auth.provider import Permission

from ..destinations import peek
from ..destinations.queue import Queue
from ..destinations.shard import Shard
from .answers import then
from .deadletters import stamp

if TYPE_CHECKING:
    from .caller import Caller
    from .context import HandlerContext

MAX_BINDINGS_PER_QUEUE = 100_000


class Catalog:
    def __init__(self, context: HandlerContext) -> None:
        self.context = context

    # ---- declare / delete / purge -------------------------------------------------------
    def declare(self, session: Caller, ev: Declare) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.CONFIGURE)
        stamp(ctx.auth, session.principal, ev.options)  # WRITE on its dead_letter
        options = DeclareOptions.from_dict(ev.options)
        if dest.kind is Kind.TOPIC:
            return {"destination": str(dest)}  # topics are transient: nothing to keep
        keys = _keys(dest)
        futs = [f for k in keys if (f := ctx.shard_for(k).declare(k, options)) is not None]
        result = {"destination": str(dest), "options": options.to_dict()}
        return then(asyncio.gather(*futs), result) if futs else result

    def delete(self, session: Caller, ev: Delete) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.CONFIGURE)
        if dest.kind is Kind.TOPIC:
            raise BadRequest("topics are transient and cannot be deleted")
        keys = _keys(dest)
        futs = [f for k in keys if (f := ctx.shard_for(k).delete(k)) is not None]
        return then(asyncio.gather(*futs), {"deleted": str(dest)})

    def purge(self, session: Caller, ev: Purge) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.CONFIGURE)
        if dest.kind is Kind.TOPIC:
            raise BadRequest("topics hold no messages to purge")
        keys = _keys(dest)
        return {"purged": sum(ctx.shard_for(k).purge(k) for k in keys)}

    # ---- bindings -----------------------------------------------------------------------
    def _binding(self, session: Caller, pattern: Any, queue: Any) -> tuple[str, str]:
        """(pattern without ``topic/``, queue key) of a Bind or Unbind, with permissions:
        CONFIGURE on the queue and READ on the topic pattern (to bind is to subscribe)."""
        q = self.context.destination(session, queue, Permission.CONFIGURE)
        if q.kind is not Kind.QUEUE:
            raise BadRequest(f"bindings go to queues ('queue/<name>'), not {str(q)[:80]!r}")
        p = self.context.destination(session, pattern, Permission.READ, pattern=True)
        if p.kind is not Kind.TOPIC:
            raise BadRequest(f"a binding's pattern is 'topic/<pattern>', not {str(p)[:80]!r}")
        return p.name, str(q)

    def bind(self, session: Caller, ev: Bind) -> Any:
        bindings = self.context.bindings
        pattern, key = self._binding(session, ev.pattern, ev.queue)
        if bindings.count(key) >= MAX_BINDINGS_PER_QUEUE and not bindings.has(pattern, key):
            raise BadRequest(f"{key} has {MAX_BINDINGS_PER_QUEUE} bindings, the most allowed")
        try:
            added, fut = self.context.shard_for(key).bind(key, pattern)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        result = {"added": int(added)}
        return result if fut is None else then(fut, result)

    def unbind(self, session: Caller, ev: Unbind) -> Any:
        pattern, key = self._binding(session, ev.pattern, ev.queue)
        removed, fut = self.context.shard_for(key).unbind(key, pattern)
        result = {"removed": int(removed)}
        return result if fut is None else then(fut, result)

    def bindings(self, session: Caller, ev: Bindings) -> Any:
        q = self.context.destination(session, ev.queue, Permission.READ)
        if q.kind is not Kind.QUEUE:
            raise BadRequest(f"bindings go to queues ('queue/<name>'), not {str(q)[:80]!r}")
        return [f"topic/{p}" for p in self.context.bindings.of(str(q))]

    # ---- stats and metadata -------------------------------------------------------------
    def stats(self, session: Caller, ev: Stats) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.READ, pattern=True)
        if dest.kind is Kind.TOPIC:
            return {
                "destination": str(dest),
                "subscribers": len(ctx.topics.match(dest.name))
                if not dest.is_pattern
                else ctx.topics.count(dest.name),
            }
        if dest.kind is Kind.CHANNEL:  # (it exists once either inbox does)
            out: dict[str, Any] = {"destination": str(dest)}
            for role in ChannelRole:
                k = Shard.key_of(dest, role)
                shard = ctx.shard_for(k)
                known = shard.exists(k)
                out[role] = shard.stats(k) if known else {"destination": k, "messages": 0}
            if not any("options" in out[role] for role in ChannelRole):
                raise NotFound(f"{dest} does not exist")
            return out
        key = str(dest)
        return ctx.shard_for(key).stats(key)

    def peek(self, session: Caller, ev: Peek) -> Peeked:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.READ)
        if dest.kind is Kind.TOPIC:
            raise Conflict("a topic keeps no messages to look at")
        count = ev.count
        if type(count) is not int or not 1 <= count <= peek.MAX_PEEK:
            raise BadRequest(f"count must be an integer 1..{peek.MAX_PEEK}")
        key = self._peeked(dest, ev.role)
        shard = ctx.shard_for(key)
        if not shard.exists(key):
            raise NotFound(f"{dest} does not exist")
        holder = shard.get(key)
        if isinstance(holder, Queue):
            return Peeked(ev.rid, peek.head(holder, count))
        return Peeked(ev.rid, peek.tail(holder, count))

    def meta_get(self, session: Caller, ev: MetaGet) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.READ)
        key = _holder(dest)
        shard = ctx.shard_for(key)
        if not shard.exists(key):
            raise NotFound(f"{dest} does not exist")
        return dict(shard.get(key).metadata)

    def meta_set(self, session: Caller, ev: MetaSet) -> Any:
        ctx = self.context
        dest = ctx.destination(session, ev.destination, Permission.CONFIGURE)
        if dest.kind is Kind.TOPIC:
            raise BadRequest("topics are transient and carry no metadata")
        meta = ev.metadata
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise BadRequest("metadata must map strings to strings")
        if len(meta) > 256 or sum(len(k) + len(v) for k, v in meta.items()) > 65536:
            raise BadRequest("metadata is limited to 256 keys and 64 KiB")
        key = _holder(dest)
        return then(ctx.shard_for(key).set_metadata(key, meta), dict(meta))

    def _peeked(self, dest: Destination, role: Any) -> str:
        """The key of what a peek at ``dest`` (not a topic) looks at: a channel's, the
        inbox of ``role`` (the server's by default)."""
        channel = dest.kind is Kind.CHANNEL
        return self.context.holder_key(dest, (role or ChannelRole.SERVER) if channel else None)

    # ---- the shard each request is served by (its route's) ---------------------------------
    def declare_key(self, session: Caller, ev: Declare) -> str | None:
        """Its declarer is recorded before it goes (:mod:`.deadletters`)."""
        key = self.configure_key(session, ev)
        stamp(self.context.auth, session.principal, ev.options)
        return key

    def configure_key(self, session: Caller, ev: Declare | Delete | Purge | MetaSet) -> str | None:
        dest = self.context.destination(session, ev.destination, Permission.CONFIGURE)
        return _holder_of(dest)

    def read_key(self, session: Caller, ev: Stats | MetaGet) -> str | None:
        """A ``Stats``'s (of a pattern too: served here) or a ``MetaGet``'s."""
        pattern = isinstance(ev, Stats)
        dest = self.context.destination(session, ev.destination, Permission.READ, pattern=pattern)
        return _holder_of(dest)

    def peek_key(self, session: Caller, ev: Peek) -> str | None:
        dest = self.context.destination(session, ev.destination, Permission.READ)
        return None if dest.kind is Kind.TOPIC else self._peeked(dest, ev.role)

    def bind_key(self, session: Caller, ev: Bind | Unbind) -> str:
        q = self.context.destination(session, ev.queue, Permission.CONFIGURE)
        self.context.destination(session, ev.pattern, Permission.READ, pattern=True)
        return str(q)

    def bindings_key(self, session: Caller, ev: Bindings) -> str:
        return str(self.context.destination(session, ev.queue, Permission.READ))


def _holder(dest: Destination) -> str:
    """The shard key of ``dest``: a channel's, its server inbox's (which keeps its metadata)."""
    return Shard.key_of(dest, ChannelRole.SERVER if dest.kind is Kind.CHANNEL else None)


def _holder_of(dest: Destination) -> str | None:
    """The shard key a request about ``dest`` is served by: None for a topic or a pattern
    (served here)."""
    return None if dest.kind is Kind.TOPIC or dest.is_pattern else _holder(dest)


def _keys(dest: Destination) -> list[str]:
    """The shard keys behind a destination: a channel is two queues, one per role."""
    if dest.kind is Kind.CHANNEL:
        return [Shard.key_of(dest, role) for role in ChannelRole]
    return [str(dest)]
