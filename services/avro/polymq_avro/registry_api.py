"""The schema registry's handlers, under ``/v1/schemas/`` (the logic is ``registry.py``)::

    POST /v1/schemas/subjects/{subject}/versions          {"schema"} -> {"id", "version"}
    GET  /v1/schemas/subjects                             -> [subject, ...]
    GET  /v1/schemas/subjects/{subject}/versions          -> [1, 2, ...]
    GET  /v1/schemas/subjects/{subject}/versions/{n|latest}  -> {subject, version, id, schema}
    GET  /v1/schemas/ids/{id}                             -> {"id", "schema"}
    POST /v1/schemas/compatibility/subjects/{subject}/versions/latest
                                                          {"schema"} -> {is_compatible, messages}
    GET|PUT /v1/schemas/config/{subject}                  {"compatibility": ...}
    GET  /v1/schemas/config                               the server's default rule

An incompatible schema is a 409 whose problem details list the checker's reasons as
``messages`` (``problems.incompatible_middleware``).

Schemas are given as JSON text or as JSON, and answered as JSON text (as Confluent's
registry does). A schema's id is the SHA-256 of its whole JSON, keys sorted (64 hex
characters, ``registry.py``); ``/ids/`` also finds a schema stored before ids were digests
by the fingerprint it was stored under (16 hex characters).

Permissions, checked as if on the core's key/value keys: reading needs READ and changing
WRITE on ``kv/avro/subjects/<subject>`` (listing a subject's versions reads that one key); a
schema by id READ on ``kv/avro/schemas/<id>``. Listing the subjects, and reading the
server's default rule, need READ on every subject, checked as the core checks a listing
(``authorize_prefix``): a grant whose pattern ends in ``*`` and matches
``kv/avro/subjects/`` itself, such as ``kv/avro/subjects/*``, ``kv/avro/*`` or ``*`` (not
``kv/avro/subjects/?*``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from polymq.errors import BadRequest, NotFound, RequestError
from polymq_server.auth.provider import Permission
from polymq_server.messages.avro import KV_SCHEMAS, is_schema_id
from polymq_server.web.payloads import read_json

from .api import ACCESS, METRICS, REGISTRY, principal_of
from .compat import Compatibility
from .payloads import no_query
from .registry import SUBJECTS, check_subject, parse_schema_body

MAX_SCHEMA_BODY = 1024 * 1024  # the core's largest key/value value

_OUTCOMES = {200: "ok", 400: "invalid", 422: "invalid", 404: "not-found", 409: "incompatible"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _authorized(request: web.Request, permission: Permission, key: str) -> None:
    """Return if the request's principal holds ``permission`` on ``kv/<key>``, else Forbidden."""
    principal = await principal_of(request)
    no_query(request, frozenset())
    request.app[ACCESS].authorize(principal, permission, f"kv/{key}")


async def _authorized_prefix(request: web.Request, permission: Permission, prefix: str) -> None:
    """Return if the request's principal holds ``permission`` on every key ``kv/<prefix>...``,
    else Forbidden."""
    principal = await principal_of(request)
    no_query(request, frozenset())
    request.app[ACCESS].authorize_prefix(principal, permission, f"kv/{prefix}")


def _subject(request: web.Request) -> str:
    return check_subject(request.match_info["subject"])


def _op(name: str, handler: Handler) -> Handler:
    """``handler``, counted in ``polymq_avro_schema_operations`` by outcome."""

    async def counted(request: web.Request) -> web.StreamResponse:
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except (RequestError, web.HTTPException) as exc:
            status = exc.status
            raise
        finally:
            request.app[METRICS].schema_ops.labels(name, _OUTCOMES.get(status, "error")).inc()

    return counted


async def register(request: web.Request) -> web.Response:
    subject = _subject(request)
    await _authorized(request, Permission.WRITE, SUBJECTS + subject)
    data, _ = await read_json(request, MAX_SCHEMA_BODY)
    schema = parse_schema_body(data)
    version, _ = await request.app[REGISTRY].register(subject, schema)
    return web.json_response({"id": schema.id, "version": version})


