"""The handlers of the JSON over HTTP API and their routes (documented in ``openapi.py``).

Each handler authenticates, validates the destination, authorizes the operation, reads and
checks its body, and then makes one request to the core through :class:`HttpLink`. Errors are
raised and turned into problem details by ``problems.problem_middleware``.
"""

from __future__ import annotations

from functools import partial

from aiohttp import web

from polymq.types import Destination, Kind
from polymq_server.auth.deadletter import for_user
from polymq_server.auth.provider import Permission, Principal
from polymq_server.messages.avroview import load_schemas
from polymq_server.web.access import Access
from polymq_server.web.app import add_health_routes, add_openapi_route, published_json
from polymq_server.web.payloads import (
    lease_json,
    no_query,
    parse_declare,
    parse_metadata,
    parse_publish,
    parse_pull_query,
    parse_settle,
    read_json,
)
from polymq_server.web.problems import bad_request
from polymq_server.web.receipts import add_settle_routes, settle_outcome, settle_receipts

from .config import HttpSettings
from .corelink import HttpLink
from .metrics import HttpMetrics

SETTINGS = web.AppKey("settings", HttpSettings)
CORE = web.AppKey("core", HttpLink)
ACCESS = web.AppKey("access", Access)
METRICS = web.AppKey("metrics", HttpMetrics)
OPENAPI = web.AppKey("openapi", bytes)


async def _principal(request: web.Request) -> Principal:
    return await request.app[ACCESS].principal(request.headers.get("Authorization"), request.remote)


def _destination(request: web.Request, *, stored: bool) -> Destination:
    kind, name = request.match_info.get("kind", "queue"), request.match_info["name"]
    dest = Destination.parse(f"{kind}/{name}")
    if stored and dest.kind is Kind.TOPIC:
        raise bad_request("topics are transient: they hold no messages or metadata to manage")
    return dest


async def _authorized(
    request: web.Request, permission: Permission, *, stored: bool = False, query: bool = False
) -> Destination:
    """Authenticate (401), check the query string and the destination (400), authorize (403).
    ``stored``: the operation needs a destination that holds something (not a topic);
    ``query``: the handler checks the query string itself (else there must be none)."""
    principal = await _principal(request)
    if not query:
        no_query(request)
    dest = _destination(request, stored=stored)
    request.app[ACCESS].authorize(principal, permission, str(dest))
    return dest


# ---- messages ------------------------------------------------------------------------------
async def publish(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.WRITE)
    settings, core = request.app[SETTINGS], request.app[CORE]
    core.refuse_publish_in_alarm()  # a resource alarm holds publishers: 503
    data, size = await read_json(request, settings.max_body)
    messages, role = parse_publish(data, dest, settings.max_batch)
    if any(m.reply_to is not None for m in messages):  # (who asks is known: remembered)
        request.app[ACCESS].authorize_replies(await _principal(request), messages)
    result = await core.publish(str(dest), messages, size, role=role)
    request.app[METRICS].messages.labels("publish").inc(len(messages))
    return web.json_response(published_json(dest, result))


async def pull(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.READ, query=True)
    settings, core = request.app[SETTINGS], request.app[CORE]
    n, wait, visibility = parse_pull_query(request, settings.max_pull, settings.max_wait)
    leases = await core.pull(str(dest), n, wait, visibility)
    transport = request.transport
    if leases and (transport is None or transport.is_closing()):
        core.requeue(leases)  # the client left while we waited: nobody can settle these
    request.app[METRICS].messages.labels("pull").inc(len(leases))
    schemas = core.schemas
    await load_schemas(schemas, [lease.message for lease in leases])  # Avro records as JSON
    return web.json_response({"messages": [lease_json(lease, schemas) for lease in leases]})


async def _settle(request: web.Request, *, nack: bool) -> web.Response:
    principal = await _principal(request)
    no_query(request)
    settings, access = request.app[SETTINGS], request.app[ACCESS]
    data, _ = await read_json(request, settings.max_body)
    receipts, requeue = parse_settle(data, settings.max_batch, nack=nack)
    answer = await settle_receipts(
        request.app[CORE],
        receipts,
        settle_outcome(nack=nack, requeue=requeue),
        lambda queue: access.authorize(principal, Permission.READ, queue),
    )
    request.app[METRICS].messages.labels("ack" if not nack else "nack").inc(answer["settled"])
    return web.json_response(answer)


# ---- destinations --------------------------------------------------------------------------
async def declare(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.CONFIGURE)
    data, size = await read_json(request, request.app[SETTINGS].max_body, required=False)
    options = parse_declare(data) if size else {}
    if "dead_letter" in options:  # a publish there later, on this user's permission
        principal, access = await _principal(request), request.app[ACCESS]
        options = for_user(options, principal, partial(access.authorize, principal))
    result = await request.app[CORE].call(lambda c: c.declare(str(dest), **options))
    return web.json_response(result.to_json())


async def delete(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.CONFIGURE, stored=True)
    await request.app[CORE].call(lambda c: c.delete(str(dest)))
    return web.json_response({"deleted": str(dest)})


async def purge(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.CONFIGURE, stored=True)
    purged = await request.app[CORE].call(lambda c: c.purge(str(dest)))
    return web.json_response({"purged": purged})


async def stats(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.READ)
    stats = await request.app[CORE].call(lambda c: c.stats(str(dest)))
    return web.json_response(stats.to_json())


async def get_metadata(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.READ, stored=True)
    return web.json_response(await request.app[CORE].call(lambda c: c.get_metadata(str(dest))))


async def set_metadata(request: web.Request) -> web.Response:
    dest = await _authorized(request, Permission.CONFIGURE, stored=True)
    data, _ = await read_json(request, request.app[SETTINGS].max_body)
    metadata = parse_metadata(data)
    await request.app[CORE].call(lambda c: c.set_metadata(str(dest), metadata))
    return web.json_response(metadata)


# ---- routes ----------------------------------------------------------------------------------
def add_routes(app: web.Application) -> None:
    add_settle_routes(app, _settle)
    r = app.router
    r.add_post("/v1/queue/{name}/pull", pull)
    r.add_post("/v1/{kind}/{name}/messages", publish)
    r.add_post("/v1/{kind}/{name}/purge", purge)
    r.add_get("/v1/{kind}/{name}/metadata", get_metadata)
    r.add_put("/v1/{kind}/{name}/metadata", set_metadata)
    r.add_put("/v1/{kind}/{name}", declare)
    r.add_delete("/v1/{kind}/{name}", delete)
    r.add_get("/v1/{kind}/{name}", stats)
    add_openapi_route(app, OPENAPI)
    add_health_routes(app, CORE)
