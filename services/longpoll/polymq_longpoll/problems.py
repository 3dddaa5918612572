"""Problem details (RFC 9457) for the long-polling frontend: every JSON frontend's
(``polymq_server.web.problems``), with this frontend's word for an unknown route."""

from __future__ import annotations

import logging

from polymq_server.web.problems import problems

__all__ = ["problem_middleware"]

log = logging.getLogger(__name__)

problem_middleware = problems(
    "longpoll", log, not_found="no such resource; the API is under /v1/ (see the page at /)"
)
