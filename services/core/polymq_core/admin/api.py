"""The operator's HTTP API on the core's admin port (``docs/admin-api.md``): the index,
connections, destinations, peek, publish and purge, and its OpenAPI document.

Reads of destinations come from the broker's memory (and, for one that sleeps, the shard's
record of it); what changes something, and peeks, go through the admin's own wire link
(:mod:`polymq_core.admin.link`) as any frontend's requests do, forwarded in a cluster.
Connections are asked of every frontend (and every core, for its wire clients) over the
system topics of :mod:`polymq_server.link.connections`. Who may call what is
:mod:`polymq_core.admin.auth`'s. The overview routes are the console's module's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from polymq.errors import BadRequest, Conflict, RequestError
from polymq.types import MAX_PRIORITY, ChannelRole, Destination, Kind, Message
from polymq_server.link.connections import CLOSE_TOPIC, LIST_TOPIC

from ..broker import Broker
from ..destinations.peek import MAX_PEEK
from ..destinations.queue import Queue
from ..destinations.shard import channel_inbox
from . import openapi as adminopenapi
from .auth import problem
from .link import AdminLink

__all__ = ["INDEX", "add_routes"]

API = web.AppKey("admin_api", object)  # the _Api of the app
INDEX = {  # the index's links (the overview's routes are the console's)
    "index": "/api/",
    "openapi": "/api/openapi.json",
    "overview": "/api/overview",
    "overview_history": "/api/overview/history",
    "overview_stream": "/api/overview/stream",
    "nodes": "/api/nodes",
    "cluster": "/api/cluster",
    "alarms": "/api/alarms",
    "connections": "/api/connections",
    "connection": "/api/connections/{id}",
    "destinations": "/api/destinations",
    "destination": "/api/destinations/{kind}/{name}",
    "messages": "/api/destinations/{kind}/{name}/messages",
    "contents": "/api/destinations/{kind}/{name}/contents",
    "reload": "/api/config/reload",
}
SORTS = ("name", "ready", "unacked", "consumers")
DEFAULT_LIMIT, MAX_LIMIT = 500, 10_000
RATE_INTERVAL = 5.0  # seconds between two readings of the destinations' counters
_FORGET_FRONTENDS = 600.0  # seconds a frontend that stopped answering is still listed
# a body shown as text (else base64): UTF-8 without control characters but tab and newlines
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class _Api:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.link = AdminLink(broker)
        # the destinations' (published, delivered) at the last two readings, and when
        self._last: tuple[float, dict[str, tuple[int, int]]] = (time.monotonic(), {})
        self._rates: dict[str, tuple[float, float]] = {}
        self._frontends: dict[str, tuple[str, float]] = {}  # id -> (protocol, last answer)

    # ---- rates ---------------------------------------------------------------------------
    def sample(self) -> None:
        """Read every in-memory destination's counters; rates over the last interval."""
        now = time.monotonic()
        then, before = self._last
        counters: dict[str, tuple[int, int]] = {}
        rates: dict[str, tuple[float, float]] = {}
        span = max(now - then, 1e-3)
        for shard in self.broker.shards:
            for key, holder in shard.holders.items():
                published = holder.published
                delivered = holder.delivered if isinstance(holder, Queue) else 0
                counters[key] = (published, delivered)
                was = before.get(key)
                if was is not None:
                    rates[key] = (
                        round(max(published - was[0], 0) / span, 3),
                        round(max(delivered - was[1], 0) / span, 3),
                    )
        self._last = (now, counters)
        self._rates = rates

    async def sampling(self, app: web.Application) -> AsyncIterator[None]:
        async def run() -> None:
            while True:
                await asyncio.sleep(RATE_INTERVAL)
                self.sample()

        task = asyncio.create_task(run(), name="polymq-admin-rates")
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await self.link.close()

    # ---- destinations ------------------------------------------------------------------------
    def row(self, key: str, stats: dict[str, Any]) -> dict[str, Any]:
        """A destination's document: the wire's stats and the admin API's names for them."""
        base, _, role = key.partition(">")
        kind, _, name = base.partition("/")
        publish_rate, deliver_rate = self._rates.get(key, (0.0, 0.0))
        out = dict(stats)
        out.update(
            destination=key,
            kind=kind,
            name=name,
            durable=bool(stats.get("options", {}).get("durable", False)),
            ready=int(stats.get("messages", 0)),
            unacked=int(stats.get("in_flight", 0)),
            consumers=int(stats.get("subscribers", 0)),
            publish_rate=publish_rate,
            deliver_rate=deliver_rate,
        )
        if role:
            out["role"] = role
        return out

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for shard in self.broker.shards:
            for key, holder in list(shard.holders.items()):
                out.append(self.row(key, {**holder.stats(), "in_memory": True}))
            for key, (options, _, _) in list(shard.dormant.items()):
                # asleep: nothing in memory, its record says what it is
                stats = {"messages": 0, "subscribers": 0, "options": options.to_dict()}
                out.append(self.row(key, {"destination": key, **stats, "in_memory": False}))
        return out

    async def one(self, dest: Destination) -> dict[str, Any]:
        """``dest``'s document, from the wire's ``Stats`` (in a cluster: the shard's
        leader's); NotFound if it does not exist."""
        client = await self.link.client()
        stats = (await client.stats(str(dest))).to_json()
        if dest.kind is not Kind.CHANNEL:
            return self.row(str(dest), stats)
        inboxes = [self.row(channel_inbox(dest.name, r), stats[r]) for r in ChannelRole]
        out = self.row(str(dest), {"destination": str(dest)})
        for part in ("ready", "unacked", "consumers"):
            out[part] = sum(r[part] for r in inboxes)
        out["durable"] = all(r["durable"] for r in inboxes if "options" in r)
        out.update({r["role"]: r for r in inboxes})
        return out

    # ---- connections ---------------------------------------------------------------------------
    async def connections(self) -> dict[str, Any]:
        answers = await self.link.ask(LIST_TOPIC, {})
        now = time.monotonic()
        rows: list[dict[str, Any]] = []
        answered = set()
        for answer in answers:
            fid, protocol = str(answer.get("frontend")), str(answer.get("protocol"))
            if fid in answered:
                continue  # (a frontend heard twice: once per node it reaches in a mesh)
            answered.add(fid)
            self._frontends[fid] = (protocol, now)
            rows.extend(c for c in answer.get("connections", []) if isinstance(c, dict))
        for fid, (_, heard) in list(self._frontends.items()):
            if now - heard > _FORGET_FRONTENDS:
                del self._frontends[fid]
        frontends = [
            {"id": fid, "protocol": protocol, "answered": fid in answered}
            for fid, (protocol, _) in sorted(self._frontends.items())
        ]
        rows.sort(key=lambda c: (str(c.get("protocol")), str(c.get("id"))))
        return {"connections": rows, "frontends": frontends}


