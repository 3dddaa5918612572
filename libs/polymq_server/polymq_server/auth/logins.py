"""Password logins, held back per source address: one that failed too often is refused at
once for a growing while, without checking a password, and each address has one check
running at a time, so that a flood of bad logins from one address waits behind itself and
not in front of other users' logins.

Every protocol that takes a password logs in through :func:`password_login` (HTTP Basic on
the frontends and the core's admin API, STOMP CONNECT, AMQP, the core's wire ``Hello``),
naming the client's address. The rules (:class:`LoginLimiter`, one per process):

- a source is an IP address (an IPv6 one: its /64, what one host is given);
- its password checks run one at a time (scrypt itself runs in
  :func:`polymq_server.auth.passwords.check_password`'s pool of threads, off the event loop);
- its failed logins are counted, and forgotten one per :data:`FORGIVE` seconds (a leaky
  bucket: mistakes now and then never add up);
- once the count passes :data:`FREE_FAILURES`, each failure blocks the source for
  :data:`FIRST_BLOCK` seconds, doubled with every further one, up to :data:`MAX_BLOCK`
  (a source that keeps guessing gets about one guess per :data:`FORGIVE` seconds); while
  blocked, every password login from it is refused with :class:`TooManyLogins`, unchecked,
  those already waiting included: HTTP 429 with ``Retry-After``, and the other protocols'
  refused login, its message saying when to retry. A success does not wipe the count.

A login without a source (an in-process link) is checked without these rules.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from polymq.errors import Unauthorized

from .principals import AuthProvider, Principal

__all__ = [
    "FIRST_BLOCK",
    "FORGIVE",
    "FREE_FAILURES",
    "LOGINS",
    "MAX_BLOCK",
    "LoginLimiter",
    "TooManyLogins",
    "password_login",
    "peer_source",
    "source_key",
]

FREE_FAILURES = 10  # failed logins in a row a source may make before it is blocked
FIRST_BLOCK = 1.0  # seconds of the first block, doubled with each further failure
MAX_BLOCK = 300.0  # seconds a block lasts at most
FORGIVE = 60.0  # seconds after which one failure of a source is forgotten
MAX_SOURCES = 100_000  # sources remembered at once (the oldest go first)


class TooManyLogins(Unauthorized):
    """A password login refused unchecked: its source failed too often lately. It is an
    :class:`~polymq.errors.Unauthorized` to every protocol (its ``code`` on the wire too);
    HTTP answers it 429 with ``Retry-After: retry_after``."""

    status = 429

    def __init__(self, source: str, retry_after: float) -> None:
        self.retry_after = max(1, math.ceil(retry_after))
        super().__init__(f"too many failed logins from {source}: retry in {self.retry_after} s")


@dataclass
class _Source:
    failures: float = 0.0  # as of last_failure (one forgotten per FORGIVE seconds since)
    last_failure: float = -math.inf
    blocked_until: float = 0.0
    waiting: int = 0  # logins checking or queued to
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # one check at a time


def source_key(host: str) -> str:
    """The key of a client's address ``host``: the address, or an IPv6 address's /64."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def peer_source(peer: str) -> str | None:
    """The address of a ``host:port`` peer name (``"?"``, an unknown one: None)."""
    host, sep, _ = peer.rpartition(":")
    return host or None if sep else None


class LoginLimiter:
    """The per-source rules of the module docstring; ``clock``: monotonic seconds."""

    def __init__(
        self,
        *,
        free: int = FREE_FAILURES,
        first_block: float = FIRST_BLOCK,
        max_block: float = MAX_BLOCK,
        forgive: float = FORGIVE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.first_block = first_block
        self.max_block = max_block
        self.forgive = forgive
        self.clock = clock
        self._sources: OrderedDict[str, _Source] = OrderedDict()

    async def check(
        self, source: str | None, login: Callable[[], Awaitable[Principal]]
    ) -> Principal:
        """``login()``'s principal, run under ``source``'s rules (none: at once)."""
        if source is None:
            return await login()
        key = source_key(source)
        entry = self._sources.get(key)
        if entry is None:
            entry = self._sources[key] = _Source()
        self._sources.move_to_end(key)
        self._refuse_if_blocked(key, entry)
        if not entry.waiting:
            entry.turn = asyncio.Lock()  # (of this loop: a process may run several in turn)
        entry.waiting += 1
        try:
            async with entry.turn:
                self._refuse_if_blocked(key, entry)
                try:
                    return await login()
                except TooManyLogins:
                    raise
                except Unauthorized:
                    self._failed(entry)
                    raise
        finally:
            entry.waiting -= 1
            self._tidy()

    def blocked(self, source: str) -> float:
        """Seconds ``source`` is still blocked for (0: it is not)."""
        entry = self._sources.get(source_key(source))
        return max(0.0, entry.blocked_until - self.clock()) if entry is not None else 0.0

    def _refuse_if_blocked(self, key: str, entry: _Source) -> None:
        left = entry.blocked_until - self.clock()
        if left > 0:
            raise TooManyLogins(key, left)

    def _failed(self, entry: _Source) -> None:
        now = self.clock()
        entry.failures = self._count(entry, now) + 1
        entry.last_failure = now
        over = entry.failures - self.free
        if over > 0:
            block = self.first_block * 2 ** min(over - 1, 32)
            entry.blocked_until = now + min(block, self.max_block)

    def _count(self, entry: _Source, now: float) -> float:
        """``entry``'s failures not yet forgotten at ``now``."""
        return max(0.0, entry.failures - (now - entry.last_failure) / self.forgive)

    def _tidy(self) -> None:
        """Forget the sources idle with nothing to remember, oldest first, and the oldest
        over :data:`MAX_SOURCES`."""
        now = self.clock()
        while self._sources:
            key, entry = next(iter(self._sources.items()))
            stale = self._count(entry, now) == 0 and now >= entry.blocked_until
            if entry.waiting or not (stale or len(self._sources) > MAX_SOURCES):
                break
            del self._sources[key]


LOGINS = LoginLimiter()  # the process's: every protocol's logins share it


async def password_login(
    provider: AuthProvider,
    user: str,
    password: str,
    source: str | None,
    limiter: LoginLimiter = LOGINS,
) -> Principal:
    """``provider``'s principal for ``user`` and ``password``, a login from the address
    ``source`` (None: an in-process link) held to ``limiter``'s rules."""
    return await limiter.check(source, lambda: provider.authenticate_password(user, password))
