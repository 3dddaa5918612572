"""Cross-origin requests from browser pages served elsewhere (CORS).

The allowed origins come from ``POLYMQ_LONGPOLL_CORS_ORIGINS``: any (``*``), none, or a list.
Every response to an allowed origin carries ``Access-Control-Allow-Origin`` (added when the
response is prepared, so streamed SSE answers and problem answers get it too), and a
preflight ``OPTIONS`` is answered here with the methods and headers the API uses.
Credentials travel in the ``Authorization`` header, never in cookies, so
``Access-Control-Allow-Credentials`` is never sent and ``*`` stays safe to use.

Unlike the HTTP and Avro frontends and the core's admin port, this frontend does not refuse
cross-site writes (:mod:`polymq_server.web.guards`): serving pages of other origins is its
purpose. A browser that stored a Basic login for it (a user typed one at its prompt) may
attach it to another site's form posts and no-CORS requests: give browsers tokens (``Bearer``,
which no browser stores) or anonymous grants, and keep passwords for programs.
"""

from __future__ import annotations

from collections.abc import Awaitable

from aiohttp import web
from aiohttp.typedefs import Handler

from polymq_server.web.app import answered

__all__ = ["Cors"]

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID"
MAX_AGE = "600"


class Cors:
    def __init__(self, origins: frozenset[str] | None) -> None:
        self.origins = origins  # None: any

    def allowed(self, origin: str | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for ``origin``, or None."""
        if origin is None:
            return None
        if self.origins is None:
            return "*"
        return origin if origin.lower() in self.origins else None

    @web.middleware
    def preflight(self, request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            allowed = self.allowed(request.headers.get("Origin")) is not None
            return answered(web.Response(status=204 if allowed else 403))
        return handler(request)  # (not a coroutine: no frame of its own in a waiting poll)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.origins is not None:
            response.headers.add("Vary", "Origin")
        allow = self.allowed(request.headers.get("Origin"))
        if allow is None:
            return
        response.headers["Access-Control-Allow-Origin"] = allow
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Methods"] = ALLOW_METHODS
            response.headers["Access-Control-Allow-Headers"] = ALLOW_HEADERS
            response.headers["Access-Control-Max-Age"] = MAX_AGE
