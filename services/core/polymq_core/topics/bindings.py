"""Bindings: routes from a topic pattern to a queue (what AMQP calls a queue's bindings).

A binding ``topic/<pattern>`` -> ``queue/<name>`` puts a copy of every message published to
a topic that the pattern matches into the queue (with the queue's own seq and id), besides
the topic's live subscribers. Patterns are topic subscription patterns (``*``, ``#`` and a
trailing ``*`` prefix, see :mod:`polymq_core.topics.trie`).

:class:`BindingTable` is the index of every binding of the core: a :class:`TopicRouter` from
pattern to queue key, so that routing a publish costs time in the topic's length and the
number of matches, never in the number of bindings; and each queue's patterns, to list them
and to drop them with the queue. It holds no I/O: keeping a durable queue's bindings in the
store is the business of the queue's shard.

Memory (about 250 bytes a binding with its strings, see the unit tests): a queue's key is one
string object shared by its patterns (``sys.intern``); a queue holds one pattern bare, a few
in a tuple and only more than :data:`_SMALL` in a set.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .trie import TopicRouter

__all__ = ["BindingTable"]

_MISSING: Any = object()
_SMALL = 8  # patterns of one queue kept in a tuple; a set beyond

# The patterns of one queue: a str, a tuple of 2.._SMALL str, or a set of more.
_Patterns = Any


def _has(cur: _Patterns, pattern: str) -> bool:
    return cur == pattern if type(cur) is str else pattern in cur


def _with(cur: _Patterns, pattern: str) -> _Patterns:
    if type(cur) is str:
        return (cur, pattern)
    if type(cur) is tuple:
        return (*cur, pattern) if len(cur) < _SMALL else {*cur, pattern}
    cur.add(pattern)
    return cur


def _without(cur: _Patterns, pattern: str) -> _Patterns | None:
    """The patterns but ``pattern`` (which is among them); None when none is left."""
    if type(cur) is str:
        return None
    if type(cur) is set:
        cur.discard(pattern)
        return cur if len(cur) > _SMALL else tuple(cur)
    rest = tuple(p for p in cur if p != pattern)
    return rest[0] if len(rest) == 1 else rest


def _all(cur: _Patterns) -> list[str]:
    return [cur] if type(cur) is str else sorted(cur)


class BindingTable:
    """Every binding: pattern (without ``topic/``) -> queue key (``queue/<name>``)."""

    __slots__ = ("_by_queue", "_router", "size")

    def __init__(self) -> None:
        self._router: TopicRouter[str] = TopicRouter()
        self._by_queue: dict[str, _Patterns] = {}  # queue key -> its patterns
        self.size = 0  # bindings; an attribute, for the publish path's "any at all?"

    def __len__(self) -> int:
        return self.size

    def has(self, pattern: str, queue: str) -> bool:
        cur = self._by_queue.get(queue, _MISSING)
        return cur is not _MISSING and _has(cur, pattern)

    def add(self, pattern: str, queue: str) -> bool:
        """Bind ``queue`` to ``pattern``; False if it already was. ValueError: bad pattern."""
        if self.has(pattern, queue):
            return False
        queue = sys.intern(queue)
        self._router.add(pattern, queue)  # validates the pattern first
        cur = self._by_queue.get(queue, _MISSING)
        self._by_queue[queue] = pattern if cur is _MISSING else _with(cur, pattern)
        self.size += 1
        return True

    def remove(self, pattern: str, queue: str) -> bool:
        """Unbind; False if ``queue`` was not bound to ``pattern``."""
        cur = self._by_queue.get(queue, _MISSING)
        if cur is _MISSING or not _has(cur, pattern):
            return False
        rest = _without(cur, pattern)
        if rest is None:
            del self._by_queue[queue]
        else:
            self._by_queue[queue] = rest
        self._router.remove(pattern, queue)
        self.size -= 1
        return True

    def drop_queue(self, queue: str) -> list[str]:
        """Remove every binding of ``queue`` (it is deleted); returns the patterns."""
        cur = self._by_queue.pop(queue, _MISSING)
        if cur is _MISSING:
            return []
        patterns = _all(cur)
        for pattern in patterns:
            self._router.remove(pattern, queue)
        self.size -= len(patterns)
        return patterns

    def of(self, queue: str) -> list[str]:
        """The patterns ``queue`` is bound to, sorted."""
        cur = self._by_queue.get(queue, _MISSING)
        return [] if cur is _MISSING else _all(cur)

    def count(self, queue: str) -> int:
        cur = self._by_queue.get(queue, _MISSING)
        if cur is _MISSING:
            return 0
        return 1 if type(cur) is str else len(cur)

    def watch(self, on_interest: Callable[[str, int], None] | None) -> None:
        """Tell ``on_interest`` (pattern, +1 / -1) as patterns gain their first queue and
        lose their last (see :attr:`TopicRouter.on_interest`)."""
        self._router.on_interest = on_interest

    def bound_queues(self) -> list[str]:
        """The keys of the queues with at least one binding."""
        return list(self._by_queue)

    def queues(self) -> int:
        """The number of queues with at least one binding."""
        return len(self._by_queue)

    def match(self, topic: str) -> set[str]:
        """The keys of the queues bound by some pattern matching ``topic``, each once."""
        return self._router.match(topic)
