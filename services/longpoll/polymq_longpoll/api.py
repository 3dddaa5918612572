"""The handlers of the long-polling API and their routes.

::

    POST   /v1/subscriptions                   open one at the core -> {id, cursor, ...}
    DELETE /v1/subscriptions/{id}              close it
    GET    /v1/subscriptions/{id}/poll         long poll: ?cursor=&max=&wait=
    GET    /v1/subscriptions/{id}/events       the same as Server-Sent Events (sse.py)
    POST   /v1/ack, /v1/nack                   settle queue leases by receipt, from any request
    POST   /v1/{kind}/{name}/messages          publish (the JSON over HTTP frontend's body)
    GET    /  /polymq-longpoll.js              the demo page and the JavaScript client
    GET    /metrics /healthz /readyz

Each handler authenticates, checks its input, authorizes, and makes its requests to the
core through :class:`LongpollLink`. Errors are raised and turned into problem details by
``problems.problem_middleware``.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from aiohttp import web

from polymq import CursorPage
from polymq.errors import Forbidden
from polymq.types import Destination, Kind, Outcome
from polymq_server.auth.provider import Permission, Principal
from polymq_server.messages.avro import SchemaCache
from polymq_server.messages.avroview import load_schemas
from polymq_server.web.access import Access, Revocation, until_revoked
from polymq_server.web.app import add_health_routes, published_json
from polymq_server.web.payloads import parse_publish, parse_settle, read_json
from polymq_server.web.receipts import add_settle_routes, settle_outcome, settle_receipts

from .answers import Shown, answer_bytes, json_answer
from .config import LongpollSettings
from .corelink import LongpollLink
from .leases import Windows
from .metrics import LongpollMetrics
from .payloads import (
    message_json,
    no_query,
    parse_max,
    parse_open,
    parse_wait,
    query_value,
)
from .subscriptions import AckMode, SubscriptionRef, message_cursors, parse_cursor

SETTINGS = web.AppKey("settings", LongpollSettings)
CORE = web.AppKey("core", LongpollLink)
ACCESS = web.AppKey("access", Access)
METRICS = web.AppKey("metrics", LongpollMetrics)
WINDOWS = web.AppKey("windows", Windows)
SHOWN = web.AppKey("shown", Shown)
IDS_KEY = web.AppKey("ids_key", bytes)  # subscriptions.ids_key

POLL_QUERY = frozenset({"cursor", "max", "wait"})


async def principal_of(request: web.Request) -> Principal:
    return await request.app[ACCESS].principal(request.headers.get("Authorization"), request.remote)


def owner_of(principal: Principal) -> str:
    """Whose a subscription is, as its id says (``""``: the anonymous client)."""
    return "" if principal.anonymous else principal.name


async def subscription(request: web.Request) -> SubscriptionRef:
    """The subscription named in the path (404 unless it is an id this service gave, as
    it gave it), once the caller is the user who opened it (403) and may still read its
    destination (403)."""
    principal = await principal_of(request)
    ref = SubscriptionRef.decode(request.match_info["id"], request.app[IDS_KEY])
    if ref.owner != owner_of(principal):
        raise Forbidden("this subscription was opened by another user")
    request.app[ACCESS].authorize(principal, Permission.READ, str(ref.destination))
    return ref


async def held(request: web.Request, ref: SubscriptionRef) -> AbstractContextManager[Revocation]:
    """While the request reading ``ref`` is held open (a long poll, an SSE stream): the
    future a users reload fails if it took the caller's login or read permission away."""
    principal = await principal_of(request)  # (remembered: no second password check)
    return request.app[ACCESS].held(principal, Permission.READ, str(ref.destination))


def resume_cursor(request: web.Request, *, header_first: bool) -> tuple[int | None, bool]:
    """The cursor to read after (``?cursor=`` or ``Last-Event-ID``, the header first when
    ``header_first``) and whether it came from ``Last-Event-ID``."""
    raw = query_value(request, "cursor")
    header = request.headers.get("Last-Event-ID")
    if header is not None and header.strip() and (header_first or raw is None):
        return parse_cursor(header, "Last-Event-ID"), True
    return parse_cursor(raw), False


async def answer_json(
    ref: SubscriptionRef, page: CursorPage, schemas: SchemaCache
) -> dict[str, Any]:
    """A poll's answer as JSON: its Avro records decoded as ``value`` (their schemas loaded
    first), as the HTTP frontend's pull shows them."""
    cursor = page.cursor
    messages = page.messages
    cursors = message_cursors(ref.kind, cursor, messages) if cursor is not None else []
    await load_schemas(schemas, messages)
    return {
        "cursor": None if cursor is None else str(cursor),
        "messages": [
            message_json(m, r, c, schemas)
            for m, r, c in zip(messages, page.receipts, cursors, strict=True)
        ],
    }


