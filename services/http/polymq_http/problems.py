"""Problem details (RFC 9457) for the JSON over HTTP frontend: the middleware every JSON
frontend makes (:mod:`polymq_server.web.problems`), under this frontend's name."""

from __future__ import annotations

import logging

from polymq_server.web.problems import problems

__all__ = ["problem_middleware"]

log = logging.getLogger(__name__)

problem_middleware = problems("http", log)
