"""The shared base of polymq's aiohttp frontends (``polymq_http``, ``polymq_longpoll``,
``polymq_avro``): what each of them would otherwise write again.

- :class:`WebService`: one aiohttp app on one TCP listener (HTTPS when the settings name a
  certificate and key, ``POLYMQ_TLS_CERT``/``POLYMQ_TLS_KEY``, or an ``ssl.SSLContext`` is
  given; plain HTTP otherwise), started and stopped in aiohttp's documented order
  (``docs/web_advanced.rst``): stop accepting, ``on_shutdown`` (waiting requests answer
  now), let in-flight requests finish within :data:`SHUTDOWN_TIMEOUT`, then the app's
  ``cleanup_ctx`` (the core link closes last: :func:`add_core_link`). Its listener
  (:class:`polymq_server.web.listener.HttpListener`) takes at most ``POLYMQ_MAX_CONNECTIONS`` at
  once.
- :func:`deadline_runner`: the runner of an app whose requests' headers and body must come
  within ``POLYMQ_HANDSHAKE_TIMEOUT`` (every frontend's, and the core's admin HTTP).
- :class:`FrontendLink`: a :class:`polymq_server.link.corelink.CoreLink` built from a frontend's
  settings, that keeps the core-link metrics (in its
  :class:`~polymq_server.web.requestmetrics.RequestMetrics`), warns when a limit of the frontend
  is above the core's, and runs requests that wait at the core (long polls) so that they
  answer empty at once when the service stops (:meth:`FrontendLink.waiting`).
- :func:`problem_response`: an RFC 9457 problem details answer
  (``application/problem+json``); the translation of exceptions into them is
  :mod:`polymq_server.web.problems`'.
- :func:`healthz`, :func:`readiness` and :func:`add_health_routes`: ``/healthz`` and
  ``/readyz``.
- :func:`published_json`: the answer to a JSON publish (``POST /v1/{kind}/{name}/messages``).
- :func:`add_openapi_route`: ``GET /openapi.json``.

Elsewhere: the request metrics and ``GET /metrics`` are ``requestmetrics.py``'s, settling
leases by receipt (``POST /v1/ack`` and ``/v1/nack``) ``receipts.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import (
    CollectorRegistry,
)

from polymq.answers import Published
from polymq.client import Client
from polymq.failover import Reconnected
from polymq.types import Destination, Kind, Message

from ..config import FrontendSettings, core_ssl_context, server_ssl_context
from ..link import connectiongauge
from ..link.connections import ConnectionTable
from ..link.corelink import CORE_TIMEOUT, CoreLink
from ..resources import ConnectionLimits
from .listener import HttpListener, connection_middleware, listener_metrics
from .problemdoc import PROBLEM_JSON, problem_code, problem_document, status_phrase
from .requestmetrics import RequestMetrics
from .serverlog import SERVER_LOG

__all__ = [
    "CHALLENGE",
    "LINGER_BYTES",
    "PROBLEM_JSON",
    "SHUTDOWN_TIMEOUT",
    "FrontendLink",
    "WebService",
    "WebSettings",
    "add_core_link",
    "add_health_routes",
    "add_openapi_route",
    "answered",
    "deadline_runner",
    "healthz",
    "link_state",
    "problem_code",
    "problem_response",
    "published_json",
    "readiness",
    "refuse_unread",
    "status_phrase",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
S = TypeVar("S", bound="WebSettings")
L = TypeVar("L", bound=CoreLink)

SHUTDOWN_TIMEOUT = 10.0  # seconds in-flight requests get to finish at shutdown
# bytes of a refused request's body still to come under which it is read and dropped
# (aiohttp's lingering close) rather than the connection closed at once (refuse_unread)
LINGER_BYTES = 64 * 1024
# the client connections of the app's listener, as the admin API lists them (add_core_link)
CONNECTIONS = web.AppKey("connections", ConnectionTable)
CHALLENGE = 'Basic realm="polymq", Bearer'


# ---- the service ---------------------------------------------------------------------------
HANDSHAKE_TIMEOUT = 10.0  # seconds for a request's headers, then for its body (as RabbitMQ's)


def _body_deadline(timeout: float) -> Middleware:
    """Read a request's body before its handler runs (which then reads it from memory),
    answering 408 and closing when no byte of it came for ``timeout`` seconds: a body
    shorter than its ``Content-Length``, or a chunk that never comes, must not hold a
    handler forever, while a large body that keeps coming has the time it needs.
    Innermost (after the login's check, :mod:`polymq_server.web.guards`), so that aiohttp's
    413 for a chunked body over the limit reaches the app's problem middleware; a body
    declared over the limit is answered 413 at once, without reading it
    (:func:`refuse_unread`), and one that aiohttp cannot read 400 (:func:`_unreadable`)."""

    @web.middleware
    def body_deadline(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
        if not request.body_exists:
            return handler(request)  # (not a coroutine: no frame of its own in a waiting poll)
        declared, limit = request.content_length, request.client_max_size
        if declared is not None and declared > limit:
            detail = f"request body of {declared} bytes exceeds the maximum of {limit}"
            return refuse_unread(request, problem_response(413, detail))
        return read_first(request, handler)

    async def read_first(request: web.Request, handler: Handler) -> web.StreamResponse:
        reading = asyncio.ensure_future(request.read())
        try:
            seen = request.content.total_bytes
            while not reading.done():
                await asyncio.wait((reading,), timeout=timeout)
                if not reading.done() and request.content.total_bytes == seen:
                    response = problem_response(
                        408, f"no byte of the request's body came for {timeout:g} seconds",
                        code="timeout",
                    )  # fmt: skip
                    response.force_close()
                    return response
                seen = request.content.total_bytes
            reading.result()  # (aiohttp's 413 for a chunked body over the limit)
        except web.RequestPayloadError as exc:
            return await _unreadable(request, exc)
        finally:
            reading.cancel()
        return await handler(request)

    return body_deadline


async def _unreadable(request: web.Request, exc: web.RequestPayloadError) -> web.Response:
    """The 400 for a body aiohttp's parser cannot read (a ``Content-Encoding`` that does
    not decode, broken chunks): the client's error, not ours. It is sent and the connection
    closed at once, as the parser cannot find the next request after such a body (aiohttp
    would otherwise read on to drop the rest, meet the same error and log it)."""
    cause = exc.__cause__
    detail = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
    response = problem_response(
        400, f"the request's body cannot be read: {detail}", code="bad-request"
    )
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


def deadline_runner(
    app: web.Application,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    *,
    handler_cancellation: bool = False,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
) -> web.AppRunner:
    """The runner of ``app`` (not set up yet) with the deadlines of every polymq HTTP
    listener: a request's headers must come within ``handshake_timeout`` seconds (aiohttp's
    keep-alive timer, which also closes a connection idle that long), then no more than
    that may pass between two bytes of its body (:func:`_body_deadline`, added to ``app``'s
    middlewares as the innermost). A request aiohttp cannot parse is logged at DEBUG, not
    as an ERROR with a traceback (:mod:`polymq_server.web.serverlog`)."""
    app.middlewares.append(_body_deadline(handshake_timeout))
    return web.AppRunner(
        app,
        access_log=None,
        logger=SERVER_LOG,
        handler_cancellation=handler_cancellation,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=handshake_timeout,
        # after an answer given before the whole body came (408, 413), the rest is read
        # and dropped for at most this long, then the connection closes
        lingering_time=handshake_timeout,
    )


class WebSettings(FrontendSettings, Protocol):
    """What :class:`WebService` reads of a frontend's settings besides
    :class:`~polymq_server.config.FrontendSettings`: ``POLYMQ_HANDSHAKE_TIMEOUT`` and
    ``POLYMQ_MAX_CONNECTIONS``."""

    @property
    def handshake_timeout(self) -> float: ...
    @property
    def max_connections(self) -> int: ...


class WebService(Generic[S]):
    """An aiohttp frontend as a running service: its app (made by ``build_app`` from the
    checked settings and the registry, a new one if none is given) on ``port``, over TLS
    with ``ssl_context`` (by default the one of the settings' ``tls_cert``/``tls_key``, and
    none when they are unset). The context is made here, so that a certificate that does
    not load is a ``ConfigError`` before anything starts.

    ``start()`` runs the app's ``cleanup_ctx`` (which connects to the core), binds the
    listener and returns ``{name: port}``; ``stop()`` shuts down in aiohttp's order.

    The listener (:class:`~polymq_server.web.listener.HttpListener`) takes at most the settings'
    ``max_connections`` at once (0: the room the open-files limit leaves), answering the
    others 503 at accept; ``polymq_<name>_connections`` and ``..._connections_refused``
    count them."""

    name: ClassVar[str]  # the key of its port in ``ports`` (and in ``polymq run``'s file)
    backlog: ClassVar[int] = 128  # aiohttp's default

    def __init__(
        self,
        settings: S,
        registry: CollectorRegistry | None,
        build_app: Callable[[S, CollectorRegistry], web.Application],
        *,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        settings.check()
        if ssl_context is None and settings.tls_cert and settings.tls_key:
            ssl_context = server_ssl_context(settings.tls_cert, settings.tls_key)
        self.settings = settings
        self.ssl_context = ssl_context
        self.registry = registry if registry is not None else CollectorRegistry()
        self.app = build_app(settings, self.registry)
        self.app.middlewares.insert(0, self._lame_duck_middleware())
        if CONNECTIONS in self.app:
            self.app.middlewares.insert(0, connection_middleware)
        # seconds a client has for a request's headers, then between bytes of its body
        self.handshake_timeout = settings.handshake_timeout
        self.limits = ConnectionLimits(f"the {self.name} listener", settings.max_connections)
        self.listener_metrics = listener_metrics(self.registry, f"polymq_{self.name}", "HTTP")
        connectiongauge.watch_connections(  # polymq_client_connections{protocol=<name>} reads it
            self.registry,
            self.name,
            self.name,
            self.listener_metrics.connections,
            {"listener": self.name},
        )
        self.port = port
        self.lame = False  # stopping: no new connections, requests told to go elsewhere
        self._runner: web.AppRunner | None = None
        self._listener: HttpListener | None = None
        self.ports: dict[str, int] = {}

    async def start(self) -> dict[str, int]:
        self._runner = deadline_runner(self.app, self.handshake_timeout, handler_cancellation=True)
        await self._runner.setup()  # runs the cleanup_ctx: connects to the core
        self._listener = HttpListener(
            self._runner,
            self.settings.host,
            self.port,
            self.limits,
            name=self.name,
            metrics=self.listener_metrics,
            ssl_context=self.ssl_context,
            backlog=self.backlog,
            handshake_timeout=self.handshake_timeout,
            connections=self.app.get(CONNECTIONS),
            protocol=self.name,
        )
        self.ports[self.name] = await self._listener.start()
        self.started()
        return self.ports

    @property
    def scheme(self) -> str:
        """``https`` when the listener speaks TLS, else ``http``."""
        return "https" if self.ssl_context is not None else "http"

    @property
    def url(self) -> str:
        """The listener's base URL, once started (``https://127.0.0.1:7480/``)."""
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        return f"{self.scheme}://{host}:{self.ports[self.name]}/"

    def started(self) -> None:
        """Say where it listens (:attr:`url`: https or http) and what it serves (each
        frontend logs its own line)."""

    def _lame_duck_middleware(self) -> Middleware:
        @web.middleware
        def lame_duck(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
            if not self.lame:
                return handler(request)  # (not a coroutine: no frame in a waiting poll)
            response = problem_response(
                503, "this instance is shutting down: retry (on another)", code="unavailable"
            )
            response.force_close()  # Connection: close (a load balancer picks another)
            return answered(response)

        return lame_duck

    async def lame_duck(self) -> None:
        """The first step of a stop: accept no new connections; a request that still
        comes on an open one is answered 503 with ``Retry-After`` and ``Connection:
        close`` (those already running finish in :meth:`stop`)."""
        self.lame = True
        if self._listener is not None:
            self._listener.close()

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if listener is not None:
            await listener.wait_closed()


async def answered(response: web.StreamResponse) -> web.StreamResponse:
    """``response`` as the awaitable a middleware that is no coroutine returns."""
    return response


def link_state(core: CoreLink) -> str:
    """How a started service's log line describes its core link."""
    return "connected" if core.connected else "not reachable yet (retrying)"


def add_core_link(app: web.Application, key: web.AppKey[L]) -> None:
    """Wire the core link under ``key`` into ``app``: it connects in the app's
    ``cleanup_ctx`` (closed last at shutdown), and ``on_shutdown`` sets its ``stopping``
    (waiting requests answer now instead of at their deadline)."""

    async def core_link(app: web.Application) -> AsyncIterator[None]:
        core = app[key]
        await core.start()
        yield
        await core.stop()

    async def stopping(app: web.Application) -> None:
        app[key].begin_stop()

    app.cleanup_ctx.append(core_link)
    app.on_shutdown.append(stopping)
    app[CONNECTIONS] = app[key].connections


# ---- the core link ---------------------------------------------------------------------------
class FrontendLink(CoreLink, Generic[S]):
    """The core link of frontend ``service`` (its name in logs and at the core), from its
    settings; it keeps ``metrics.core_connected``/``core_connects`` and, on each connection,
    warns about every ``(our setting, the core's limit)`` of :attr:`limits` whose value is
    above what the core says (the core's limit rules)."""

    limits: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, settings: S, metrics: RequestMetrics, *, service: str) -> None:
        super().__init__(
            settings.core_host,
            settings.core_port,
            service=service,
            user=settings.core_user,
            password=settings.core_password,
            token=settings.core_token,
            ssl=core_ssl_context(settings),
        )
        self.settings = settings
        self.metrics = metrics

    def attached(self, client: Client) -> None:
        for ours, name in self.limits:
            theirs = client.limits.get(name)
            value = getattr(self.settings, ours)
            if isinstance(theirs, int | float) and value > theirs:
                log.warning(
                    "%s: POLYMQ_%s=%s is above the core's %s: the core's limit rules",
                    self.service,
                    ours.upper(),
                    value,
                    theirs if ours == name else f"{name}={theirs}",
                )
        super().attached(client)
        self.metrics.core_connected.set(1)
        self.metrics.core_connects.inc()

    def failed_over(self, client: Client, event: Reconnected) -> None:
        self.metrics.core_connects.inc()  # (connected again, elsewhere)
        super().failed_over(client, event)

    def detached(self, client: Client, reason: str) -> None:
        self.metrics.core_connected.set(0)
        super().detached(client, reason)

    async def stop(self) -> None:
        await super().stop()
        self.metrics.core_connected.set(0)

    async def publish(
        self,
        destination: str,
        messages: list[Message],
        size: int,
        *,
        role: str | None = None,
        batch_id: str | None = None,
        batch_ttl: float | None = None,
    ) -> Published:
        """Publish ``messages`` (from ``size`` bytes of request body), holding that much of
        :attr:`budget` while in flight so that coalesced requests never make a frame the
        core would refuse."""
        await self.budget.acquire(size)
        try:
            return await self.call(
                lambda c: c.publish(
                    destination, messages, role=role, batch_id=batch_id, batch_ttl=batch_ttl
                )
            )
        finally:
            self.budget.release(size)

    async def waiting(
        self,
        client: Client,
        request: Awaitable[T],
        wait: float,
        abandoned: Callable[[T], None],
        empty: T,
    ) -> T:
        """``request`` on ``client`` (which may wait up to ``wait`` seconds at the core);
        ``empty`` at once if the service stops first, ``TimeoutError`` if the core does not
        answer in time. What it brings after we gave up is ``abandoned`` (leases go back)."""
        # Two futures per waiting request (the request's, e.g. Client.cursor_poll, which
        # needs no task, and ``woken``); no task on ``stopping`` nor ``asyncio.wait``: with
        # 10,000 long polls held, those (and the Event's deque that each cancelled wait is
        # removed from) cost more than the rest of an answer.
        task = asyncio.ensure_future(request)
        woken = self.hold()

        def wake(_: object = None) -> None:
            if not woken.done():
                woken.set_result(None)

        task.add_done_callback(wake)
        loop = asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + wait + CORE_TIMEOUT, wake)
        try:
            await woken
        finally:
            self.release(woken)
            timer.cancel()
            task.remove_done_callback(wake)
            if not task.done():  # we gave up: whatever it brings later goes back at once

                def later(t: asyncio.Future[T]) -> None:
                    if not t.cancelled() and t.exception() is None:
                        abandoned(t.result())

                task.add_done_callback(later)
        if task.done():
            if not task.cancelled() and task.exception() is None:
                return task.result()
            return await self.guard(client, task)
        if self.stopping.is_set():
            return empty
        raise TimeoutError


