"""Problem details (RFC 9457) for the long-polling frontend: the JSON over HTTP frontend's
(``polymq_http.problems``), with this frontend's word for an unknown route."""

from __future__ import annotations

import logging

from polymq_http.problems import problems

__all__ = ["problem_middleware"]

log = logging.getLogger(__name__)

problem_middleware = problems(
    "longpoll", log, not_found="no such resource; the API is under /v1/ (see the page at /)"
)
