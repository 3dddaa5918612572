"""RFC 9457 problem details: every 4xx and 5xx answer is ``application/problem+json``.

``{"type": "about:blank", "title": <the status phrase>, "status": ..., "detail": ...}`` plus
``code``, a short machine word (polymq's error codes, e.g. ``queue-full``, or the HTTP one,
e.g. ``method-not-allowed``). The middleware :func:`problems` makes turns whatever a handler
raises into one: a :class:`Problem`, a polymq error (through its ``status``), an aiohttp HTTP error
(unknown route, wrong method, body too large), or, for a bug, a 500 that says nothing more.
The answer itself is built by :func:`polymq_server.web.app.problem_response`; each JSON frontend
makes its middleware with :func:`problems` (its name in the log, its word for a 404).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from polymq.errors import ConnectionClosed, PolymqError, RequestError, Timeout, Unauthorized

from .app import problem_code, problem_response, status_phrase
from .guards import login_refusal

__all__ = [
    "Handler",
    "Problem",
    "bad_request",
    "from_exception",
    "problem_response",
    "problems",
]

log = logging.getLogger(__name__)


class Problem(Exception):
    """An HTTP error answered as problem details."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.code = code or problem_code(status)
        self.headers = dict(headers or {})


def bad_request(detail: str) -> Problem:
    return Problem(400, detail, code="bad-request")


def from_exception(exc: BaseException) -> web.Response | None:
    """The problem answer for ``exc``, or None if it is not an error we translate."""
    if isinstance(exc, Problem):
        return problem_response(exc.status, exc.detail, code=exc.code, headers=exc.headers)
    if isinstance(exc, Unauthorized):  # (429 with Retry-After for a source held back)
        return login_refusal(exc)
    if isinstance(exc, RequestError):
        status = exc.status if 400 <= exc.status < 600 and exc.status != 500 else 502
        detail = exc.message
        if status == 502:
            detail = f"the core answered with an unexpected error {exc.code!r}: {exc.message}"
        return problem_response(status, detail, code=exc.code)
    if isinstance(exc, ConnectionClosed):
        return problem_response(503, f"the core is unavailable: {exc}", code="unavailable")
    if isinstance(exc, Timeout | TimeoutError):
        return problem_response(504, "the core did not answer in time", code="timeout")
    if isinstance(exc, PolymqError):
        log.warning("http: %s: %s", type(exc).__name__, exc)
        return problem_response(502, f"cannot talk to the core: {exc}", code="bad-gateway")
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow",)}
        detail = exc.text if exc.text and exc.text != f"{exc.status}: {exc.reason}" else ""
        return problem_response(exc.status, detail or _default_detail(exc.status), headers=headers)
    return None


def _default_detail(status: int) -> str:
    if status == 404:
        return "no such resource; see /openapi.json for the routes"
    if status == 405:
        return "method not allowed here; see the Allow header"
    return status_phrase(status)


def problems(service: str, logger: logging.Logger, *, not_found: str | None = None) -> Middleware:
    """A middleware that answers whatever a handler raises as problem details (bugs are
    logged to ``logger`` as ``<service>: METHOD /path failed``); ``not_found``: the detail of
    a 404 for an unknown route, when the frontend has its own word for it."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not_found is not None and isinstance(exc, web.HTTPNotFound):
                return problem_response(404, not_found)
            response = from_exception(exc)
            if response is not None:
                return response
            if isinstance(exc, web.HTTPException):  # a redirect or success: aiohttp sends it
                raise
            logger.exception("%s: %s %s failed", service, request.method, request.path)
            return problem_response(500, "internal error; it has been logged", code="internal")

    return middleware
