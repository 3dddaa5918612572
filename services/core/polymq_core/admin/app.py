"""The core's admin HTTP: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/cluster`` (and
``/api/nodes``), the operator's API (:mod:`polymq_core.admin.api`, logins checked by
:mod:`polymq_core.admin.auth`), the overview (:mod:`.overview`) and the console at ``/``
(:mod:`.console`); on a cluster node also
``/api/cluster/snapshot/{shard}``, a copy of a shard's SQLite for another node (its bearer
token the cluster secret)."""

from __future__ import annotations

import asyncio
import hmac
import os
import ssl
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq_server.web.app import healthz
from polymq_server.web.guards import cross_site_guard, json_writes
from polymq_server.web.requestmetrics import add_metrics_route

from ..broker import Broker
from ..cluster.snapshot import APPLIED_HEADER
from ..reload import Reloader, ReloadError, new_change
from ..reload import page as reload_page
from ..store.contract import StoreError
from . import api as adminapi
from . import console, overview
from .auth import AdminAccess, problem


class ClusterView(Protocol):
    secret: str  # the cluster secret: what other nodes present
    serve_ssl: ssl.SSLContext | None  # cluster TLS: peers reach this node's admin over it
    remove_on_leave: bool  # a planned stop takes this node out of the shards' replicas

    def ready(self) -> bool: ...
    def describe(self) -> dict[str, Any]: ...
    async def snapshot(self, shard: int) -> tuple[Path, int]: ...
    async def reload(self, change: dict[str, Any]) -> str | None: ...


BROKER = web.AppKey("broker", Broker)
CLUSTER = web.AppKey("cluster", object)  # a ClusterView, or None on a single node
RELOADER = web.AppKey("reloader", Reloader)
_CHUNK = 1024 * 1024  # bytes of a snapshot read and sent at a time


def _cluster(app: web.Application) -> ClusterView | None:
    return app.get(CLUSTER)  # type: ignore[return-value]


async def readyz(request: web.Request) -> web.Response:
    """Ready: the stores are open; in a cluster, this node can also commit or forward every
    shard's writes (each has a leader this node is or reaches)."""
    ready = request.app[BROKER].ready
    view = _cluster(request.app)
    if ready and view is not None and not view.ready():
        return web.json_response(
            {"status": "not ready", "cluster": view.describe()["shards"]}, status=503
        )
    return web.json_response(
        {"status": "ready" if ready else "starting"}, status=200 if ready else 503
    )


