"""polymq's long-polling and Server-Sent Events frontend (``polymq longpoll``, also mounted
by ``polymq run``): queues, topics and streams for browsers and clients that cannot hold a
WebSocket, with the same semantics as every other protocol.

A subscription lives in the core (``polymq.Client.cursor_open``), not in this process, so
any replica serves any poll: no sticky sessions. Clients long-poll it or stream it as
``text/event-stream``; every answer carries the cursor to resume from, queue messages carry
lease receipts settled from any request. The service also publishes (the JSON over HTTP
frontend's body format), answers CORS, and serves a JavaScript client and a demo page.

Modules: ``config`` (settings), ``service`` (the aiohttp app and its life cycle), ``api``
(the handlers), ``sse`` (the event stream), ``subscriptions`` (ids and cursors), ``payloads``
(JSON in and out), ``leases`` (SSE's prefetch window over a queue), ``corelink`` (the
connection to the core), ``cors``, ``problems``, ``metrics`` and ``page``.

Every error a handler raises becomes an ``application/problem+json`` answer
(``polymq_server.web.problems``, as in every JSON frontend)::

    Problem                 an HTTP error with its status, title and detail
    polymq.errors.RequestError    through its ``status``: 400, 401, 403, 404 (unknown or
                                  expired subscription), 410 (a cursor the core no longer
                                  holds), ...
    polymq.errors.ConnectionClosed / Timeout     503 / 504: the core is away or slow
    aiohttp.web.HTTPException     404 unknown route, 405 wrong method, 413 body too large

Once an SSE stream has started, an error is sent as an ``event: problem`` instead.
"""

from __future__ import annotations