def _api(request: web.Request) -> _Api:
    return _api_of(request.app)


def _failed(exc: RequestError) -> web.Response:
    return problem(exc.status, exc.code, exc.message)


def _destination(request: web.Request) -> Destination:
    return Destination.parse(f"{request.match_info['kind']}/{request.match_info['name']}")


# ---- handlers ------------------------------------------------------------------------------
async def index(request: web.Request) -> web.Response:
    return web.json_response({"links": INDEX})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(adminopenapi.DOCUMENT)


async def connections(request: web.Request) -> web.Response:
    try:
        return web.json_response(await _api(request).connections())
    except RequestError as exc:
        return _failed(exc)


async def connection(request: web.Request) -> web.Response:
    conn_id = request.match_info["id"]
    try:
        listed = await _api(request).connections()
    except RequestError as exc:
        return _failed(exc)
    for row in listed["connections"]:
        if row.get("id") == conn_id:
            return web.json_response(row)
    return problem(404, "not-found", f"no frontend has connection {conn_id[:100]!r}")


async def close_connection(request: web.Request) -> web.Response:
    conn_id = request.match_info["id"]
    try:
        answers = await _api(request).link.ask(
            CLOSE_TOPIC,
            {"id": conn_id, "reason": "closed by an administrator"},
            lambda answers: any(a.get("closed") for a in answers),
        )
    except RequestError as exc:
        return _failed(exc)
    if any(a.get("closed") is True and a.get("id") == conn_id for a in answers):
        return web.Response(status=204)
    return problem(404, "not-found", f"no frontend has connection {conn_id[:100]!r}")


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer {low}..{high}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be an integer {low}..{high}")
    return value


async def destinations(request: web.Request) -> web.Response:
    api = _api(request)
    q = request.query
    try:
        kind = q.get("kind")
        if kind is not None and kind not in {k.value for k in Kind}:
            raise BadRequest("kind must be queue, topic, stream or channel")
        sort = q.get("sort", "name")
        if sort.removeprefix("-") not in SORTS:
            raise BadRequest(f"sort must be one of {', '.join(SORTS)} (- first: descending)")
        limit = _query_int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    except RequestError as exc:
        return _failed(exc)
    text = q.get("q", "")
    rows = [
        r
        for r in api.rows()
        if (kind is None or r["kind"] == kind) and (not text or text in r["name"])
    ]
    field = sort.removeprefix("-")
    if field == "name":
        rows.sort(key=lambda r: str(r["destination"]), reverse=sort.startswith("-"))
    else:
        rows.sort(key=lambda r: (r[field], str(r["destination"])), reverse=sort.startswith("-"))
    return web.json_response({"destinations": rows[:limit]})


async def destination(request: web.Request) -> web.Response:
    try:
        return web.json_response(await _api(request).one(_destination(request)))
    except RequestError as exc:
        return _failed(exc)


async def delete_destination(request: web.Request) -> web.Response:
    api = _api(request)
    try:
        dest = _destination(request)
        if dest.kind is Kind.TOPIC:
            raise Conflict("topics are transient and cannot be deleted")
        await api.one(dest)  # 404 if unknown
        client = await api.link.client()
        await client.delete(str(dest))
    except RequestError as exc:
        return _failed(exc)
    return web.Response(status=204)