# ---- subscriptions -------------------------------------------------------------------------
async def open_subscription(request: web.Request) -> web.Response:
    principal = await principal_of(request)
    no_query(request, frozenset())
    settings = request.app[SETTINGS]
    data, _ = await read_json(request, settings.longpoll_max_body)
    dest, options, ack, prefetch = parse_open(data, settings)
    request.app[ACCESS].authorize(principal, Permission.READ, str(dest))
    result = await request.app[CORE].call(lambda c: c.cursor_open(str(dest), **options))
    visibility = float(options.get("visibility", 0.0))
    owner = owner_of(principal)
    ref = SubscriptionRef(result.id, dest, ack, prefetch, visibility, options["ttl"], owner)
    request.app[METRICS].subscriptions.labels(dest.kind.value).inc()
    sub_id = ref.encode(request.app[IDS_KEY])
    body = {
        "id": sub_id,
        "cursor": str(result.cursor),
        "destination": str(dest),
        "ack": ack.value,
        "prefetch": prefetch,
        "ttl": options["ttl"],
        "poll": f"/v1/subscriptions/{sub_id}/poll",
        "events": f"/v1/subscriptions/{sub_id}/events",
    }
    if dest.kind is Kind.QUEUE:
        body["visibility"] = ref.visibility
    return web.json_response(body, status=201, headers={"Location": f"/v1/subscriptions/{sub_id}"})


async def close_subscription(request: web.Request) -> web.Response:
    ref = await subscription(request)
    no_query(request, frozenset())
    await request.app[CORE].call(lambda c: c.cursor_close(ref.core_id))
    return web.Response(status=204)


async def poll(request: web.Request) -> web.StreamResponse:
    ref = await subscription(request)
    no_query(request, POLL_QUERY)
    app = request.app
    settings, core, metrics = app[SETTINGS], app[CORE], app[METRICS]
    cursor, resumed = resume_cursor(request, header_first=False)
    max_ = parse_max(request, ref.prefetch, settings.longpoll_max_poll)
    wait = parse_wait(request, settings.longpoll_max_wait)
    if resumed:
        metrics.reconnects.labels("poll").inc()
    outcome = "error"
    start = time.perf_counter()
    metrics.polls += 1
    try:
        with await held(request, ref) as revocation:  # (a users reload may end it: 401, 403)
            result = await until_revoked(
                core.poll(ref.core_id, cursor, max_, wait, ref.max_step), revocation
            )
        outcome = "messages" if result.messages else "empty"
    finally:
        metrics.polls -= 1
        metrics.poll_answered(outcome, time.perf_counter() - start)
    leased = result.leased
    transport = request.transport
    if leased and (transport is None or transport.is_closing()):
        core.requeue(leased)  # the client left while we waited: nobody can settle these
        return web.Response(status=499)
    metrics.delivered("poll", len(result.messages))
    try:
        await load_schemas(core.schemas, result.messages)
        body = answer_bytes(ref, result, core.schemas, app[SHOWN])
    except BaseException:
        core.requeue(leased)  # (cancelled while loading Avro schemas: the client left)
        raise
    response = json_answer(request, body)
    if leased and ref.ack is AckMode.AUTO:
        try:
            await response.prepare(request)
            await response.write_eof()
        except BaseException:
            core.requeue(leased)
            raise
        core.settle_soon(leased, Outcome.ACK)
    return response


# ---- settle, publish ---------------------------------------------------------------------------
async def _settle(request: web.Request, *, nack: bool) -> web.Response:
    principal = await principal_of(request)
    no_query(request, frozenset())
    app = request.app
    settings, access = app[SETTINGS], app[ACCESS]
    data, _ = await read_json(request, settings.longpoll_max_body)
    receipts, requeue = parse_settle(data, settings.longpoll_max_batch, nack=nack)
    answer = await settle_receipts(
        app[CORE],
        receipts,
        settle_outcome(nack=nack, requeue=requeue),
        lambda queue: access.authorize(principal, Permission.READ, queue),
        done=app[WINDOWS].settled,
    )
    app[METRICS].messages.labels("ack" if not nack else "nack").inc(answer["settled"])
    return web.json_response(answer)


async def publish(request: web.Request) -> web.Response:
    principal = await principal_of(request)
    no_query(request, frozenset())
    dest = Destination.parse(f"{request.match_info['kind']}/{request.match_info['name']}")
    app = request.app
    app[ACCESS].authorize(principal, Permission.WRITE, str(dest))
    settings, core = app[SETTINGS], app[CORE]
    core.refuse_publish_in_alarm()  # a resource alarm holds publishers: 503
    data, size = await read_json(request, settings.longpoll_max_body)
    messages, role = parse_publish(data, dest, settings.longpoll_max_batch)
    app[ACCESS].authorize_replies(principal, messages)
    result = await core.publish(str(dest), messages, size, role=role)
    app[METRICS].messages.labels("publish").inc(len(messages))
    return web.json_response(published_json(dest, result))


def add_routes(app: web.Application) -> None:
    """Every route but the SSE one (``sse.add_routes``)."""
    r = app.router
    r.add_post("/v1/subscriptions", open_subscription)
    r.add_delete("/v1/subscriptions/{id}", close_subscription)
    r.add_get("/v1/subscriptions/{id}/poll", poll)
    add_settle_routes(app, _settle)
    r.add_post("/v1/{kind}/{name}/messages", publish)
    add_health_routes(app, CORE)
