"""Topic routing: which subscribers does a message published to a topic reach?

Topic names are dot-separated segments (``news.sport.football``) made of letters,
digits, ``_``, ``:`` and ``-``. Subscription patterns may use:

``*`` as a whole segment
    exactly one segment: ``news.*`` matches ``news.sport``, not ``news`` nor ``news.a.b``.
``#`` as a whole segment
    zero or more segments: ``news.#`` matches ``news`` and ``news.a.b``; ``#`` matches all.
a trailing ``*`` glued to a segment (ocamlmq-style prefix)
    every topic whose full name starts with the text before the ``*``: ``news.sp*``
    matches ``news.sp``, ``news.sport`` and ``news.spain.x``. A prefix pattern holds no
    other wildcard.

Anything else containing ``*`` or ``#`` is invalid and raises ``ValueError``.

**Reserved topics** (whose first segment is one of polymq's own,
:data:`polymq_server.names.RESERVED_SEGMENTS`: ``system.peers``, ``system.config``, ...,
and AMQP's direct reply-to channels ``amqp-reply.<token>``) are reached only by patterns
that name that segment: a pattern whose first segment is ``*`` or ``#``, or a prefix that
does not start with it, does not match them (MQTT's rule for ``$SYS`` topics). So a ``#``
subscription (AMQP's ``amq.topic`` with ``#``, STOMP ``/topic/#``) hears the applications'
topics, not the broker's announcements nor anyone's replies; ``system.#`` hears those
announcements (and only polymq's own and administrators may subscribe to it:
:mod:`polymq_server.auth.principals`).

:class:`TopicRouter` keeps exact names in a dict, segment-wildcard patterns in a
segment trie and prefixes in a dict keyed by prefix text, so a publish costs time in
the topic's length and the number of matches, not in the number of subscriptions.
A pattern with a single subscriber stores it bare; a ``set`` appears only from two on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from polymq_server.names import RESERVED_SEGMENTS

__all__ = ["TopicRouter", "matches", "validate_pattern", "validate_topic"]

T = TypeVar("T")

_SEGMENT = re.compile(r"[A-Za-z0-9_:\-]+\Z")
_MISSING: Any = object()
_RESERVED_STARTS = tuple(RESERVED_SEGMENTS)

# Subscribers of one pattern: the subscriber itself, or a set of two or more. A set is
# unhashable, so it can never be a subscriber and ``type(v) is set`` is unambiguous.
_Subs = Any


def _check_segments(text: str, what: str, *, wildcards: bool) -> None:
    for seg in text.split("."):
        if wildcards and seg in ("*", "#"):
            continue
        if _SEGMENT.match(seg):
            continue
        if not seg:
            raise ValueError(f"invalid {what} {text!r}: empty segment")
        if "#" in seg or "*" in seg:
            raise ValueError(
                f"invalid {what} {text!r}: '#' and '*' must be whole segments, except a"
                " single '*' ending the pattern as a prefix (e.g. 'news.sp*')"
            )
        raise ValueError(
            f"invalid {what} {text!r}: segment {seg!r} has characters other than"
            " letters, digits, '_', ':' and '-'"
        )


def _is_prefix(pattern: str) -> bool:
    """True for ``abc*`` / ``a.bc*``; a lone ``*`` segment is the one-segment wildcard."""
    return pattern.endswith("*") and len(pattern) > 1 and pattern[-2] != "."


def validate_topic(topic: str) -> None:
    """Raise ``ValueError`` unless ``topic`` is a plain name (no wildcards)."""
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"invalid topic {topic!r}: must be a non-empty string")
    _check_segments(topic, "topic", wildcards=False)


def validate_pattern(pattern: str) -> None:
    """Raise ``ValueError`` with the reason unless ``pattern`` is a legal pattern."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"invalid pattern {pattern!r}: must be a non-empty string")
    if _is_prefix(pattern):
        body = pattern[:-1]
        if "*" in body or "#" in body:
            raise ValueError(
                f"invalid pattern {pattern!r}: a prefix pattern ('...*') cannot hold"
                " other wildcards"
            )
        _check_segments(body, "pattern", wildcards=False)
    else:
        _check_segments(pattern, "pattern", wildcards=True)


