"""Who a client is and what it may do, and the interface that says so
(:mod:`polymq_server.auth.provider`
draws the whole picture).

A :class:`Principal` is a client once authenticated: a name, whether it is anonymous, its
grants and its management tags. A :class:`Grant` is a pattern (fnmatch, matched against
``kind/name`` or ``kv/<key>``) and some of the three :class:`Permission` values. An
:class:`AuthProvider` turns credentials into a principal (or ``Unauthorized``) and checks a
principal's permission (or raises ``Forbidden``); the providers are in
:mod:`polymq_server.auth.provider` and :mod:`polymq_server.auth.usersfile`.

Whatever its grants say, a principal uses the names polymq keeps for itself
(:func:`polymq_server.names.reserved`: ``system.*`` and the direct reply-to channels, as
destinations, topic patterns and binding keys) only if it is trusted (:func:`trusted`):
polymq's own links (``polymq-internal``: the service token, the cluster secret) and users
tagged ``administrator``. Two exceptions: a responder writes its reply to a direct reply-to
channel by its exact name (as its grants allow), and in anonymous mode, where a frontend
run apart logs in to the core as anonymous like any wire client, reading ``system.*``
(what such a frontend follows: reloads, alarms, connection requests) and answering on
``system.connections.reply.*`` stay open, while nobody but polymq's own and administrators
publishes a control message (``system.config``, ``system.connections.list``/``close``).
A message's ``reply_to`` naming a destination is authorized as a write there
(:meth:`AuthProvider.authorize_replies`): whoever answers, the asker must be able to.
"""

from __future__ import annotations

import abc
import enum
import fnmatch
import functools
import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NoReturn

from polymq.errors import Forbidden
from polymq.types import Message

from ..names import REPLY_SEGMENT, REPLY_TOPICS, TEMP_SEGMENT, reply_target, reserved

__all__ = [
    "ADMIN_TAGS",
    "ALL_PERMISSIONS",
    "INTERNAL_PRINCIPAL",
    "AuthProvider",
    "Grant",
    "Permission",
    "Principal",
    "trusted",
]


class Permission(enum.Enum):
    CONFIGURE = "configure"  # declare, delete, purge, set metadata
    WRITE = "write"  # publish
    READ = "read"  # subscribe, pull, ack, stats


ALL_PERMISSIONS = frozenset(Permission)
# the management tags a user may have: what the admin API lets them do (RabbitMQ's names)
ADMIN_TAGS = frozenset({"monitoring", "administrator"})


