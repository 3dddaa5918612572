"""The users file: users, hashed passwords, hashed tokens and grants from JSON
(:class:`FileProvider`, ``--auth file:/path/users.json``)::

  {
    "users": {
      "alice": {"password_hash": "scrypt$131072$8$1$<salt b64>$<hash b64>",
                "grants": [{"pattern": "queue/*", "permissions": ["read", "write"]},
                           {"pattern": "kv/avro/schemas/*", "permissions": ["read"]}]},
      "bot": {"grants": [{"pattern": "*", "permissions": ["read", "write", "configure"]}]}
    },
    "tokens": {"<sha256 hex of the token>": {"user": "bot"}},
    "anonymous": {"grants": [{"pattern": "topic/public.*", "permissions": ["read"]}]}
  }

A user's ``tags`` (optional: ``["monitoring"]`` or ``["administrator"]``, RabbitMQ's
management tags) open the core's admin API and console to them: ``monitoring`` may read
everything there, ``administrator`` may also change things (publish, purge, delete, close
connections); a user without either is refused there (see ``polymq_core.admin.auth``).

``password_hash`` is optional (a user without one logs in by token only); ``tokens`` and
``anonymous`` are optional, and without ``anonymous`` clients must log in. Tokens are stored
as the sha256 hex of the token, never in clear. Unknown keys are errors. Make the values
with ``python -m polymq_server.auth.provider hash-password`` (reads the password from stdin) and
``python -m polymq_server.auth.provider new-token``.

A grant's pattern is checked when the file is read: one that can never match (no
``queue/``, ``topic/``, ``stream/``, ``channel/`` or ``kv/`` at its head), ``kv/`` alone, an
unclosed ``[`` or a ``kv/`` pattern ending in ``/`` is refused with a hint. A file that does
not read leaves the previous configuration in place (:meth:`FileProvider.reload`).

A reload reaches the sessions already open (:meth:`FileProvider.refresh`): a user removed is
logged out everywhere (as RabbitMQ closes a deleted user's connections), and so is a login
whose password changed or whose token was withdrawn (a changed password is taken for a
compromised one; RabbitMQ leaves those connections open); a user whose grants changed goes
on with the new ones.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from polymq.errors import Unauthorized
from polymq.types import Kind

from .passwords import check_password, hash_token, parse_password_hash
from .principals import ADMIN_TAGS, AuthProvider, Grant, Permission, Principal

__all__ = ["FileProvider"]

_KINDS = {k.value for k in Kind}
_KV = "kv"  # the key/value store's keys are kv/<key>
_SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
_BAD_LOGIN = "invalid user name or password"
_PERMISSION_NAMES = {m.value for m in Permission}
_USE_PERMS = "use read, write or configure"


@dataclass(frozen=True, slots=True)
class _User:
    password_hash: str | None
    grants: tuple[Grant, ...]
    tags: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Config:
    users: dict[str, _User]
    tokens: dict[str, str]  # sha256 hex -> user name
    anonymous: tuple[Grant, ...] | None


class FileProvider(AuthProvider):
    """Users, hashed passwords, hashed tokens and grants from a JSON file (see module doc)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._config = self._load()

    def reload(self) -> None:
        """Re-read the file. On error the old configuration stays and ValueError is raised."""
        self._config = self._load()

    async def authenticate_password(self, user: str, password: str) -> Principal:
        found = self._config.users.get(user)
        encoded = found.password_hash if found else None
        ok = await check_password(password, encoded)  # (off the loop; unknown: as long)
        if found is None or not ok:
            raise Unauthorized(_BAD_LOGIN)
        # (as the users are now: a reload may have come while the hash was checked)
        principal = self.refresh(Principal(user, anonymous=False, login=encoded or ""))
        if principal is None:
            raise Unauthorized(_BAD_LOGIN)
        return principal

    async def authenticate_token(self, token: str) -> Principal:
        config = self._config
        digest = hash_token(token)
        name = config.tokens.get(digest)
        if name is None:
            raise Unauthorized("invalid token")
        found = config.users[name]
        return Principal(name, False, found.grants, found.tags, digest)

    def refresh(self, principal: Principal) -> Principal | None:
        """As the file is now: a user's password (the hash it logged in with) and tokens
        are its credentials; a user removed, or whose password changed, or whose token was
        withdrawn, is logged in no more (a token login stays when only the password changed,
        and the other way round)."""
        config = self._config
        if principal.anonymous:
            if config.anonymous is None:
                return None
            return _same(principal, config.anonymous, frozenset())
        found = config.users.get(principal.name)
        if found is None:
            return None
        login = principal.login
        if login != found.password_hash and config.tokens.get(login) != principal.name:
            return None
        return _same(principal, found.grants, found.tags)

    async def anonymous(self) -> Principal:
        grants = self._config.anonymous
        if grants is None:
            raise Unauthorized("anonymous access is off: log in with a password or a token")
        return Principal("anonymous", anonymous=True, grants=grants)

    def named(self, user: str) -> Principal | None:
        config = self._config
        if not user:
            grants = config.anonymous
            return None if grants is None else Principal("anonymous", True, grants)
        found = config.users.get(user)
        return None if found is None else Principal(user, False, found.grants, found.tags)

    def describe(self) -> str:
        c = self._config
        anon = "off" if c.anonymous is None else f"on with {len(c.anonymous)} grant(s)"
        counts = f"{len(c.users)} user(s), {len(c.tokens)} token(s)"
        return f"file authentication from {self.path}: {counts}, anonymous access {anon}"

    def _load(self) -> _Config:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            return _parse_config(data)
        except OSError as e:
            raise ValueError(f"auth file {self.path}: cannot read it: {e.strerror or e}") from None
        except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"auth file {self.path}: {e}") from None


