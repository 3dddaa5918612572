"""aiohttp's server logger as polymq's HTTP listeners use it: a request that aiohttp cannot
parse is the client's error, logged in one line at DEBUG rather than at ERROR with a
traceback.

aiohttp answers such a request (a NUL or another control character in a header, a bad
request line, a line too long) with its own 400 and logs it through its request handler's
``logger.exception``: at ERROR, with a traceback, once per request, so that anyone who can
connect, before any login, writes tracebacks into the log at will. It logs a bad method in a
connection's first request at DEBUG already, for this reason. :data:`SERVER_LOG` is that
logger for the runners polymq makes (:func:`polymq_server.web.app.deadline_runner` passes
it as aiohttp's ``logger`` keyword): a ``BadHttpMessage``, or a body that cannot be read
(``RequestPayloadError``, met when aiohttp reads and drops the rest of a refused request),
goes to DEBUG without its traceback; every other error keeps its ERROR and traceback.

The 400 stays aiohttp's ``text/plain``: aiohttp answers from ``RequestHandler.handle_error``
before any app, middleware or signal sees the request, and has no public way to replace that
class (a custom runner, server and request handler would all lean on private parts).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.log import server_logger

__all__ = ["SERVER_LOG", "ServerLog"]


class ServerLog(logging.LoggerAdapter[logging.Logger]):
    """A logger for aiohttp's request handlers that logs the client's errors at DEBUG, in
    one line (``<message>: <what the parser said>``)."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if level >= logging.ERROR and isinstance(exc, BadHttpMessage | web.RequestPayloadError):
            said = exc.message if isinstance(exc, BadHttpMessage) else exc
            level, kwargs["exc_info"] = logging.DEBUG, None
            msg, args = f"{msg}: %s: %s", (*args, type(exc).__name__, _one_line(said))
        super().log(level, msg, *args, **kwargs)


def _one_line(said: object) -> str:
    """What the parser said, its lines joined (it quotes the client's bytes on a line of
    their own), at most 200 characters."""
    return " ".join(str(said).split())[:200]


SERVER_LOG = ServerLog(server_logger)
