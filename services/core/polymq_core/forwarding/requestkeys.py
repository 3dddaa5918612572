"""Which shard serves a request: the key its shard is found by, from what the request
names (a destination, a key/value key, a lease), parsed and authorized on the way as the
handler that serves it would. A relay forwards what another node's shard serves
(:mod:`polymq_core.forwarding.relay`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from polymq.errors import BadRequest
from polymq.events import (
    Bind,
    Bindings,
    CursorOpen,
    Declare,
    Delete,
    Event,
    KvDelete,
    KvGet,
    KvPut,
    MetaGet,
    MetaSet,
    Peek,
    Publish,
    Pull,
    Purge,
    Settle,
    Stats,
    Subscribe,
    Unbind,
)
from polymq.types import ChannelRole, Destination, Kind
from polymq_server.auth.provider import Permission

from ..destinations.shard import Shard
from ..handlers.deadletters import stamp

if TYPE_CHECKING:
    from polymq_server.auth.provider import AuthProvider

    from ..handlers.caller import Caller


class KeyHost(Protocol):
    """What finding a request's shard uses of the broker: its auth, the shard of a key and
    its destination checks."""

    auth: AuthProvider

    def shard_for(self, key: str) -> Shard: ...
    def destination(
        self, session: Caller, text: Any, perm: Permission, *, pattern: bool = False
    ) -> Destination: ...
    def holder_key(self, dest: Destination, role: Any) -> str: ...


def shard_key_of(b: KeyHost, s: Caller, ev: Event) -> str | None:
    """The shard key ``ev`` is served by, or None for what every node serves itself
    (topics, listings, pings). Parses and authorizes as the local handler would."""
    t = type(ev)
    if isinstance(ev, Publish):
        dest = b.destination(s, ev.destination, Permission.WRITE)
        if s.principal is not None and ev.messages:  # where replies will be written
            b.auth.authorize_replies(s.principal, ev.messages)
        if dest.kind is Kind.TOPIC:
            return None
        if dest.kind is Kind.CHANNEL:
            if ev.role is not None and not ChannelRole.named(ev.role):
                return None  # the local handler refuses it
            return Shard.key_of(dest, ChannelRole.of(ev.role, ChannelRole.CLIENT).other)
        return str(dest)
    if isinstance(ev, Subscribe | CursorOpen):
        dest = b.destination(s, ev.destination, Permission.READ, pattern=True)
        if dest.kind is Kind.TOPIC:
            return None
        sub_role: Any = ev.options.get("role") if isinstance(ev.options, dict) else None
        return b.holder_key(dest, sub_role if dest.kind is Kind.CHANNEL else None)
    if isinstance(ev, Declare):  # its declarer recorded before it goes (deadletters.py)
        key = _holder_of(b.destination(s, ev.destination, Permission.CONFIGURE))
        stamp(b.auth, s.principal, ev.options)
        return key
    if isinstance(ev, Delete | Purge | MetaSet):
        return _holder_of(b.destination(s, ev.destination, Permission.CONFIGURE))
    if isinstance(ev, Stats | MetaGet):
        return _holder_of(b.destination(s, ev.destination, Permission.READ, pattern=t is Stats))
    if isinstance(ev, Pull):
        return str(b.destination(s, ev.destination, Permission.READ))
    if isinstance(ev, Peek):
        dest = b.destination(s, ev.destination, Permission.READ)
        if dest.kind is Kind.TOPIC:
            return None  # the local handler refuses it
        role = ev.role or ChannelRole.SERVER
        return b.holder_key(dest, role) if dest.kind is Kind.CHANNEL else str(dest)
    if isinstance(ev, Bind | Unbind):
        q = b.destination(s, ev.queue, Permission.CONFIGURE)
        b.destination(s, ev.pattern, Permission.READ, pattern=True)
        return str(q)
    if isinstance(ev, Bindings):
        return str(b.destination(s, ev.queue, Permission.READ))
    if isinstance(ev, KvGet | KvPut | KvDelete):
        key = ev.key
        if not isinstance(key, str) or not key:
            return None  # the local handler refuses it
        if s.principal is not None:
            perm = Permission.READ if t is KvGet else Permission.WRITE
            b.auth.authorize(s.principal, perm, f"kv/{key}")
        return "kv/" + key
    if t is Settle:
        assert isinstance(ev, Settle)
        if not isinstance(ev.leases, list) or not ev.leases:
            return None
        keys = {str(lease).rsplit("|", 2)[0] for lease in ev.leases}
        if s.principal is not None:
            for key in keys:
                b.auth.authorize(s.principal, Permission.READ, key.partition(">")[0])
        shards = {b.shard_for(k).index for k in keys}
        if len(shards) > 1:
            raise BadRequest("in a cluster, settle the leases of one queue at a time")
        return next(iter(keys))
    return None


def _holder_of(dest: Destination) -> str | None:
    if dest.kind is Kind.TOPIC or dest.is_pattern:
        return None
    return Shard.key_of(dest, ChannelRole.SERVER if dest.kind is Kind.CHANNEL else None)


__all__ = ["KeyHost", "shard_key_of"]