async def cluster(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    view = _cluster(request.app)
    if view is not None:
        return web.json_response(view.describe())
    me = {
        "id": broker.settings.node_name,
        "self": True,
        "state": "ready" if broker.ready else "joining",
        "shards_led": [s.index for s in broker.shards],
        **broker.describe(),
    }
    return web.json_response({"node_id": broker.settings.node_name, "nodes": [me]})


def _unless_secret(request: web.Request, view: ClusterView, what: str) -> web.Response | None:
    """A 401 problem unless the request carries the cluster secret as its bearer token."""
    given = request.headers.get("Authorization", "").encode()
    if hmac.compare_digest(given, f"Bearer {view.secret}".encode()):
        return None
    return problem(
        401,
        "unauthorized",
        f"{what}: send the cluster secret as a bearer token",
        {"WWW-Authenticate": 'Bearer realm="polymq-cluster"'},
    )


def _for_peers(request: web.Request, what: str) -> ClusterView | web.Response:
    """The cluster's view for a request only peers make, or its refusal: 404 on a node
    that is not in a cluster, 401 without the cluster secret."""
    view = _cluster(request.app)
    if view is None:
        return problem(404, "not-found", "this node is not part of a cluster")
    return _unless_secret(request, view, what) or view


async def reload(request: web.Request) -> web.Response:
    """``POST /api/config/reload`` ``{"log_level"?, "users"?}``: apply it here, and in a
    cluster on every node (broadcast on system.config; the cluster secret as bearer token
    required there). Answers the reload's version and what went wrong here, if anything."""
    view = _cluster(request.app)
    if view is not None:
        refused = _unless_secret(request, view, "a reload reaches every node")
        if refused is not None:
            return refused
    try:
        change = new_change(await request.json())
    except ValueError as exc:  # (ReloadError, or a body that is not JSON)
        return problem(400, "bad-request", str(exc))
    except RecursionError:
        return problem(400, "bad-request", "malformed JSON: nested too deeply")
    if view is not None:
        error = await view.reload(change)
    else:
        try:
            request.app[RELOADER].apply(change)
            error = None
        except ReloadError as exc:
            error = str(exc)
    return web.json_response(
        {"version": change["version"], "applied_here": error is None, "error": error}
    )


async def leave(request: web.Request) -> web.Response:
    """``POST /api/cluster/leave`` (the cluster secret as bearer token): this node is not
    coming back, so its next planned stop (SIGTERM) takes it out of every shard's replicas
    (JetStream's peer removal) after handing on what it leads; what a pod's ``preStop``
    calls when the StatefulSet is scaled below it. The node keeps serving until the stop."""
    view = _for_peers(request, "leaving the cluster")
    if isinstance(view, web.Response):
        return view
    view.remove_on_leave = True
    return web.json_response({"node_id": view.describe()["node_id"], "leave": "remove"})


async def reload_form(request: web.Request) -> web.Response:
    """``GET /reload``: the console's form for a reload (posts to /api/config/reload)."""
    broker = request.app[BROKER]
    view = _cluster(request.app)
    text = reload_page(broker.settings.node_name, view is not None, request.app[RELOADER].version)
    return web.Response(text=text, content_type="text/html")


async def snapshot(request: web.Request) -> web.StreamResponse:
    """A consistent copy of a shard's SQLite, for a node whose next log entry was purged:
    only for peers (``Authorization: Bearer <cluster secret>``); the log sequence applied in
    the copy in ``X-Polymq-Applied``."""
    view = _for_peers(request, "a shard's snapshot is for the cluster's nodes")
    if isinstance(view, web.Response):
        return view
    transport = request.transport
    if view.serve_ssl is not None and (
        transport is None or transport.get_extra_info("sslcontext") is None
    ):  # with cluster TLS, a shard's data leaves only over TLS, to a node's certificate
        return problem(
            403, "forbidden", "with cluster TLS, snapshots are served on the peers' TLS port"
        )
    shard = int(request.match_info["shard"])
    try:
        path, applied = await view.snapshot(shard)
    except IndexError:
        return problem(404, "not-found", f"no shard {shard}")
    except StoreError as exc:
        return problem(503, "unavailable", f"shard {shard} cannot be copied now: {exc}")
    try:
        f = await asyncio.to_thread(path.open, "rb")
    finally:
        await asyncio.to_thread(path.unlink, missing_ok=True)  # the open file stays readable
    try:
        response = web.StreamResponse(
            headers={APPLIED_HEADER: str(applied), "Content-Type": "application/vnd.sqlite3"}
        )
        response.content_length = os.fstat(f.fileno()).st_size
        await response.prepare(request)
        while chunk := await asyncio.to_thread(f.read, _CHUNK):
            await response.write(chunk)
        await response.write_eof()
    finally:
        await asyncio.to_thread(f.close)
    return response


async def alarms_api(request: web.Request) -> web.Response:
    """``GET /api/alarms``: the resource alarms on, with what was measured and the limits."""
    monitor = request.app[BROKER].monitor
    return web.json_response({"alarms": sorted(monitor.alarms), **monitor.detail})


def admin_app(
    broker: Broker,
    registry: CollectorRegistry,
    view: ClusterView | None = None,
    reloader: Reloader | None = None,
) -> web.Application:
    """``view``: this node's part in a cluster, or None on a single node; ``reloader``:
    what applies a configuration reload here (none: reloads are refused)."""
    access = AdminAccess(broker.auth, view.secret if view is not None else None)
    # a browser's cross-site write: 403; a body that is not JSON: 415; then the login
    app = web.Application(middlewares=[cross_site_guard, json_writes, access.middleware])
    app[BROKER] = broker
    app[CLUSTER] = view
    app[RELOADER] = reloader if reloader is not None else Reloader(broker.auth)
    add_metrics_route(app, registry)
    console.add_routes(app, broker.settings.console_chart)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/cluster", cluster)
    app.router.add_get("/api/alarms", alarms_api)
    app.router.add_get(r"/api/cluster/snapshot/{shard:\d+}", snapshot)
    app.router.add_post("/api/config/reload", reload)
    app.router.add_get("/reload", reload_form)
    app.router.add_post("/api/cluster/leave", leave)
    app.router.add_get("/api/nodes", cluster)
    adminapi.add_routes(app, broker)  # (/api/destinations and the rest of the API)
    overview.add_routes(app, broker, adminapi.lister(app))
    return app