def _seg_match(pat: list[str], top: list[str]) -> bool:
    if not pat:
        return not top
    head, rest = pat[0], pat[1:]
    if head == "#":
        return any(_seg_match(rest, top[i:]) for i in range(len(top) + 1))
    return bool(top) and head in ("*", top[0]) and _seg_match(rest, top[1:])


def _reserved(topic: str) -> str:
    """The reserved first segment of ``topic`` ("" if none): reached only by patterns that
    name it (module docstring)."""
    if not topic.startswith(_RESERVED_STARTS):  # (most topics: one test per publish)
        return ""
    first = topic.partition(".")[0]
    return first if first in RESERVED_SEGMENTS else ""


def matches(pattern: str, topic: str) -> bool:
    """Reference matcher: does ``pattern`` match ``topic``? Simple, slow, obviously right."""
    validate_pattern(pattern)
    reserved = _reserved(topic)
    if _is_prefix(pattern):
        if reserved and not pattern.startswith(reserved):
            return False
        return topic.startswith(pattern[:-1])
    segments = pattern.split(".")
    if reserved and segments[0] != reserved:
        return False
    return _seg_match(segments, topic.split("."))


def _put(table: dict[str, _Subs], key: str, sub: object) -> bool:
    """Add ``sub`` under ``key``; False if it was already there."""
    cur = table.get(key, _MISSING)
    if cur is _MISSING:
        table[key] = sub
    elif type(cur) is set:
        if sub in cur:
            return False
        cur.add(sub)
    elif cur is sub or cur == sub:
        return False
    else:
        table[key] = {cur, sub}
    return True


def _drop(table: dict[str, _Subs], key: str, sub: object) -> bool:
    """Remove ``sub`` from ``key``; False if it was not there. Empty keys are deleted."""
    cur = table.get(key, _MISSING)
    if cur is _MISSING:
        return False
    if type(cur) is set:
        if sub not in cur:
            return False
        cur.remove(sub)
        if len(cur) == 1:
            table[key] = cur.pop()
    elif cur is sub or cur == sub:
        del table[key]
    else:
        return False
    return True


def _collect(subs: _Subs, out: set[Any]) -> None:
    if type(subs) is set:
        out.update(subs)
    else:
        out.add(subs)


class _Node:
    """One segment-trie node; ``pattern`` is set where a wildcard pattern ends."""

    __slots__ = ("children", "hash", "pattern", "star")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.pattern: str | None = None

    def is_empty(self) -> bool:
        return not self.children and self.star is None and self.hash is None and not self.pattern


