"""What polymq's HTTP apps check of a request before they read its body: that a browser was
not made to send it from another site (:func:`cross_site_guard`), that its body is JSON
where only JSON is taken (:func:`json_writes`), and that its login holds
(:func:`login_first`); a request refused before its body was read is answered at once, and
its connection closed without reading the rest (:func:`polymq_server.web.app.refuse_unread`).

A browser attaches the Basic login it stored for a site to every request it sends there,
also those a page of another site makes it send (a form, or ``fetch`` without CORS): a
write that a browser marks as cross-site is refused 403 (``code`` ``cross-site``). The
rule is Go's ``net/http.CrossOriginProtection``: ``GET``, ``HEAD`` and ``OPTIONS`` pass;
otherwise ``Sec-Fetch-Site`` decides when sent (``same-origin`` and ``none`` pass), else
``Origin`` must name the ``Host`` the request was sent to, and a request with neither
(a program, not a browser) passes.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from polymq.errors import Unauthorized

from ..auth.logins import TooManyLogins
from .access import Access
from .app import problem_response, refuse_unread

__all__ = [
    "SAFE_METHODS",
    "cross_site",
    "cross_site_guard",
    "is_json",
    "json_writes",
    "login_first",
    "login_refusal",
]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_site(request: web.Request) -> str | None:
    """Why ``request`` is a write that a browser sent from another site, or None."""
    if request.method in SAFE_METHODS:
        return None
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        if site.strip().lower() in ("same-origin", "none"):
            return None
        return f"the browser sent it from another site (Sec-Fetch-Site: {site[:40]})"
    origin = request.headers.get("Origin")
    if origin is None:
        return None  # not a browser's (or a browser from before Origin was sent)
    try:
        host = urlsplit(origin).netloc
    except ValueError:
        host = ""
    if host and host.lower() == request.headers.get("Host", "").lower():
        return None
    return f"the browser sent it from another origin (Origin: {origin[:100]})"


@web.middleware
async def cross_site_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """403 for a write a browser sent from another site (:func:`cross_site`)."""
    why = cross_site(request)
    if why is None:
        return await handler(request)
    detail = f"cross-site requests may not change anything here: {why}"
    return await refuse_unread(request, problem_response(403, detail, code="cross-site"))


def is_json(content_type: str) -> bool:
    """``application/json`` or ``application/<anything>+json`` (parameters aside)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


@web.middleware
async def json_writes(request: web.Request, handler: Handler) -> web.StreamResponse:
    """415 for a ``POST``, ``PUT``, ``PATCH`` or ``DELETE`` whose body is not declared JSON
    (what a cross-site form or a ``fetch`` without CORS cannot send)."""
    if request.method in SAFE_METHODS or not request.body_exists:
        return await handler(request)
    ctype = request.headers.get("Content-Type")
    if ctype is not None and is_json(ctype):
        return await handler(request)
    detail = "send JSON with Content-Type: application/json" + (
        f", not {ctype[:80]!r}" if ctype is not None else ""
    )
    return await refuse_unread(request, problem_response(415, detail))


def login_refusal(exc: Unauthorized) -> web.Response:
    """401 (with the challenge) for a refused login; 429 with ``Retry-After`` when its
    source failed too often lately (:class:`~polymq_server.auth.logins.TooManyLogins`)."""
    if isinstance(exc, TooManyLogins):
        headers = {"Retry-After": str(exc.retry_after)}
        return problem_response(429, exc.message, code="too-many-logins", headers=headers)
    return problem_response(401, exc.message, code=exc.code)


def login_first(access: web.AppKey[Access]) -> Middleware:
    """A middleware that checks the login of a request with a body (by the app's
    :class:`~polymq_server.web.access.Access` under ``access``) before anything reads the
    body: refused, it is answered at once (:func:`login_refusal`) and its body left unread
    (:func:`~polymq_server.web.app.refuse_unread`). A request without one is left to its
    handler, which checks it (a login that passed here is remembered: no second check)."""

    @web.middleware
    async def login_first(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            try:
                await request.app[access].principal(
                    request.headers.get("Authorization"), request.remote
                )
            except Unauthorized as exc:
                return await refuse_unread(request, login_refusal(exc))
        return await handler(request)

    return login_first
