"""Authentication and authorization: the one interface every frontend uses.

::

    frontend (HTTP, STOMP, AMQP, ...)
      │  Basic user:password, Bearer token, STOMP login/passcode, AMQP PLAIN, or nothing
      ▼
    AuthProvider.authenticate_password / authenticate_token / anonymous
      │  -> Principal (name, anonymous, grants)          or Unauthorized (401)
      ▼
    AuthProvider.authorize(principal, permission, "kind/name")
         -> None                                          or Forbidden (403)

Permissions are RabbitMQ's three: ``CONFIGURE`` (declare, delete, purge, set metadata),
``WRITE`` (publish) and ``READ`` (subscribe, pull, ack, stats).

A ``Grant`` is a pattern and a set of permissions. The pattern is matched with
``fnmatch.fnmatchcase`` against the whole destination string ``kind/name``: ``*`` matches any
run of characters, ``/`` and ``.`` included; ``?`` one character; ``[abc]`` one of a set.
So ``queue/orders.*``, ``topic/*``, ``*/public.*`` and ``*`` (everything). Case matters.
A topic subscription pattern is checked as text too: ``topic/news.#`` is allowed by
``topic/news.*`` or ``topic/*``, not by ``topic/news.sport``. Because ``?`` and ``[...]`` also
match the characters ``*`` and ``#`` of a subscription pattern, grant with ``*`` only where
topic wildcards may be used.

The core's key/value keys are ``kv/<key>``: ``READ`` gets a key, ``WRITE`` puts or deletes
it, and listing the keys under a prefix needs ``READ`` on every key that could start with it
(``authorize_prefix``: a pattern that ends in ``*`` and matches the prefix itself). So
``kv/avro/schemas/*`` (the schema registry's schemas by id), ``kv/avro/*`` (all of the
registry: ``subjects/``, ``versions/``, ``schemas/``), ``kv/amqp/?/prod/*`` (the AMQP topology
records of the vhost ``prod``; ``kv/amqp/i/*`` holds the AMQP instances' heartbeats) and
``kv/*`` (every key). A key/value pattern must name a key (not ``kv/`` alone), close every
``[``, and not end in ``/`` without a wildcard (``kv/avro/`` would be the one key ``avro/``;
``kv/avro/*`` is every key under it).

Providers (``load_provider`` picks one from a spec string):

- ``AnonymousProvider`` (spec ``None``, ``""`` or ``"anonymous"``): a development mode. No
  credentials are checked; every client, logged in or not, may do everything.
- ``FileProvider`` (spec ``"file:/path/users.json"``): users, tokens and anonymous grants from
  a JSON file::

    {
      "users": {
        "alice": {"password_hash": "scrypt$16384$8$1$<salt b64>$<hash b64>",
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
  connections); a user without either is refused there (see ``polymq_core.adminauth``).

  ``password_hash`` is optional (a user without one logs in by token only); ``tokens`` and
  ``anonymous`` are optional, and without ``anonymous`` clients must log in. Tokens are stored
  as the sha256 hex of the token, never in clear. Unknown keys are errors. Make the values
  with ``python -m polymq_server.auth hash-password`` (reads the password from stdin) and
  ``python -m polymq_server.auth new-token``.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import base64
import binascii
import enum
import fnmatch
import functools
import getpass
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from polymq.errors import Forbidden, Unauthorized
from polymq.types import Kind

__all__ = [
    "ADMIN_TAGS",
    "ALL_PERMISSIONS",
    "INTERNAL_PRINCIPAL",
    "AnonymousProvider",
    "AuthProvider",
    "FileProvider",
    "Grant",
    "Permission",
    "Principal",
    "WithServiceToken",
    "authenticate_http",
    "generate_token",
    "hash_password",
    "hash_token",
    "load_provider",
    "parse_authorization",
    "verify_password",
]

_KINDS = {k.value for k in Kind}
_KV = "kv"  # the key/value store's keys are kv/<key>
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _SALT_BYTES, _DKLEN = 2**14, 8, 1, 16, 32
_SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
_BAD_LOGIN = "invalid user name or password"


class Permission(enum.Enum):
    CONFIGURE = "configure"  # declare, delete, purge, set metadata
    WRITE = "write"  # publish
    READ = "read"  # subscribe, pull, ack, stats


ALL_PERMISSIONS = frozenset(Permission)
# the management tags a user may have: what the admin API lets them do (RabbitMQ's names)
ADMIN_TAGS = frozenset({"monitoring", "administrator"})
_PERMISSION_NAMES = {m.value for m in Permission}
_USE_PERMS = "use read, write or configure"


@dataclass(frozen=True, slots=True)
class Grant:
    """``permissions`` on every destination whose ``kind/name`` matches ``pattern`` (fnmatch)."""

    pattern: str
    permissions: frozenset[Permission]

    def allows(self, permission: Permission, destination: str) -> bool:
        return permission in self.permissions and fnmatch.fnmatchcase(destination, self.pattern)

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

    def allows(self, permission: Permission, destination: str) -> bool:
        return any(g.allows(permission, destination) for g in self.grants)

    def allows_prefix(self, permission: Permission, prefix: str) -> bool:
        return any(g.allows_prefix(permission, prefix) for g in self.grants)


_EVERYTHING = (Grant("*", ALL_PERMISSIONS),)
INTERNAL_PRINCIPAL = "polymq-internal"  # who the service token logs in as: polymq's own links


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

    def authorize(self, principal: Principal, permission: Permission, destination: str) -> None:
        """Return if ``principal`` holds ``permission`` on ``destination``, else raise Forbidden."""
        if not principal.allows(permission, destination):
            _forbid(principal, permission, destination)

    def authorize_prefix(self, principal: Principal, permission: Permission, prefix: str) -> None:
        """Return if ``principal`` holds ``permission`` on every string that starts with
        ``prefix`` (listing the keys ``kv/<prefix>...``), else raise Forbidden."""
        if not principal.allows_prefix(permission, prefix):
            _forbid(principal, permission, prefix + "*")


def _forbid(principal: Principal, permission: Permission, destination: str) -> NoReturn:
    who = "anonymous client" if principal.anonymous else f"user {principal.name!r}"
    raise Forbidden(f"{who} has no {permission.value} permission on {destination[:300]!r}")


class AnonymousProvider(AuthProvider):
    """Development mode: nothing is checked and everyone may do everything. A password login
    is that user (an empty name is anonymous), a token login is the user ``"token"``."""

    async def authenticate_password(self, user: str, password: str) -> Principal:
        if not user:
            return await self.anonymous()
        return Principal(user, anonymous=False, grants=_EVERYTHING)

    async def authenticate_token(self, token: str) -> Principal:
        return Principal("token", anonymous=False, grants=_EVERYTHING)

    async def anonymous(self) -> Principal:
        return Principal("anonymous", anonymous=True, grants=_EVERYTHING)

    @property
    def open(self) -> bool:
        return True

    def describe(self) -> str:
        return "anonymous mode: no authentication, every client may do everything"


class WithServiceToken(AuthProvider):
    """``inner``, plus one secret token that logs in as ``polymq-internal`` with every
    permission: how ``polymq run`` lets its in-process frontends reach the core (they check
    their own users' permissions themselves). The token lives only in that process."""

    def __init__(self, inner: AuthProvider, token: str) -> None:
        if len(token) < 32:
            raise ValueError("a service token needs at least 32 characters")
        self.inner = inner
        self._token = token

    async def authenticate_password(self, user: str, password: str) -> Principal:
        return await self.inner.authenticate_password(user, password)

    async def authenticate_token(self, token: str) -> Principal:
        if hmac.compare_digest(token.encode(), self._token.encode()):
            return Principal(INTERNAL_PRINCIPAL, False, _EVERYTHING, frozenset({"administrator"}))
        return await self.inner.authenticate_token(token)

    async def anonymous(self) -> Principal:
        return await self.inner.anonymous()

    @property
    def open(self) -> bool:
        return self.inner.open

    def describe(self) -> str:
        return self.inner.describe()


def hash_password(password: str) -> str:
    """Salted scrypt: ``scrypt$n$r$p$salt_b64$hash_b64``."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _DKLEN)
    b64 = base64.b64encode
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """True if ``password`` matches ``encoded``; ValueError if ``encoded`` is malformed."""
    n, r, p, salt, expected = _parse_hash(encoded)
    return hmac.compare_digest(_scrypt(password, salt, n, r, p, len(expected)), expected)


def hash_token(token: str) -> str:
    """The sha256 hex under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def generate_token() -> str:
    return secrets.token_urlsafe(32)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    maxmem = 128 * r * (n + p + 2) + 1024 * 1024
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=dklen)


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split("$") if isinstance(encoded, str) else []
    try:
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        digest = base64.b64decode(parts[5], validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("password hash must be 'scrypt$n$r$p$salt_b64$hash_b64'") from None
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 64 or 128 * r * n > 2**30:
        raise ValueError("password hash has unusable scrypt parameters n, r, p")
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("password hash has a salt or hash that is too short")
    return n, r, p, salt, digest


@functools.cache
def _dummy_hash() -> str:
    """Checked against for unknown users so that they cost as much as known ones."""
    return hash_password(secrets.token_urlsafe(16))


def _verify_or_dummy(password: str, encoded: str | None) -> bool:
    return verify_password(password, encoded or _dummy_hash())


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
        ok = await asyncio.to_thread(_verify_or_dummy, password, encoded)
        if found is None or encoded is None or not ok:
            raise Unauthorized(_BAD_LOGIN)
        return Principal(user, anonymous=False, grants=found.grants, tags=found.tags)

    async def authenticate_token(self, token: str) -> Principal:
        config = self._config
        name = config.tokens.get(hash_token(token))
        if name is None:
            raise Unauthorized("invalid token")
        found = config.users[name]
        return Principal(name, anonymous=False, grants=found.grants, tags=found.tags)

    async def anonymous(self) -> Principal:
        grants = self._config.anonymous
        if grants is None:
            raise Unauthorized("anonymous access is off: log in with a password or a token")
        return Principal("anonymous", anonymous=True, grants=grants)

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
                _parse_hash(pw)
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


def load_provider(spec: str | None) -> AuthProvider:
    """None, "" or "anonymous" -> AnonymousProvider; "file:<path>" -> FileProvider."""
    if not spec or spec == "anonymous":
        return AnonymousProvider()
    if spec.startswith("file:") and spec[5:]:
        return FileProvider(spec[5:])
    raise ValueError(f"unknown auth provider {spec!r}: use 'anonymous' or 'file:/path/users.json'")


def parse_authorization(header_value: str | None) -> tuple[str, str, str] | None:
    """An ``Authorization`` header as ``("basic", user, password)``, ``("bearer", token, "")``
    or None if absent. Unauthorized if malformed or of another scheme."""
    if header_value is None or not header_value.strip():
        return None
    scheme, _, param = header_value.strip().partition(" ")
    param = param.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(param, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise Unauthorized("malformed Basic credentials: not base64 of utf-8") from None
        user, colon, password = decoded.partition(":")
        if not colon:
            raise Unauthorized("malformed Basic credentials: no ':' between user and password")
        return ("basic", user, password)
    if scheme.lower() == "bearer":
        if not param:
            raise Unauthorized("malformed Bearer credentials: no token")
        return ("bearer", param, "")
    raise Unauthorized(f"unsupported authorization scheme {scheme[:20]!r}: use Basic or Bearer")


async def authenticate_http(provider: AuthProvider, header_value: str | None) -> Principal:
    """The principal behind an HTTP ``Authorization`` header (none -> ``provider.anonymous()``)."""
    parsed = parse_authorization(header_value)
    if parsed is None:
        return await provider.anonymous()
    scheme, first, second = parsed
    if scheme == "basic":
        return await provider.authenticate_password(first, second)
    return await provider.authenticate_token(first)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polymq_server.auth")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("hash-password", help="read a password from stdin, print its scrypt hash")
    sub.add_parser("new-token", help="print a new token and the sha256 hex to store for it")
    args = parser.parse_args(argv)
    if args.command == "hash-password":
        if sys.stdin.isatty():
            password = getpass.getpass("password: ")
        else:
            password = sys.stdin.read().removesuffix("\n").removesuffix("\r")
        if not password:
            print("error: empty password", file=sys.stderr)
            return 2
        print(hash_password(password))
    else:
        token = generate_token()
        print(f"token {token}")
        print(f"sha256 {hash_token(token)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
