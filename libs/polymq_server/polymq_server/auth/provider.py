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
A topic subscription pattern (a subscribe, a cursor, a binding) is allowed only if every
topic it can match is (``Principal.allows``): ``topic/news.*`` allows ``topic/news.*`` and
``topic/news.*.x``, not ``topic/news.#``, which hears ``topic/news`` too (``#`` matches no
word as well) unless ``topic/news`` is granted besides; only a grant's ``*`` stands for a
pattern's ``*`` or ``#`` (a ``?`` or ``[...]`` names one character: ``topic/d.?`` allows no
pattern). Checked as text, as it was, ``topic/d.?`` let a user hear ``topic/d.secret`` through
``topic/d.*``.

Reserved names: whatever a grant's pattern says (``*`` and ``topic/*`` included), the names
polymq uses for itself, ``system.*`` in any kind (its reloads, alarms, peers and connection
requests) and the direct reply-to channels ``topic/amqp-reply.*``, as destinations, topic
patterns (``system.#``, ``system*``) and binding keys, are used only by polymq's own links
and users tagged ``administrator`` (Forbidden for anyone else; in anonymous mode reading
``system.*`` stays open, publishing there does not). A ``#`` subscription never hears them
(``polymq_core.topics.trie``). A message's ``reply_to`` naming a destination needs ``WRITE``
there (``AuthProvider.authorize_replies``). See :mod:`polymq_server.auth.principals`.

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
  a JSON file (its format: :mod:`polymq_server.auth.usersfile`).

Where each part lives: who a client is and what it may do (``Permission``, ``Grant``,
``Principal``) and the ``AuthProvider`` interface in :mod:`polymq_server.auth.principals`;
password and token hashing in :mod:`polymq_server.auth.passwords`; the users file in
:mod:`polymq_server.auth.usersfile`. This module is the one every service imports: it names them
all, picks a provider (``load_provider``), reads HTTP credentials (``authenticate_http``) and
is the command line that makes a users file's values (``python -m polymq_server.auth.provider
hash-password``, ``new-token``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import getpass
import hmac
import sys

from polymq.errors import Unauthorized

from .logins import password_login
from .passwords import DEFAULT_COST, generate_token, hash_password, hash_token, verify_password
from .principals import (
    ADMIN_TAGS,
    ALL_PERMISSIONS,
    INTERNAL_PRINCIPAL,
    AuthProvider,
    Grant,
    Permission,
    Principal,
)
from .usersfile import FileProvider

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

_EVERYTHING = (Grant("*", ALL_PERMISSIONS),)
_SERVICE = "service-token"  # the login of the service token's principal


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

    def named(self, user: str) -> Principal | None:
        return Principal(user or "anonymous", anonymous=not user, grants=_EVERYTHING)

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
            return Principal(
                INTERNAL_PRINCIPAL, False, _EVERYTHING, frozenset({"administrator"}), _SERVICE
            )
        return await self.inner.authenticate_token(token)

    def refresh(self, principal: Principal) -> Principal | None:
        if principal.login == _SERVICE and principal.name == INTERNAL_PRINCIPAL:
            return principal  # (the token lives as long as the process)
        return self.inner.refresh(principal)

    async def anonymous(self) -> Principal:
        return await self.inner.anonymous()

    def named(self, user: str) -> Principal | None:
        if user == INTERNAL_PRINCIPAL:
            return Principal(INTERNAL_PRINCIPAL, False, _EVERYTHING, frozenset({"administrator"}))
        return self.inner.named(user)

    @property
    def open(self) -> bool:
        return self.inner.open

    def describe(self) -> str:
        return self.inner.describe()


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


async def authenticate_http(
    provider: AuthProvider, header_value: str | None, source: str | None = None
) -> Principal:
    """The principal behind an HTTP ``Authorization`` header (none -> ``provider.anonymous()``)
    of a request from the address ``source`` (a password login is held to
    :mod:`polymq_server.auth.logins`' rules for it)."""
    parsed = parse_authorization(header_value)
    if parsed is None:
        return await provider.anonymous()
    scheme, first, second = parsed
    if scheme == "basic":
        return await password_login(provider, first, second, source)
    return await provider.authenticate_token(first)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polymq_server.auth.provider")
    sub = parser.add_subparsers(dest="command", required=True)
    hashing = sub.add_parser(
        "hash-password", help="read a password from stdin, print its scrypt hash"
    )
    hashing.add_argument(
        "--cost",
        type=int,
        default=DEFAULT_COST,
        metavar="N",
        help=f"scrypt's N, a power of two (default {DEFAULT_COST}, OWASP's; each check of "
        "the hash then takes 128 * 8 * N bytes of memory)",
    )
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
        try:
            print(hash_password(password, cost=args.cost))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        token = generate_token()
        print(f"token {token}")
        print(f"sha256 {hash_token(token)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