class TopicRouter(Generic[T]):
    """Maps subscription patterns to hashable subscribers. Not thread-safe."""

    def __init__(self) -> None:
        self._exact: dict[str, _Subs] = {}
        self._wild: dict[str, _Subs] = {}  # pattern -> subscribers; the trie points here
        self._root = _Node()
        self._prefix: dict[str, _Subs] = {}  # prefix text (without '*') -> subscribers
        self._prefix_lens: dict[int, int] = {}  # prefix length -> number of prefixes
        self._size = 0
        # Told (pattern, +1) when a pattern gets its first subscriber and (pattern, -1) when
        # it loses its last: the cluster's topic mesh subscribes to what this node wants.
        self.on_interest: Callable[[str, int], None] | None = None

    def __len__(self) -> int:
        return self._size

    def _where(self, pattern: str) -> tuple[dict[str, _Subs], str]:
        validate_pattern(pattern)
        if _is_prefix(pattern):
            return self._prefix, pattern[:-1]
        if "*" in pattern or "#" in pattern:
            return self._wild, pattern
        return self._exact, pattern

    def add(self, pattern: str, sub: T) -> None:
        """Subscribe ``sub`` to ``pattern``; adding an existing pair changes nothing."""
        table, key = self._where(pattern)
        hash(sub)  # an unhashable subscriber fails here, not when a second one joins
        new_key = key not in table
        if not _put(table, key, sub):
            return
        self._size += 1
        if new_key and self.on_interest is not None:
            self.on_interest(pattern, 1)
        if new_key and table is self._prefix:
            self._prefix_lens[len(key)] = self._prefix_lens.get(len(key), 0) + 1
        elif new_key and table is self._wild:
            node = self._root
            for seg in key.split("."):
                node = self._child(node, seg)
            node.pattern = key

    def remove(self, pattern: str, sub: T) -> None:
        """Unsubscribe ``sub`` from ``pattern``; a no-op if it was not subscribed."""
        table, key = self._where(pattern)
        if not _drop(table, key, sub):
            return
        self._size -= 1
        if key not in table and self.on_interest is not None:
            self.on_interest(pattern, -1)
        if key not in table and table is self._prefix:
            left = self._prefix_lens.pop(len(key)) - 1
            if left:
                self._prefix_lens[len(key)] = left
        elif key not in table and table is self._wild:
            self._prune(key)

    def count(self, pattern_or_topic: str) -> int:
        """Number of subscribers registered under exactly this pattern (or name)."""
        table, key = self._where(pattern_or_topic)
        subs = table.get(key, _MISSING)
        if subs is _MISSING:
            return 0
        return len(subs) if type(subs) is set else 1

    @staticmethod
    def _child(node: _Node, seg: str) -> _Node:
        if seg == "*":
            if node.star is None:
                node.star = _Node()
            return node.star
        if seg == "#":
            if node.hash is None:
                node.hash = _Node()
            return node.hash
        if node.children is None:
            node.children = {}
        child = node.children.get(seg)
        if child is None:
            child = node.children[seg] = _Node()
        return child

    def _prune(self, pattern: str) -> None:
        path: list[tuple[_Node, str]] = []
        node = self._root
        for seg in pattern.split("."):
            path.append((node, seg))
            node = self._child(node, seg)  # exists: the pattern was registered
        node.pattern = None
        while path and node.is_empty():
            parent, seg = path.pop()
            if seg == "*":
                parent.star = None
            elif seg == "#":
                parent.hash = None
            else:
                assert parent.children is not None
                del parent.children[seg]
                if not parent.children:
                    parent.children = None
            node = parent

    def match(self, topic: str) -> set[T]:
        """Every subscriber of every pattern matching ``topic``, each once.

        ``topic`` is not validated here (do it where it enters, with ``validate_topic``).
        """
        out: set[T] = set()
        subs = self._exact.get(topic, _MISSING)
        if subs is not _MISSING:
            _collect(subs, out)
        reserved = _reserved(topic)
        if self._prefix_lens:
            n = len(topic)
            least = len(reserved) or 1  # (a prefix must start with the reserved segment)
            lens = self._prefix_lens if len(self._prefix_lens) <= n else range(1, n + 1)
            for k in lens:
                if least <= k <= n:
                    subs = self._prefix.get(topic[:k], _MISSING)
                    if subs is not _MISSING:
                        _collect(subs, out)
        if self._wild:
            self._match_trie(topic.split("."), out, reserved)
        return out

    def _match_trie(self, segs: list[str], out: set[T], reserved: str = "") -> None:
        n = len(segs)
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        if reserved:  # only the patterns that begin with the reserved segment itself
            children = self._root.children
            child = children.get(segs[0]) if children is not None else None
            stack = [(child, 1)] if child is not None else []
        seen: set[tuple[_Node, int]] = set()  # visited states; bounds '#.#' fan-out
        while stack:
            node, i = stack.pop()
            state = (node, i)
            if state in seen:
                continue
            seen.add(state)
            if node.hash is not None:
                stack.extend((node.hash, j) for j in range(i, n + 1))
            if i == n:
                if node.pattern is not None:
                    _collect(self._wild[node.pattern], out)
                continue
            if node.star is not None:
                stack.append((node.star, i + 1))
            if node.children is not None:
                child = node.children.get(segs[i])
                if child is not None:
                    stack.append((child, i + 1))