# ---- problem details -----------------------------------------------------------------------
def problem_response(
    status: int,
    detail: str,
    *,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """``{"type": "about:blank", "title": <the status phrase>, "status", "detail", "code"}``
    as ``application/problem+json``; a 401 challenges, a 503 says when to retry."""
    body = problem_document(status, detail, code=code)
    out = {k: v for k, v in (headers or {}).items() if k.lower() != "content-type"}
    if status == 401:
        out.setdefault("WWW-Authenticate", CHALLENGE)
    if status == 503:
        out.setdefault("Retry-After", "1")
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        headers=out,
        content_type=PROBLEM_JSON,
    )


async def refuse_unread(request: web.Request, response: web.Response) -> web.Response:
    """``response``, a refusal answered before ``request``'s body was read. While some of
    the body is still to come, it says ``Connection: close``: when that is more than
    :data:`LINGER_BYTES` (or of unknown length), it is sent at once and the connection
    closed without reading any more; a smaller rest is read and dropped first (aiohttp's
    lingering close), so that the client reads the answer rather than a reset."""
    if not request.body_exists or request.content.is_eof():
        return response  # (all of it came, or none was sent: the connection may stay)
    response.force_close()
    declared = request.content_length
    if declared is not None and declared - request.content.total_bytes <= LINGER_BYTES:
        return response
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


