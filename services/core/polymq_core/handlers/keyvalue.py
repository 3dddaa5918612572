"""The core's key/value store: ``KvGet``, ``KvPut``, ``KvDelete`` and ``KvList``.

A key lives in the store of the shard that owns ``kv/<key>``; writes go through
``Shard.commit`` and are answered once durable. Permissions apply to ``kv/<key>``: READ to
get, WRITE to put or delete. A list reads every key under its prefix: it needs READ by a grant
that covers all of ``kv/<prefix>...`` (``AuthProvider.authorize_prefix``), such as
``kv/<prefix>*`` or a shorter ``kv/...*``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from polymq.errors import BadRequest, NotFound
from polymq.events import KvDelete, KvGet, KvList, KvPut
from polymq_server.auth.provider import Permission

from ..store.writes import DeleteValue, SaveValue
from .answers import then

if TYPE_CHECKING:
    from .caller import Caller
    from .context import HandlerContext

MAX_KEY_LENGTH = 1024
MAX_KV_VALUE = 1024 * 1024
MAX_KV_LIST = 100_000


class KeyValue:
    def __init__(self, context: HandlerContext) -> None:
        self.context = context

    def _key(self, session: Caller, key: Any, perm: Permission) -> str:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise BadRequest(f"key must be a string of 1..{MAX_KEY_LENGTH} characters")
        if session.principal is not None:
            self.context.auth.authorize(session.principal, perm, f"kv/{key}")
        return key

    def get(self, session: Caller, ev: KvGet) -> Any:
        key = self._key(session, ev.key, Permission.READ)

        async def get() -> Any:
            value = await self.context.shard_for("kv/" + key).store.kv_get(key)
            if value is None:
                raise NotFound(f"no value under {key!r}")
            return value

        return get()

    def put(self, session: Caller, ev: KvPut) -> Any:
        key = self._key(session, ev.key, Permission.WRITE)
        if not isinstance(ev.value, bytes) or len(ev.value) > MAX_KV_VALUE:
            raise BadRequest(f"value must be bytes of at most {MAX_KV_VALUE}")
        shard = self.context.shard_for("kv/" + key)
        return then(shard.commit(SaveValue(key, ev.value)), None)

    def delete(self, session: Caller, ev: KvDelete) -> Any:
        key = self._key(session, ev.key, Permission.WRITE)
        shard = self.context.shard_for("kv/" + key)
        return then(shard.commit(DeleteValue(key)), None)

    def key_of(self, session: Caller, ev: KvGet | KvPut | KvDelete) -> str:
        """The shard key a get, put or delete is served by (its route's): ``kv/<key>``."""
        perm = Permission.READ if isinstance(ev, KvGet) else Permission.WRITE
        return "kv/" + self._key(session, ev.key, perm)

    def keys(self, session: Caller, ev: KvList) -> Any:
        prefix, limit = ev.prefix, ev.limit
        if not isinstance(prefix, str) or len(prefix) > MAX_KEY_LENGTH:
            raise BadRequest(f"prefix must be a string of at most {MAX_KEY_LENGTH} characters")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_KV_LIST:
            raise BadRequest(f"limit must be 1..{MAX_KV_LIST}")
        if session.principal is not None:  # listing reads every key under the prefix
            self.context.auth.authorize_prefix(session.principal, Permission.READ, f"kv/{prefix}")
        shards = self.context.shards

        async def listed() -> list[str]:
            found = await asyncio.gather(*(s.store.kv_keys(prefix, limit) for s in shards))
            return sorted(k for ks in found for k in ks)[:limit]

        return listed()
