"""Problem details (RFC 9457) for the long-polling frontend: the JSON over HTTP frontend's
(``polymq_http.problems``), with this frontend's word for an unknown route."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from polymq_http.problems import from_exception, problem_response

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except web.HTTPNotFound:
        return problem_response(404, "no such resource; the API is under /v1/ (see the page at /)")
    except Exception as exc:
        response = from_exception(exc)
        if response is not None:
            return response
        if isinstance(exc, web.HTTPException):  # a redirect or success: let aiohttp send it
            raise
        log.exception("longpoll: %s %s failed", request.method, request.path)
        return problem_response(500, "internal error; it has been logged", code="internal")
