"""Who a request is (``Authorization: Basic`` or ``Bearer``) and what it may do.

A thin layer over :mod:`polymq_server.auth`: the provider authenticates, and successful logins are
remembered for a short while (keyed by a hash of the header, never the header itself) so
that a client sending Basic credentials on every request does not pay for scrypt each time.
A users reload (:mod:`polymq_server.reload`, heard from the core by :func:`reloaded_access`) forgets
them: an old password or grant does not outlive it.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

from polymq.errors import Unauthorized

from .auth import AuthProvider, Permission, Principal, authenticate_http, load_provider
from .corelink import CoreLink
from .reload import Reloader

__all__ = ["Access", "reloaded_access"]

_TTL = 60.0  # seconds a successful login is remembered
_MAX_ENTRIES = 4096


class Access:
    def __init__(self, provider: AuthProvider) -> None:
        self.provider = provider
        self._cache: OrderedDict[bytes, tuple[float, Principal]] = OrderedDict()

    async def principal(self, authorization: str | None, source: str | None = None) -> Principal:
        """The principal behind an ``Authorization`` header of a request from the address
        ``source``; Unauthorized if refused (:class:`~polymq_server.logins.TooManyLogins`
        when that source failed too often lately)."""
        if authorization is None or not authorization.strip():
            return await self.provider.anonymous()
        try:
            key = hashlib.sha256(authorization.encode("utf-8")).digest()
        except UnicodeEncodeError:
            raise Unauthorized("malformed Authorization header") from None
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None:
            if hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1]
            del self._cache[key]
        principal = await authenticate_http(self.provider, authorization, source)
        self._cache[key] = (now + _TTL, principal)
        while len(self._cache) > _MAX_ENTRIES:
            self._cache.popitem(last=False)
        return principal

    def forget(self) -> None:
        """Forget every remembered login (the users changed)."""
        self._cache.clear()

    def authorize(self, principal: Principal, permission: Permission, destination: str) -> None:
        """Return if allowed, else raise Forbidden."""
        self.provider.authorize(principal, permission, destination)

    def authorize_prefix(self, principal: Principal, permission: Permission, prefix: str) -> None:
        """Return if allowed on every string that starts with ``prefix`` (listing the keys
        ``kv/<prefix>...``: ``AuthProvider.authorize_prefix``), else raise Forbidden."""
        self.provider.authorize_prefix(principal, permission, prefix)


def reloaded_access(auth: str | None, link: CoreLink, service: str) -> Access:
    """The :class:`Access` of frontend ``service`` from its ``POLYMQ_AUTH`` spec ``auth``;
    every reload the core publishes through ``link`` re-reads its users file and forgets the
    logins it remembered."""
    access = Access(load_provider(auth))
    reloader = Reloader(
        access.provider, users_required=False, name=service, applied=lambda _: access.forget()
    )
    link.follow_config(reloader)
    return access