async def list_subjects(request: web.Request) -> web.Response:
    await _authorized_prefix(request, Permission.READ, SUBJECTS)
    return web.json_response(await request.app[REGISTRY].subjects())


async def list_versions(request: web.Request) -> web.Response:
    subject = _subject(request)
    await _authorized(request, Permission.READ, SUBJECTS + subject)
    found = await request.app[REGISTRY].existing(subject)
    return web.json_response(list(range(1, len(found.versions) + 1)))


async def get_version(request: web.Request) -> web.Response:
    subject = _subject(request)
    await _authorized(request, Permission.READ, SUBJECTS + subject)
    version, schema = await request.app[REGISTRY].version(subject, request.match_info["version"])
    return web.json_response(
        {"subject": subject, "version": version, "id": schema.id, "schema": schema.json}
    )


async def get_schema(request: web.Request) -> web.Response:
    sid = request.match_info["id"]
    if not is_schema_id(sid):
        raise NotFound(f"{sid[:70]!r} is not a schema id (64 lowercase hex digits)")
    await _authorized(request, Permission.READ, KV_SCHEMAS + sid)
    schema = await request.app[REGISTRY].schema(sid)
    return web.json_response({"id": schema.id, "schema": schema.json})


async def check_compatibility(request: web.Request) -> web.Response:
    subject = _subject(request)
    await _authorized(request, Permission.READ, SUBJECTS + subject)
    data, _ = await read_json(request, MAX_SCHEMA_BODY)
    schema = parse_schema_body(data)
    messages = await request.app[REGISTRY].check(subject, schema)
    return web.json_response({"is_compatible": not messages, "messages": messages})


def _rule(data: Any) -> Compatibility:
    if not isinstance(data, dict) or set(data) != {"compatibility"}:
        raise BadRequest('the body must be {"compatibility": <rule>}')
    raw = data["compatibility"]
    try:
        return Compatibility(raw.upper() if isinstance(raw, str) else raw)
    except ValueError:
        names = ", ".join(c.value for c in Compatibility)
        raise BadRequest(f"compatibility must be one of {names}") from None


async def get_config(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    if "subject" not in request.match_info:
        await _authorized_prefix(request, Permission.READ, SUBJECTS)
        return web.json_response({"compatibility": registry.default.value})
    subject = _subject(request)
    await _authorized(request, Permission.READ, SUBJECTS + subject)
    found = await registry.subject(subject)
    return web.json_response({"compatibility": registry.rule(found).value})


async def put_config(request: web.Request) -> web.Response:
    subject = _subject(request)
    await _authorized(request, Permission.WRITE, SUBJECTS + subject)
    data, _ = await read_json(request, MAX_SCHEMA_BODY)
    rule = _rule(data)
    await request.app[REGISTRY].set_rule(subject, rule)
    return web.json_response({"compatibility": rule.value})


def add_routes(app: web.Application) -> None:
    r = app.router
    p = "/v1/schemas"
    r.add_post(f"{p}/subjects/{{subject}}/versions", _op("register", register))
    r.add_get(f"{p}/subjects", _op("list-subjects", list_subjects))
    r.add_get(f"{p}/subjects/{{subject}}/versions", _op("list-versions", list_versions))
    r.add_get(f"{p}/subjects/{{subject}}/versions/{{version}}", _op("get-version", get_version))
    r.add_get(f"{p}/ids/{{id}}", _op("get-schema", get_schema))
    r.add_post(
        f"{p}/compatibility/subjects/{{subject}}/versions/latest",
        _op("check", check_compatibility),
    )
    r.add_get(f"{p}/config", _op("get-config", get_config))
    r.add_get(f"{p}/config/{{subject}}", _op("get-config", get_config))
    r.add_put(f"{p}/config/{{subject}}", _op("set-config", put_config))
