"""Who may use the core's admin HTTP: the console and the operator's API.

Without ``--auth`` (the provider is :attr:`~polymq_server.auth.provider.AuthProvider.open`) everyone
may.
Otherwise every route but the probes and the metrics needs a login (HTTP Basic or a bearer
token, checked by the core's own provider), answered 401 with ``WWW-Authenticate: Basic
realm="polymq"`` without one, and the user's management tags decide (RabbitMQ's)::

    monitoring      GET (and HEAD) of every route: the console, overview, connections, peek
    administrator   everything: also publish, purge, delete, close connections, reload

A user with neither gets 403, as does a ``monitoring`` user's change. A refusal is sent
before the request's body is read, and its connection closed without reading a large one;
a source that failed too many logins lately is answered 429 with ``Retry-After`` without a
check (:mod:`polymq_server.auth.logins`). The cluster's own routes (a shard's snapshot, a
node's leave, a reload broadcast) keep their rule, the cluster secret as bearer token: a
request that carries it is left to them.

Logins are remembered for :data:`REMEMBER` seconds (keyed by a hash of the header), so a
console that polls does not pay scrypt each time; a users reload is seen after that.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from polymq.errors import Unauthorized
from polymq_server.auth.logins import TooManyLogins
from polymq_server.auth.provider import AuthProvider, Principal, authenticate_http
from polymq_server.web.app import refuse_unread

__all__ = ["OPEN_PATHS", "PEER_PATHS", "REMEMBER", "AdminAccess", "problem"]

OPEN_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
# the cluster's own calls: their handlers check the cluster secret
PEER_PATHS = ("/api/cluster/snapshot/", "/api/cluster/leave", "/api/config/reload")
REMEMBER = 10.0  # seconds a login is remembered
_MAX_REMEMBERED = 1024
_READING = frozenset({"GET", "HEAD"})
_CHALLENGE = {"WWW-Authenticate": 'Basic realm="polymq"'}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def problem(
    status: int, title: str, detail: str, headers: dict[str, str] | None = None
) -> web.Response:
    """An RFC 9457 problem document (``code``: the title, as the frontends' problems have)."""
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    body.update(detail=detail, code=title)
    return web.json_response(
        body, status=status, content_type="application/problem+json", headers=headers
    )


class AdminAccess:
    """The admin app's login check: :meth:`middleware` for ``web.Application``.
    ``secret``: the cluster secret (None on a single node)."""

    def __init__(self, provider: AuthProvider, secret: str | None = None) -> None:
        self.provider = provider
        self.secret = secret
        self._remembered: OrderedDict[bytes, tuple[float, Principal]] = OrderedDict()

    async def principal(self, authorization: str, source: str | None = None) -> Principal:
        """The principal of ``authorization``, a login from the address ``source``
        (:mod:`polymq_server.auth.logins`' rules); Unauthorized if refused."""
        key = hashlib.sha256(authorization.encode("utf-8", "replace")).digest()
        now = time.monotonic()
        hit = self._remembered.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        principal = await authenticate_http(self.provider, authorization, source)
        self._remembered[key] = (now + REMEMBER, principal)
        while len(self._remembered) > _MAX_REMEMBERED:
            self._remembered.popitem(last=False)
        return principal

    def _peer_call(self, request: web.Request) -> bool:
        if self.secret is None or not request.path.startswith(PEER_PATHS):
            return False
        given = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(given, f"Bearer {self.secret}".encode())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.provider.open or request.path in OPEN_PATHS or self._peer_call(request):
            return await handler(request)
        authorization = request.headers.get("Authorization", "")
        if not authorization.strip():
            refusal = problem(401, "unauthorized", "log in (Basic or a bearer token)", _CHALLENGE)
            return await refuse_unread(request, refusal)
        try:
            principal = await self.principal(authorization, request.remote)
        except TooManyLogins as exc:
            refusal = problem(429, "too-many-logins", exc.message, _retry(exc))
            return await refuse_unread(request, refusal)
        except Unauthorized as exc:
            refusal = problem(401, "unauthorized", exc.message, _CHALLENGE)
            return await refuse_unread(request, refusal)
        tags = principal.tags
        if "administrator" in tags or ("monitoring" in tags and request.method in _READING):
            return await handler(request)
        what = "may only read (tag monitoring)" if "monitoring" in tags else "has no admin tag"
        refusal = problem(
            403,
            "forbidden",
            f"user {principal.name!r} {what}: this needs the tag "
            f"{'monitoring or ' if request.method in _READING else ''}administrator",
        )
        return await refuse_unread(request, refusal)


def _retry(exc: TooManyLogins) -> dict[str, str]:
    return {"Retry-After": str(exc.retry_after)}
