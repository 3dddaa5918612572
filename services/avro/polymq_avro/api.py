"""The handlers of the Avro API and their routes (documented in ``openapi.py``).

::

    POST /v1/{queue|topic|stream}/{name}/records   a container or single-object records:
                                                   one message per record, one atomic publish
    GET  /v1/queue/{name}/records                  lease records (?max=&wait=&visibility=)
    GET  /v1/stream/{name}/records                 read a stream (?offset=&max=&wait=)
    POST /v1/ack, /v1/nack                         settle leases by receipt
    /v1/schemas/...                                the schema registry (``registry_api.py``)
    GET  /openapi.json /metrics /healthz /readyz

Each handler authenticates, checks its input, authorizes, and makes its requests to the
core through :class:`AvroLink`. Errors are raised (``Problem``, a polymq ``RequestError``,
an ``AvroError``) and answered as problem details by ``problems.problem_middleware``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from polymq import Lease, Message
from polymq.types import Destination, Kind
from polymq_server.auth.provider import Permission, Principal
from polymq_server.messages.avro import (
    HEADER_SIZE,
    AvroError,
    AvroSchema,
    SchemaCache,
    UnknownSchema,
    check_bounds,
    is_avro,
    message_schema_id,
)
from polymq_server.web.access import Access
from polymq_server.web.app import add_health_routes, add_openapi_route
from polymq_server.web.payloads import parse_pull_query, parse_settle, read_json
from polymq_server.web.problems import Problem, bad_request
from polymq_server.web.receipts import add_settle_routes, settle_outcome, settle_receipts

from .config import AvroSettings
from .container import TooLarge, write_container
from .corelink import AvroLink
from .metrics import AvroMetrics
from .payloads import (
    JSON_TYPE,
    check_content_type,
    idempotency_key,
    negotiate,
    no_query,
    parse_offset,
    parse_publish_query,
    parse_read_query,
    query_value,
    record_json,
)
from .records import (
    BodyKind,
    NeedSchema,
    Records,
    batch_digest,
    decode_container,
    messages,
    sniff,
    split_single,
)
from .registry import SUBJECTS, Registry, check_subject

SETTINGS = web.AppKey("settings", AvroSettings)
CORE = web.AppKey("core", AvroLink)
ACCESS = web.AppKey("access", Access)
METRICS = web.AppKey("metrics", AvroMetrics)
CACHE = web.AppKey("schema_cache", SchemaCache)
REGISTRY = web.AppKey("registry", Registry)
OPENAPI = web.AppKey("openapi", bytes)

RECEIPTS_HEADER = "X-Polymq-Receipts"
NEXT_HEADER = "X-Polymq-Next-Offset"
MAX_RECEIPTS_HEADER = 4096  # bytes: longer lists are in the container's metadata only
THREAD_ABOVE = 256 * 1024  # bodies larger than this are decoded off the event loop
MESSAGE_OVERHEAD = 128  # bytes a message takes in a publish frame besides its body
STREAM_QUERY = frozenset({"offset", "max", "wait"})


async def principal_of(request: web.Request) -> Principal:
    return await request.app[ACCESS].principal(request.headers.get("Authorization"), request.remote)


def destination(request: web.Request, kind: str | None = None) -> Destination:
    dest = Destination.parse(f"{kind or request.match_info['kind']}/{request.match_info['name']}")
    if dest.kind is Kind.CHANNEL:
        raise bad_request("records go to a queue, a topic or a stream (use the HTTP frontend "
                          "for channels)")  # fmt: skip
    return dest


# ---- publishing ----------------------------------------------------------------------------
async def read_body(request: web.Request, max_body: int) -> bytes:
    declared = request.content_length
    if declared is not None and declared > max_body:
        raise Problem(413, f"request body of {declared} bytes exceeds the maximum of {max_body}")
    return await request.read()  # aiohttp stops at client_max_size (413) for chunked bodies


async def decode(
    app: web.Application, body: bytes, named: tuple[str, ...] = (), subject: str | None = None
) -> Records:
    """Every record of ``body``, validated (off the event loop when the body is large); a
    single-object record's schema is the one of the ids ``named`` or of the versions of
    ``subject`` with its fingerprint, else the one registered schema with it."""
    settings, registry = app[SETTINGS], app[REGISTRY]
    kind = sniff(body)
    big = len(body) > THREAD_ABOVE
    if kind is BodyKind.CONTAINER:
        limits = {
            "max_records": settings.avro_max_records,
            "max_decoded": settings.avro_max_decoded,
        }
        if big:
            return await asyncio.to_thread(decode_container, body, **limits)
        return decode_container(body, **limits)
    known: dict[str, AvroSchema] = {}
    while True:  # a pass stops at the first id not loaded yet: load it, go again
        try:
            if big:
                return await asyncio.to_thread(
                    split_single, body, known.get, max_records=settings.avro_max_records
                )
            return split_single(body, known.get, max_records=settings.avro_max_records)
        except NeedSchema as need:
            try:
                known[need.fingerprint] = await registry.resolve(need.fingerprint, named, subject)
            except UnknownSchema as exc:
                raise Problem(
                    422,
                    f"a record has fingerprint {need.fingerprint}: {exc.message} "
                    "(register its schema under /v1/schemas/, or send an object container)",
                    code="unknown-schema",
                ) from None


def check_size(core: AvroLink, records: Records) -> int:
    """The bytes the publish will take; TooLarge if the core would refuse it."""
    size = records.size + MESSAGE_OVERHEAD * records.count + 1024
    frame = core.limit("max_frame")
    if frame is not None and size > frame:
        raise TooLarge(
            f"these {records.count} records make a publish of about {size} bytes, more than "
            f"the core takes at once ({frame}); send fewer records per request"
        )
    max_body = core.limit("max_body")
    if max_body is not None and records.bodies:
        largest = max(map(len, records.bodies))
        if largest > max_body:
            raise TooLarge(f"a record of {largest} bytes is larger than a message may be")
    return size


async def publish(request: web.Request) -> web.Response:
    principal = await principal_of(request)
    app = request.app
    settings, core, metrics, access = app[SETTINGS], app[CORE], app[METRICS], app[ACCESS]
    options = parse_publish_query(request)
    dest = destination(request)
    access.authorize(principal, Permission.WRITE, str(dest))
    core.refuse_publish_in_alarm()  # a resource alarm holds publishers: 503
    if options.subject is not None:
        check_subject(options.subject)
        access.authorize(principal, Permission.WRITE, f"kv/{SUBJECTS}{options.subject}")
    key = idempotency_key(request)
    check_content_type(request)
    body = await read_body(request, settings.avro_max_body)
    metrics.bytes.labels("in").inc(len(body))
    try:
        records = await decode(app, body, options.schema_ids, options.subject)
        size = check_size(core, records)
    except Exception:
        metrics.batches.labels("rejected").inc()
        raise
    del body
    registry = app[REGISTRY]
    answer: dict[str, Any] = {"count": records.count}
    ids = list(records.schemas)
    answer["schema_id"] = ids[0] if len(ids) == 1 else None
    answer["schema_ids"] = ids
    try:
        for schema in records.schemas.values():
            if records.kind is BodyKind.CONTAINER:
                await registry.store(schema)  # so that readers can decode what follows
            if options.subject is not None:
                version, _ = await registry.register(options.subject, schema)
                answer["subject"], answer["version"] = options.subject, version
    except Exception:
        metrics.batches.labels("rejected").inc()
        raise
    if not records.count:  # an empty container: nothing to publish
        answer.update(ids=[], seqs=[], duplicate=False)
        if dest.kind is Kind.TOPIC:
            answer = {"count": 0, "subscribers": 0, **answer}
            del answer["ids"], answer["seqs"]
        return web.json_response(answer)
    batch = messages(
        records, persistent=options.persistent, priority=options.priority, ttl=options.ttl
    )
    batch_id = None
    if key is not None:
        batch_id = f"avro:{key}:{batch_digest(records, options.persistent, options.priority)}"
    window = settings.avro_idempotency_window if batch_id is not None else None
    try:
        result = await core.publish(str(dest), batch, size, batch_id=batch_id, batch_ttl=window)
    except Exception:
        metrics.batches.labels("failed").inc()
        raise
    duplicate = result.duplicate
    if duplicate:
        metrics.batches.labels("duplicate").inc()
        metrics.duplicates.inc(records.count)
    else:
        metrics.batches.labels("published").inc()
        metrics.records.labels("in").inc(records.count)
    answer["count"] = result.count
    if dest.kind is Kind.TOPIC:
        answer["subscribers"] = result.subscribers
    else:
        answer["ids"], answer["seqs"] = result.ids, result.seqs
    answer["duplicate"] = duplicate
    return web.json_response(answer)


# ---- reading -------------------------------------------------------------------------------
async def schemas_of(cache: SchemaCache, items: list[Message]) -> dict[str, AvroSchema | None]:
    """The schema of each Avro message's id (``message_schema_id``; None for ids that are
    not registered, or whose stored schema is damaged)."""
    out: dict[str, AvroSchema | None] = {}
    for m in items:
        sid = message_schema_id(m)
        if sid is not None:
            if sid not in out:
                try:
                    out[sid] = await cache.get(sid)
                except AvroError:
                    out[sid] = None
    return out


def run_of(items: list[Message], schema: AvroSchema | None = None) -> int:
    """How many messages from the first share its Avro schema (0 if it is not Avro); given
    that ``schema``, only as many as keep its bounds (``check_bounds``): a record nested
    too deeply for a reader's decoder never goes into a container (it is read as JSON, with
    its error, instead)."""
    sid = message_schema_id(items[0]) if items else None
    if sid is None:
        return 0
    head = items[0].body[:10]
    n = 0
    while n < len(items) and message_schema_id(items[n]) == sid and items[n].body[:10] == head:
        if schema is not None:
            try:
                check_bounds(items[n].body, HEADER_SIZE, schema)
            except (ValueError, EOFError):
                break
        n += 1
    return n


def schema_for(schemas: dict[str, AvroSchema | None], message: Message) -> AvroSchema | None:
    """The schema of ``message`` among ``schemas`` (from :func:`schemas_of`), or None."""
    sid = message_schema_id(message)
    return None if sid is None else schemas.get(sid)


def not_container(message: Message, schema_known: bool, hint: str) -> Problem:
    if not is_avro(message):
        why = f"message {message.seq} is not Avro (content type {message.content_type[:80]!r})"
    elif not schema_known:
        why = f"message {message.seq} is of schema {message_schema_id(message)}, not registered"
    else:
        why = f"message {message.seq} holds a record nested too deeply for a container's readers"
    return Problem(406, f"{why}: read it with Accept: {JSON_TYPE}{hint}", code="not-acceptable")


def container_response(
    media: str,
    schema: AvroSchema,
    items: list[Message],
    metadata: dict[str, str],
    headers: dict[str, str],
    metrics: AvroMetrics,
) -> web.Response:
    body = write_container(schema.json, (m.body[10:] for m in items), metadata=metadata)
    metrics.records.labels("out").inc(len(items))
    metrics.bytes.labels("out").inc(len(body))
    headers = {**headers, "X-Polymq-Schema-Id": schema.id}
    return web.Response(body=body, content_type=media, headers=headers)


async def read_queue(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    app = request.app
    settings, core, metrics, cache = app[SETTINGS], app[CORE], app[METRICS], app[CACHE]
    dest = destination(request, "queue")
    app[ACCESS].authorize(principal, Permission.READ, str(dest))
    n, wait, visibility = parse_pull_query(request, settings.avro_max_pull, settings.avro_max_wait)
    media = negotiate(request.headers.get("Accept"))
    leases = await core.pull(str(dest), n, wait, visibility)
    transport = request.transport
    if leases and (transport is None or transport.is_closing()):
        core.requeue(leases)  # the client left while we waited: nobody can settle these
        return web.Response(status=499)
    try:
        items = [lease.message for lease in leases]
        schemas = await schemas_of(cache, items)
    except BaseException:
        core.requeue(leases)
        raise
    if media == JSON_TYPE:
        records = [
            record_json(lease.message, schema_for(schemas, lease.message), lease.receipt)
            for lease in leases
        ]
        return _json_answer(metrics, {"records": records, "next": None}, len(records))
    if not leases:
        return web.Response(status=204)
    taken = run_of(items)
    schema = schema_for(schemas, items[0]) if taken else None
    if schema is not None:
        taken = run_of(items, schema)
    if schema is None or not taken:
        core.requeue(leases)
        raise not_container(items[0], schema is not None, "")
    kept: list[Lease] = leases[:taken]
    core.requeue(leases[taken:])  # another schema (or not Avro): the next read takes them
    receipts = json.dumps([lease.receipt for lease in kept])
    headers = {}
    if len(receipts) <= MAX_RECEIPTS_HEADER:
        headers[RECEIPTS_HEADER] = receipts
    metadata = {"polymq.receipts": receipts}
    return container_response(media, schema, items[:taken], metadata, headers, metrics)


async def read_stream(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    app = request.app
    settings, core, metrics, cache = app[SETTINGS], app[CORE], app[METRICS], app[CACHE]
    dest = destination(request, "stream")
    app[ACCESS].authorize(principal, Permission.READ, str(dest))
    no_query(request, STREAM_QUERY)
    offset = parse_offset(query_value(request, "offset"))
    n, wait = parse_read_query(request, settings.avro_max_pull, settings.avro_max_wait)
    media = negotiate(request.headers.get("Accept"))
    result = await core.read_stream(str(dest), offset, n, wait)
    items: list[Message] = list(result.messages)
    schemas = await schemas_of(cache, items)
    assert result.cursor is not None  # (a cursor opened for the read: the core answers one)
    after = result.cursor + 1  # the offset that reads on from here
    if media == JSON_TYPE:
        records = [record_json(m, schema_for(schemas, m), None) for m in items]
        return _json_answer(
            metrics, {"records": records, "next": str(after)}, len(records), str(after)
        )
    if not items:
        return web.Response(status=204, headers={NEXT_HEADER: str(after)})
    taken = run_of(items)
    schema = schema_for(schemas, items[0]) if taken else None
    if schema is not None:
        taken = run_of(items, schema)
    if schema is None or not taken:
        hint = f" (or skip it with offset={items[0].seq + 1})"
        raise not_container(items[0], schema is not None, hint)
    after = items[taken - 1].seq + 1
    metadata, headers = {"polymq.next": str(after)}, {NEXT_HEADER: str(after)}
    return container_response(media, schema, items[:taken], metadata, headers, metrics)


def _json_answer(
    metrics: AvroMetrics, answer: dict[str, Any], count: int, after: str | None = None
) -> web.Response:
    body = json.dumps(answer, separators=(",", ":"), allow_nan=False).encode()
    metrics.records.labels("out").inc(count)
    metrics.bytes.labels("out").inc(len(body))
    headers = {NEXT_HEADER: after} if after is not None else None
    return web.Response(body=body, content_type=JSON_TYPE, headers=headers)


# ---- settling (as the JSON over HTTP frontend) --------------------------------------------
async def _settle(request: web.Request, *, nack: bool) -> web.Response:
    principal = await principal_of(request)
    no_query(request, frozenset())
    app = request.app
    settings, access = app[SETTINGS], app[ACCESS]
    data, _ = await read_json(request, 16 * 1024 * 1024)
    receipts, requeue = parse_settle(data, settings.avro_max_pull, nack=nack)
    answer = await settle_receipts(
        app[CORE],
        receipts,
        settle_outcome(nack=nack, requeue=requeue),
        lambda queue: access.authorize(principal, Permission.READ, queue),
    )
    return web.json_response(answer)


# ---- routes ----------------------------------------------------------------------------------
def add_routes(app: web.Application) -> None:
    add_settle_routes(app, _settle)
    r = app.router
    r.add_get("/v1/queue/{name}/records", read_queue)
    r.add_get("/v1/stream/{name}/records", read_stream)
    r.add_post("/v1/{kind}/{name}/records", publish)
    add_openapi_route(app, OPENAPI)
    add_health_routes(app, CORE)
