"""Who a request is (``Authorization: Basic`` or ``Bearer``) and what it may do.

A thin layer over :mod:`polymq.auth`: the provider authenticates, and successful logins are
remembered for a short while (keyed by a hash of the header, never the header itself) so
that a client sending Basic credentials on every request does not pay for scrypt each time.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

from polymq.auth import AuthProvider, Permission, Principal, authenticate_http
from polymq.errors import Unauthorized

_TTL = 60.0  # seconds a successful login is remembered
_MAX_ENTRIES = 4096


class Access:
    def __init__(self, provider: AuthProvider) -> None:
        self.provider = provider
        self._cache: OrderedDict[bytes, tuple[float, Principal]] = OrderedDict()

    async def principal(self, authorization: str | None) -> Principal:
        """The principal behind an ``Authorization`` header; Unauthorized if refused."""
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
        principal = await authenticate_http(self.provider, authorization)
        self._cache[key] = (now + _TTL, principal)
        while len(self._cache) > _MAX_ENTRIES:
            self._cache.popitem(last=False)
        return principal

    def authorize(self, principal: Principal, permission: Permission, destination: str) -> None:
        """Return if allowed, else raise Forbidden."""
        self.provider.authorize(principal, permission, destination)

    def authorize_prefix(self, principal: Principal, permission: Permission, prefix: str) -> None:
        """Return if allowed on every string that starts with ``prefix`` (listing the keys
        ``kv/<prefix>...``: ``AuthProvider.authorize_prefix``), else raise Forbidden."""
        self.provider.authorize_prefix(principal, permission, prefix)
