"""Problem details (RFC 9457) for the Avro frontend: every JSON frontend's
(``polymq_server.web.problems``), plus one extension member: a 409 for an incompatible schema
lists the compatibility checker's reasons as ``messages``. A handler's bug is logged as
``avro: METHOD /path failed``."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from polymq_server.web.problems import Handler, problem_response, problems

from .registry import IncompatibleSchema

__all__ = ["incompatible_middleware", "incompatible_response", "problem_middleware"]

log = logging.getLogger(__name__)

problem_middleware = problems("avro", log)


def incompatible_response(exc: IncompatibleSchema) -> web.Response:
    """409 problem details with the checker's reasons as ``messages``."""
    response = problem_response(409, exc.message, code=exc.code)
    assert isinstance(response.body, bytes)
    body = json.loads(response.body)
    body["messages"] = exc.messages
    response.body = json.dumps(body).encode()
    return response


@web.middleware
async def incompatible_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Inside ``problem_middleware``: what it would answer without ``messages``."""
    try:
        return await handler(request)
    except IncompatibleSchema as exc:
        return incompatible_response(exc)
