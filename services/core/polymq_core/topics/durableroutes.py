"""Every shard's durable bindings, as its log has them, on every node of a cluster: which
shards a topic publish reaches durable queues of.

A topic publish is routed into bound queues by the node that leads each queue's shard (the
mesh carries it there, see :mod:`polymq_core.topics.mesh`). A persistent message routed into a
durable queue is confirmed only once that queue's leader committed it, so the node the
publish came to must know which shards' leaders to wait for. The log of each shard holds its
durable queues' bindings (``SAVE_BINDINGS``, ``DELETE_BINDINGS``, ``DELETE_DESTINATION``):
every node applies every entry, so every node knows them. :class:`DurableRoutes` keeps them
for routing (a :class:`~polymq_core.topics.bindings.BindingTable`, so a match costs time in the
topic's length, not in the number of bindings), fed by each shard's
:class:`~polymq_core.replication.replicatedstore.ReplicatedStore` as entries come (appended by this
node or
tailed), and loaded again from the local snapshot when the store opens or installs a copy.

A binding made a moment ago may not be known here yet (its entry is on its way): a publish
in that moment is routed by the queue's leader all the same, but confirmed without waiting
for it, as every publish was before this index existed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..store.schema import WriteKind
from .bindings import BindingTable

__all__ = ["DurableRoutes", "ShardRoutes"]

log = logging.getLogger(__name__)

_SAVE = WriteKind.SAVE_BINDINGS.value
_DELETE = WriteKind.DELETE_BINDINGS.value
_GONE = WriteKind.DELETE_DESTINATION.value
_KINDS = frozenset({_SAVE, _DELETE, _GONE})


class DurableRoutes:
    """The durable bindings of every shard: pattern -> queue key, and each key's shard."""

    def __init__(self, shard_of: Callable[[str], int]) -> None:
        self._table = BindingTable()
        self._shard_of = shard_of
        self._keys: dict[int, set[str]] = {}  # shard -> its queues with bindings

    @property
    def size(self) -> int:
        return self._table.size

    def shards(self, topic: str) -> set[int]:
        """The shards holding a durable queue bound by a pattern that matches ``topic``."""
        if not self._table.size:
            return set()
        return {self._shard_of(key) for key in self._table.match(topic)}

    def of(self, shard: int) -> ShardRoutes:
        """What shard ``shard``'s store feeds."""
        return ShardRoutes(self, shard)

    def load(self, shard: int, pairs: Iterable[tuple[str, str]]) -> None:
        """Shard ``shard``'s bindings are ``pairs`` (queue key, pattern): what was known of
        it before is dropped."""
        for key in self._keys.pop(shard, set()):
            self._table.drop_queue(key)
        for key, pattern in pairs:
            self._add(shard, key, pattern)

    def apply(self, shard: int, writes: Sequence[Sequence[Any]]) -> None:
        """The writes of one entry of shard ``shard``'s log, in order: those that change
        bindings change them here."""
        for write in writes:
            if not write or write[0] not in _KINDS:  # (most are messages: one look each)
                continue
            kind = write[0]
            try:
                if kind == _SAVE:
                    for pattern in write[2]:
                        self._add(shard, str(write[1]), str(pattern))
                elif kind == _DELETE:
                    key = str(write[1])
                    for pattern in write[2]:
                        self._table.remove(str(pattern), key)
                    if not self._table.count(key):
                        self._forget(shard, key)
                elif kind == _GONE:
                    key = str(write[1])
                    self._table.drop_queue(key)
                    self._forget(shard, key)
            except (IndexError, TypeError) as exc:  # (the store's apply says the same)
                log.warning("shard %d: a malformed binding write %r: %s", shard, write, exc)

    def _add(self, shard: int, key: str, pattern: str) -> None:
        try:
            self._table.add(pattern, key)
        except ValueError:
            log.warning("shard %d: ignoring binding %s -> %s", shard, pattern, key)
            return
        self._keys.setdefault(shard, set()).add(key)

    def _forget(self, shard: int, key: str) -> None:
        keys = self._keys.get(shard)
        if keys is not None:
            keys.discard(key)


class ShardRoutes:
    """One shard's side of :class:`DurableRoutes`, as its store calls it."""

    __slots__ = ("routes", "shard")

    def __init__(self, routes: DurableRoutes, shard: int) -> None:
        self.routes = routes
        self.shard = shard

    def load(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.routes.load(self.shard, pairs)

    def apply(self, writes: Sequence[Sequence[Any]]) -> None:
        self.routes.apply(self.shard, writes)
