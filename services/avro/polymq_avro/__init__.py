"""polymq's Avro over HTTP frontend (``polymq avro``, also mounted by ``polymq run``): Avro
object container files or single-object records in, one message per record (Avro's
single-object encoding, ``avro/binary``), records out as containers or JSON, and a schema
registry whose schemas and subjects live in the core's key/value store
(``polymq_server.messages.avro``
reads them in every frontend).

Modules: ``config`` (settings), ``service`` (the aiohttp app and its life cycle), ``api``
(records in and out), ``registry_api`` (the registry's routes), ``registry`` (subjects,
versions, rules), ``compat`` (Apache Avro's compatibility checker), ``container`` (object
container files, sans-IO), ``records`` (a body as validated records and messages),
``payloads`` (queries, negotiation, JSON), ``corelink``, ``metrics`` and ``openapi``.
Problem details, access control and the JSON checks it shares with the other JSON frontends
are ``polymq_server``'s (``problems``, ``access``, ``payloads``); the service runner, health
and readiness (``polymq_server.web.app``), the request metrics (``requestmetrics``) and settling
(``receipts``) are every aiohttp frontend's.

Every error a handler raises becomes an ``application/problem+json`` answer::

    polymq_server.web.problems.Problem    an HTTP error with its status and detail
    polymq.errors.RequestError        through its ``status``, among them
    polymq_server.messages.avro's
      polymq_server.messages.avro.AvroError           422 (invalid-schema, invalid-record, ...), 404
                                      (unknown-schema); container.TooLarge 413
      registry.IncompatibleSchema     409, with the checker's ``messages``
    polymq.errors.ConnectionClosed / Timeout     503 / 504: the core is away or slow
    aiohttp.web.HTTPException         404 unknown route, 405 wrong method, 413 body too large
"""

from __future__ import annotations