async def purge(request: web.Request) -> web.Response:
    api = _api(request)
    try:
        dest = _destination(request)
        if dest.kind is Kind.TOPIC:
            raise Conflict("topics hold no messages to purge")
        await api.one(dest)  # 404 if unknown
        client = await api.link.client()
        purged = await client.purge(str(dest))
    except RequestError as exc:
        return _failed(exc)
    return web.json_response({"purged": purged})


def _message_json(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": m.id,
        "seq": m.seq,
        "priority": m.priority,
        "persistent": m.persistent,
        "content_type": m.content_type,
        "headers": dict(m.headers),
        "redelivered": m.redelivered,
        "timestamp": m.timestamp,
    }
    try:
        text = m.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not _CONTROL.search(text):
        out["body"] = text
    else:
        out["body_base64"] = base64.b64encode(m.body).decode()
    return out


async def peek(request: web.Request) -> web.Response:
    api = _api(request)
    try:
        dest = _destination(request)
        count = _query_int(request, "count", 10, 1, MAX_PEEK)
        client = await api.link.client()
        messages = await client.peek(str(dest), count)  # (404 if unknown, 409 for a topic)
    except RequestError as exc:
        return _failed(exc)
    return web.json_response({"messages": [_message_json(m) for m in messages]})


def _publish_message(body: Any) -> Message:
    """The message a publish request's JSON describes; BadRequest if it is not one."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = set(body) - {
        "body",
        "body_base64",
        "content_type",
        "headers",
        "priority",
        "persistent",
    }
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(map(str, unknown)))[:200]}")
    if ("body" in body) == ("body_base64" in body):
        raise BadRequest("give the message as 'body' (text) or 'body_base64', one of them")
    if "body" in body:
        if not isinstance(body["body"], str):
            raise BadRequest("'body' must be a string")
        data = body["body"].encode("utf-8", "surrogatepass")
        content_type = "text/plain; charset=utf-8"
    else:
        try:
            data = base64.b64decode(str(body["body_base64"]), validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("'body_base64' must be base64") from None
        content_type = "application/octet-stream"
    content_type = body.get("content_type", content_type)
    headers = body.get("headers", {})
    priority = body.get("priority", 4)
    persistent = body.get("persistent", False)
    if not isinstance(content_type, str) or len(content_type) > 255:
        raise BadRequest("'content_type' must be a string of at most 255 characters")
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise BadRequest("'headers' must map strings to strings")
    if not _utf8(content_type, *headers, *headers.values()):
        raise BadRequest("'content_type' and 'headers' must be text (no lone surrogates)")
    if type(priority) is float and priority.is_integer():
        priority = int(priority)  # (2.0 is an integer to JSON)
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
        raise BadRequest(f"'priority' must be an integer 0..{MAX_PRIORITY}")
    if type(persistent) is not bool:
        raise BadRequest("'persistent' must be true or false")
    return Message(data, content_type, headers, priority, persistent)


def _utf8(*texts: str) -> bool:
    try:
        for text in texts:
            text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def publish(request: web.Request) -> web.Response:
    api = _api(request)
    try:
        dest = _destination(request)
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("the request body must be JSON") from None
        except RecursionError:
            raise BadRequest("malformed JSON: nested too deeply") from None
        message = _publish_message(body)
        client = await api.link.client()
        result = await client.publish(str(dest), message)
    except RequestError as exc:
        return _failed(exc)
    out: dict[str, Any] = {"id": result.ids[0] if result.ids else None}
    if result.seqs:
        out["seq"] = result.seqs[0]
    if result.to_topic:
        out["subscribers"] = result.subscribers
    return web.json_response(out, status=201)


def lister(app: web.Application) -> Callable[[], Awaitable[dict[str, Any]]]:
    """``GET /api/connections``'s listing, for the overview's counts per protocol."""
    return lambda: _api_of(app).connections()


def _api_of(app: web.Application) -> _Api:
    api = app[API]
    assert isinstance(api, _Api)
    return api


def add_routes(app: web.Application, broker: Broker) -> None:
    """The API's routes (but the overview's and those admin.py serves itself)."""
    api = _Api(broker)
    app[API] = api
    app.cleanup_ctx.append(api.sampling)
    r = app.router
    r.add_get("/api/", index)
    r.add_get("/api/openapi.json", openapi)
    r.add_get("/api/connections", connections)
    r.add_get("/api/connections/{id}", connection)
    r.add_delete("/api/connections/{id}", close_connection)
    r.add_get("/api/destinations", destinations)
    r.add_get("/api/destinations/{kind}/{name}", destination)
    r.add_delete("/api/destinations/{kind}/{name}", delete_destination)
    r.add_get("/api/destinations/{kind}/{name}/messages", peek)
    r.add_post("/api/destinations/{kind}/{name}/messages", publish)
    r.add_delete("/api/destinations/{kind}/{name}/contents", purge)
