"""RFC 9457 problem details, the JSON every polymq HTTP listener answers an error with
(``application/problem+json``): the document alone, without aiohttp, so that an answer
written straight on a socket (:mod:`polymq_server.web.listener`) and a handler's
(:func:`polymq_server.web.app.problem_response`) say the same things."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

__all__ = ["PROBLEM_JSON", "problem_code", "problem_document", "status_phrase"]

PROBLEM_JSON = "application/problem+json"

_CODES = {413: "too-large", 503: "unavailable", 504: "timeout"}  # as polymq.errors names them


def status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_code(status: int) -> str:
    """The ``code`` of a problem with ``status`` when none is given (``not-found``, ...)."""
    return _CODES.get(status) or status_phrase(status).lower().replace(" ", "-").replace("'", "")


def problem_document(
    status: int, detail: str, *, code: str | None = None, title: str | None = None
) -> dict[str, Any]:
    """``{"type": "about:blank", "title", "status", "detail", "code"}``: the title is the
    status phrase unless given, the code :func:`problem_code`'s unless given."""
    return {
        "type": "about:blank",
        "title": title or status_phrase(status),
        "status": status,
        "detail": detail,
        "code": code or problem_code(status),
    }