# ---- the JSON APIs' shared routes and answers -------------------------------------------------
def published_json(dest: Destination, result: Published) -> dict[str, Any]:
    """The answer to a publish to ``dest`` from the core's ``result``: ``count`` and
    ``subscribers`` for a topic, else ``count``, ``ids`` and ``seqs``."""
    if dest.kind is Kind.TOPIC:
        return {"count": result.count, "subscribers": result.subscribers}
    return {"count": result.count, "ids": result.ids, "seqs": result.seqs}


def add_openapi_route(app: web.Application, document: web.AppKey[bytes]) -> None:
    """``GET /openapi.json``: the JSON document stored under ``document``."""

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=request.app[document], content_type="application/json")

    app.router.add_get("/openapi.json", openapi)


# ---- health ----------------------------------------------------------------------------------
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def readiness(core: CoreLink) -> web.Response:
    """``/readyz`` of a frontend that reaches the core through ``core``."""
    if core.stopping.is_set():
        return problem_response(503, "shutting down", code="unavailable")
    if not core.connected:
        detail = f"not connected to the core at {core.address}: {core.last_error}"
        return problem_response(503, detail, code="unavailable")
    return web.json_response({"status": "ready", "core": core.address})


def add_health_routes(app: web.Application, core: web.AppKey[L]) -> None:
    """``GET /healthz`` and ``GET /readyz`` (of the core link under ``core``)."""

    async def readyz(request: web.Request) -> web.Response:
        return readiness(request.app[core])

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
