"""polymq's JSON over HTTP frontend (``polymq http``, also mounted by ``polymq run``).

It speaks REST + JSON outside (an OpenAPI document is served at ``/openapi.json``) and the
polymq wire protocol inside, through one shared :class:`polymq.Client` to the core.

Modules: ``config`` (settings), ``service`` (the aiohttp app and its life cycle), ``api``
(the handlers), ``corelink`` (the connection to the core), ``problems`` (the RFC 9457
middleware), ``metrics`` and ``openapi``. Reading JSON in and writing it out, who may call
and the errors are every JSON frontend's, in ``polymq_server`` (``payloads``, ``access``,
``problems``).

Every error a handler raises becomes an ``application/problem+json`` answer::

    Problem                 an HTTP error with its status, title and detail
                            (polymq_server.web.problems)
    polymq.errors.RequestError    mapped through its ``status`` (400, 401, 403, 404, ...)
    polymq.errors.ConnectionClosed / Timeout     503 / 504: the core is away or slow
    aiohttp.web.HTTPException     404 unknown route, 405 wrong method, 413 body too large
"""

from __future__ import annotations