def _same(principal: Principal, grants: tuple[Grant, ...], tags: frozenset[str]) -> Principal:
    """``principal`` with ``grants`` and ``tags`` (itself if they are its own)."""
    if principal.grants == grants and principal.tags == tags:
        return principal
    return Principal(principal.name, principal.anonymous, grants, tags, principal.login)


def _object(v: Any, what: str, allowed: Iterable[str] | None = None) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{what} must be a JSON object")
    unknown = sorted(set(v) - set(allowed)) if allowed is not None else []
    if unknown:
        raise ValueError(f"{what} has unknown key(s) {', '.join(map(repr, unknown))}")
    return v


def _pattern_problem(pattern: str) -> str | None:
    """Why a grant's pattern is refused, or None."""
    head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    kind, sep, _ = head.partition("/")
    known = kind in _KINDS or (kind == _KV and sep == "/")
    if (sep or head == pattern) and not known:
        return (
            "can never match: destinations start with queue/, topic/, stream/ or channel/, "
            "key/value keys with kv/"
        )
    if kind != _KV or not sep:
        return None
    if pattern == "kv/":
        return "names no key: write kv/<key>, or kv/<prefix>* for every key under a prefix"
    if _unclosed_bracket(pattern):
        return "has a '[' without a closing ']': write '[[]' to match a '[' itself"
    if head == pattern and pattern.endswith("/"):
        return (
            f"is the one key {pattern[3:]!r}, not the keys under it: write {pattern + '*'!r} "
            f"for those (or {pattern[:-1] + '[/]'!r} for that key alone)"
        )
    return None


def _unclosed_bracket(pattern: str) -> bool:
    """True if a ``[`` starts no set (fnmatch would take it for itself), as ``fnmatch.translate``
    reads sets: ``[!`` negates, and a ``]`` right after ``[`` or ``[!`` is a member."""
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] != "[":
            i += 1
            continue
        j = i + 1
        if j < n and pattern[j] == "!":
            j += 1
        if j < n and pattern[j] == "]":
            j += 1
        end = pattern.find("]", j)
        if end < 0:
            return True
        i = end + 1
    return False


def _parse_grants(v: Any, what: str) -> tuple[Grant, ...]:
    if not isinstance(v, list):
        raise ValueError(f"{what}: 'grants' must be a list")
    out = []
    for i, g in enumerate(v, 1):
        g = _object(g, f"{what}, grant {i}", ("pattern", "permissions"))
        pattern, perms = g.get("pattern"), g.get("permissions")
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{what}, grant {i}: 'pattern' must be a non-empty string")
        problem = _pattern_problem(pattern)
        if problem:
            raise ValueError(f"{what}, grant {i}: pattern {pattern!r} {problem}")
        if not isinstance(perms, list) or not perms or not all(isinstance(p, str) for p in perms):
            raise ValueError(f"{what}, grant {i}: 'permissions' must be a non-empty list")
        for p in perms:
            if p not in _PERMISSION_NAMES:
                raise ValueError(f"{what}, grant {i}: unknown permission {p!r} ({_USE_PERMS})")
        out.append(Grant(pattern, frozenset(Permission(p) for p in perms)))
    return tuple(out)


def _parse_tags(user: dict[str, Any], what: str) -> frozenset[str]:
    tags = user.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"{what}: 'tags' must be a list of strings")
    unknown = sorted(set(tags) - ADMIN_TAGS)
    if unknown:
        raise ValueError(
            f"{what}: unknown tag(s) {', '.join(map(repr, unknown))} "
            f"(use {' or '.join(sorted(ADMIN_TAGS))})"
        )
    return frozenset(tags)


def _parse_config(data: Any) -> _Config:
    data = _object(data, "the top level", ("users", "tokens", "anonymous"))
    users: dict[str, _User] = {}
    for name, u in _object(data.get("users", {}), "'users'").items():
        what = f"user {name!r}"
        if not name:
            raise ValueError("a user name is empty")
        u = _object(u, what, ("password_hash", "grants", "tags"))
        pw = u.get("password_hash")
        if pw is not None:
            try:
                parse_password_hash(pw)
            except ValueError as e:
                raise ValueError(f"{what}: {e}") from None
        users[name] = _User(pw, _parse_grants(u.get("grants", []), what), _parse_tags(u, what))
    tokens: dict[str, str] = {}
    for digest, t in _object(data.get("tokens", {}), "'tokens'").items():
        what = f"token {digest[:12]!r}"
        if not _SHA256_HEX.match(digest):
            raise ValueError(f"{what}: tokens are keyed by the token's sha256 hex, not in clear")
        user = _object(t, what, ("user",)).get("user")
        if not isinstance(user, str) or user not in users:
            raise ValueError(f"{what}: 'user' must name a user in 'users', not {user!r}")
        tokens[digest] = user
    anonymous = None
    if "anonymous" in data:
        anon = _object(data["anonymous"], "'anonymous'", ("grants",))
        anonymous = _parse_grants(anon.get("grants", []), "'anonymous'")
    return _Config(users, tokens, anonymous)