@dataclass(frozen=True, slots=True)
class Grant:
    """``permissions`` on every destination whose ``kind/name`` matches ``pattern`` (fnmatch)."""

    pattern: str
    permissions: frozenset[Permission]

    def allows(self, permission: Permission, destination: str) -> bool:
        return permission in self.permissions and fnmatch.fnmatchcase(destination, self.pattern)

    def covers(self, permission: Permission, shape: str) -> bool:
        """``permission`` on every name of ``shape``, a destination whose :data:`_ANY`
        characters each stand for any string: only a ``*`` of the pattern may take one
        (a ``?``, a ``[...]`` or a literal character names one character, not all)."""
        return permission in self.permissions and _covering(self.pattern).match(shape) is not None

    def allows_prefix(self, permission: Permission, prefix: str) -> bool:
        """``permission`` on every string that starts with ``prefix``: the pattern ends in a
        ``*`` and matches ``prefix`` itself (not ``prefix + "*"`` as text, which ``?`` and
        ``[...]`` would match too)."""
        return (
            permission in self.permissions
            and self.pattern.endswith("*")
            and fnmatch.fnmatchcase(prefix, self.pattern)
        )


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a client is, once authenticated, and what it may do."""

    name: str
    anonymous: bool
    grants: tuple[Grant, ...] = ()
    tags: frozenset[str] = frozenset()  # management tags (ADMIN_TAGS): the admin API's
    # what it logged in with, as its provider checks it again after a users reload
    # (AuthProvider.refresh; FileProvider: the password's hash or the token's sha256)
    login: str = field(default="", repr=False, compare=False)

    def allows(self, permission: Permission, destination: str) -> bool:
        """``permission`` on ``destination``; for a topic pattern, on every topic it can
        match (not its text: ``topic/d.?`` would allow ``topic/d.*``, and ``topic/e.*``
        ``topic/e.#``, which hears ``topic/e`` too)."""
        if destination.startswith("topic/") and ("*" in destination or "#" in destination):
            shapes = _shapes(destination)
            return shapes is not None and all(
                any(g.covers(permission, shape) for g in self.grants) for shape in shapes
            )
        return any(g.allows(permission, destination) for g in self.grants)

    def allows_prefix(self, permission: Permission, prefix: str) -> bool:
        return any(g.allows_prefix(permission, prefix) for g in self.grants)


_ANY = "\x00"  # in a shape: any string (no name holds a NUL)
_MOST_HASHES = 8  # a pattern with more '#' words is judged by no grant (2^8 shapes)


def _shapes(pattern: str) -> list[str] | None:
    """The shapes of the topics a topic pattern matches: its ``*`` and ``#`` as
    :data:`_ANY` (one or more words), and each ``#`` word also dropped with a dot beside
    it (``#`` matches no word too: ``topic/e.#`` hears ``topic/e``). None past
    :data:`_MOST_HASHES` of them."""
    words = pattern[6:].split(".")
    hashes = [i for i, w in enumerate(words) if w == "#"]
    if len(hashes) > _MOST_HASHES:
        return None
    shapes = []
    for dropped in itertools.product((False, True), repeat=len(hashes)):
        gone = {i for i, d in zip(hashes, dropped, strict=True) if d}
        name = ".".join(w for i, w in enumerate(words) if i not in gone)
        if name:
            shapes.append("topic/" + name.replace("*", _ANY).replace("#", _ANY))
    return shapes


@functools.lru_cache(maxsize=1024)
def _covering(pattern: str) -> re.Pattern[str]:
    """A grant's fnmatch pattern as a regular expression in which only ``*`` matches
    :data:`_ANY` (``?`` and sets never do; fnmatch's own reading of sets)."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(f"[^{_ANY}]")
        elif c == "[":
            j = i + 1 if i < n and pattern[i] == "!" else i
            j = j + 1 if j < n and pattern[j] == "]" else j
            end = pattern.find("]", j)
            if end < 0:
                out.append(re.escape(c))
                continue
            inner = fnmatch.translate(pattern[i - 1 : end + 1])[len("(?s:") : -len(")\\Z")]
            out.append(f"(?!{_ANY}){inner}")
            i = end + 1
        else:
            out.append(re.escape(c))
    return re.compile("(?s:" + "".join(out) + r")\Z")


INTERNAL_PRINCIPAL = "polymq-internal"  # who the service token logs in as: polymq's own links


def trusted(principal: Principal) -> bool:
    """May ``principal`` use polymq's reserved names (polymq's own links, which log in with
    the ``administrator`` tag, and administrators)?"""
    return "administrator" in principal.tags


class AuthProvider(abc.ABC):
    """Turns credentials into a ``Principal`` (or ``Unauthorized``) and checks permissions."""

    @property
    def open(self) -> bool:
        """True in anonymous mode: nobody logs in anywhere (the admin API included)."""
        return False

    @abc.abstractmethod
    async def authenticate_password(self, user: str, password: str) -> Principal: ...

    @abc.abstractmethod
    async def authenticate_token(self, token: str) -> Principal: ...

    @abc.abstractmethod
    async def anonymous(self) -> Principal:
        """The principal of a client that presented no credentials; Unauthorized if refused."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the start-up log saying how clients are authenticated."""

    def refresh(self, principal: Principal) -> Principal | None:
        """``principal`` as the users are now (after a reload): with its grants and tags of
        now, or None if it may no longer be logged in (its user was removed, the password or
        token it logged in with is no longer the user's, anonymous access was turned off).
        Cheap (no hashing): every open session asks it after each users reload. A provider
        whose users never change answers ``principal``."""
        return principal

    def named(self, user: str) -> Principal | None:
        """The principal user ``user`` ("" the anonymous client) is now, grants as they are
        since the last reload; None if there is no such user (or anonymous access is off).
        For what outlives a session: a queue's dead letters are sent on its declarer's
        permission (``polymq_core.handlers.deadletters``). Without a users list: None."""
        return None

    def may(self, user: str, permission: Permission, destination: str) -> bool:
        """Whether ``named(user)`` holds ``permission`` on ``destination`` now."""
        principal = self.named(user)
        if principal is None:
            return False
        try:
            self.authorize(principal, permission, destination)
        except Forbidden:
            return False
        return True

    def authorize(self, principal: Principal, permission: Permission, destination: str) -> None:
        """Return if ``principal`` holds ``permission`` on ``destination``, else raise Forbidden."""
        if not principal.allows(permission, destination):
            _forbid(principal, permission, destination)
        if trusted(principal):
            return
        segment = reserved(destination)
        if segment is not None and not self._reserved_open(permission, destination, segment):
            who = "anonymous client" if principal.anonymous else f"user {principal.name!r}"
            raise Forbidden(
                f"{who} has no {permission.value} permission on {destination[:300]!r}: "
                f"{segment!r} names are reserved for polymq's own use"
            )

    def _reserved_open(self, permission: Permission, destination: str, segment: str) -> bool:
        """The reserved names an untrusted principal may still use (module docstring)."""
        if segment in (REPLY_SEGMENT, TEMP_SEGMENT):  # a reply, to one by its exact name
            exact = "*" not in destination and "#" not in destination
            return exact and permission is Permission.WRITE
        if not self.open or segment != "system":
            return False
        if permission is Permission.READ:
            return True
        return permission is Permission.WRITE and destination.startswith(REPLY_TOPICS)

    def authorize_replies(self, principal: Principal, messages: Iterable[Message]) -> None:
        """Return if ``principal`` may write where each message's ``reply_to`` names (a
        responder, or polymq, writes its answer there: :func:`~polymq_server.names.
        reply_target`), else raise Forbidden. Trusted principals' messages are not looked at
        (a frontend checked its own users')."""
        if trusted(principal):
            return
        for target in {reply_target(m.reply_to) for m in messages}:
            if target is not None:
                self.authorize(principal, Permission.WRITE, target)

    def authorize_prefix(self, principal: Principal, permission: Permission, prefix: str) -> None:
        """Return if ``principal`` holds ``permission`` on every string that starts with
        ``prefix`` (listing the keys ``kv/<prefix>...``), else raise Forbidden."""
        if not principal.allows_prefix(permission, prefix):
            _forbid(principal, permission, prefix + "*")


def _forbid(principal: Principal, permission: Permission, destination: str) -> NoReturn:
    who = "anonymous client" if principal.anonymous else f"user {principal.name!r}"
    raise Forbidden(f"{who} has no {permission.value} permission on {destination[:300]!r}")
