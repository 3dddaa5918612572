"""What the STOMP and AMQP frontends share: the metrics, service set-up and session I/O
glue that each of them would otherwise write again (the aiohttp frontends share
:mod:`polymq_server.web.app` instead).

- :class:`FrontendMetrics`: the metrics every session-based frontend declares after its own
  (``polymq_<service>_bytes``, ``..._core_connected``, ``..._core_connects``).
- :func:`core_link`: the frontend's :class:`~polymq_server.link.corelink.CoreLink` from its
settings,
  keeping the core-link metrics.
- :func:`tls_context`, :func:`add_admin_routes`, :func:`admin_runner`, :func:`start_site`
  and :func:`not_ready`: the listeners' TLS context, ``/metrics``, ``/healthz`` and
  ``/readyz``, and the aiohttp listener of a service.
- :func:`shutdown_sessions`: the sessions' part of a service's ``stop()``.
- :class:`Listening`: how a service shares its listeners with the other processes of its
  node (``polymq run --workers``, docs/workers.md).
- :class:`FrontendSession`: the base of a session (the endpoint of one
  :class:`~polymq_server.sessions.transport.Transport`): one output buffer written once per loop
  iteration
  while the transport drains, reading paused on demand, the one *busy* task and the other
  tasks it owns, the close, and the clocks a heart-beat reads (when bytes last came in and
  last went out).

Errors: nothing here raises of its own; a session's task failures go to the callback that
started the task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Awaitable, Callable, Collection, Coroutine
from functools import partial
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from polymq.client import Client

from ..config import FrontendSettings, core_ssl_context
from ..link.corelink import CoreLink
from ..web.app import deadline_runner, healthz
from ..web.requestmetrics import add_metrics_route, core_link_metrics
from .transport import Transport

__all__ = [
    "ALONE",
    "FrontendMetrics",
    "FrontendSession",
    "Listening",
    "SessionClocks",
    "Shutdown",
    "add_admin_routes",
    "admin_runner",
    "core_link",
    "not_ready",
    "shutdown_sessions",
    "start_site",
    "tls_context",
]

_ADMIN_SHUTDOWN_TIMEOUT = 2.0  # seconds the admin/WebSocket app's requests get at stop


# ---- metrics -------------------------------------------------------------------------------
class FrontendMetrics:
    """The metrics of frontend ``service`` (``protocol`` names its connections in the help)
    that every session-based frontend has: ``polymq_<service>_bytes`` (by ``direction``, its
    ``in`` and ``out`` children as :attr:`bytes_in` / :attr:`bytes_out`), then
    ``polymq_<service>_core_connected`` and ``..._core_connects``. A subclass declares its
    own metrics first, then calls :meth:`declare_shared` (they stand last in its list)."""

    bytes: Counter
    bytes_in: Counter  # (children, resolved once)
    bytes_out: Counter
    core_connected: Gauge
    core_connects: Counter

    def declare_shared(self, registry: CollectorRegistry, service: str, protocol: str) -> None:
        self.bytes = Counter(
            f"polymq_{service}_bytes",
            f"Bytes received (in) and sent (out) over {protocol} connections",
            ["direction"],
            registry=registry,
        )
        self.core_connected, self.core_connects = core_link_metrics(registry, service)
        self.bytes_in = self.bytes.labels("in")
        self.bytes_out = self.bytes.labels("out")


# ---- the service -----------------------------------------------------------------------------
def core_link(
    settings: FrontendSettings,
    service: str,
    metrics: FrontendMetrics,
    on_lost: Callable[[Client, str], None] | None = None,
) -> CoreLink:
    """The core link of frontend ``service`` from its settings: ``metrics.core_connected``
    follows it, ``metrics.core_connects`` counts its connections; ``on_lost(client,
    reason)`` is called when one is gone (after the gauge drops)."""

    def connected(client: Client) -> None:
        metrics.core_connected.set(1)
        metrics.core_connects.inc()

    def lost(client: Client, reason: str) -> None:
        metrics.core_connected.set(0)
        if on_lost is not None:
            on_lost(client, reason)

    return CoreLink(
        settings.core_host,
        settings.core_port,
        service=service,
        user=settings.core_user,
        password=settings.core_password,
        token=settings.core_token,
        ssl=core_ssl_context(settings),
        on_connect=connected,
        on_lost=lost,
        on_failover=lambda client, event: metrics.core_connects.inc(),
    )


def tls_context(settings: FrontendSettings) -> ssl.SSLContext | None:
    """The listeners' TLS context when ``tls_cert`` (and ``tls_key``) are set, else None."""
    if not settings.tls_cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
    return ctx


def not_ready(stopping: bool, link: CoreLink) -> web.Response | None:
    """``/readyz``'s 503 while the service stops or is not connected to the core through
    ``link``; None when it is ready (each service says so in its own words)."""
    if stopping:
        return web.json_response({"status": "shutting down"}, status=503)
    if not link.connected:
        detail = f"not connected to the core at {link.address}: {link.last_error}"
        return web.json_response({"status": "unavailable", "detail": detail}, status=503)
    return None


def add_admin_routes(
    app: web.Application,
    registry: CollectorRegistry,
    readyz: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> None:
    """``GET /metrics`` of ``registry``, ``GET /healthz`` and ``GET /readyz`` (``readyz``)."""
    add_metrics_route(app, registry)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def admin_runner(app: web.Application, handshake_timeout: float = 10.0) -> web.AppRunner:
    """The runner of a service's aiohttp app (no access log; requests get 2 s at stop),
    with the deadlines of every polymq HTTP listener
    (:func:`polymq_server.web.app.deadline_runner`):
    a request's headers, a WebSocket upgrade's too, must come within ``handshake_timeout``
    seconds, after which an idle connection is closed as well, and a body may not stall
    longer than that."""
    return deadline_runner(app, handshake_timeout, shutdown_timeout=_ADMIN_SHUTDOWN_TIMEOUT)


@dataclasses.dataclass(frozen=True)
class Listening:
    """How a STOMP or AMQP service listens beside the other processes of its node
    (``polymq run --workers``, docs/workers.md): ``reuse_port``, its TCP listeners bind with
    SO_REUSEPORT, so that the kernel spreads the connections to one port over every process
    of this user listening on it; ``http`` false, it starts no HTTP listener (STOMP's
    WebSocket and page, AMQP's admin port: the first process serves them, and ``/metrics``
    for all)."""

    reuse_port: bool = False
    http: bool = True


ALONE = Listening()  # a service in a process of its own: its listeners to itself


async def start_site(
    runner: web.AppRunner, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.TCPSite, int]:
    """Set ``runner`` up and listen on ``host:port`` (0: any); the site and its port."""
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
    await site.start()
    return site, int(runner.addresses[0][1])


class Shutdown(Protocol):
    async def shutdown(self, grace: float) -> None: ...


async def shutdown_sessions(
    sessions: Collection[Shutdown], grace: float, log: logging.Logger, late: str
) -> None:
    """Shut every session down (each gets ``grace`` seconds to answer what it read) and wait
    for them, twice ``grace`` at most; past it ``log`` warns ``late % len(sessions)``."""
    if not sessions:
        return
    done = asyncio.gather(*(s.shutdown(grace) for s in sessions), return_exceptions=True)
    try:
        await asyncio.wait_for(done, grace * 2)
    except TimeoutError:
        log.warning(late, len(sessions))


# ---- the session ---------------------------------------------------------------------------
class SessionClocks(Protocol):
    """What a protocol's heart-beats read of a :class:`FrontendSession`: its clocks, whether
    a silence is its own or a beat would overtake output, and the transport a beat goes to."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def closing(self) -> bool: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def last_read(self) -> float: ...
    @property
    def last_written(self) -> float: ...
    @property
    def reading_paused(self) -> bool: ...
    @property
    def output_pending(self) -> bool: ...


class FrontendSession:
    """The I/O glue of one connection's session, over ``transport``.

    Writing: :meth:`_write` appends to one output buffer; :meth:`_tick` (the subclass's,
    scheduled once per loop iteration by :meth:`_schedule`) ends with :meth:`_flush`, which
    hands the buffer to the transport while it drains, counts it in ``metrics.bytes_out``,
    then calls :meth:`_written` and :meth:`update_reading`. Reading: the subclass's
    :meth:`update_reading` decides, :meth:`_set_reading` pauses or resumes the transport.
    Tasks: :meth:`_run_busy` runs the one task before which no later frame is handled,
    :meth:`_run_task` one nothing waits for; :meth:`_cancel_tasks` cancels every one.
    Closing: :meth:`_close` flushes what is written, tears down (the subclass's
    :meth:`_teardown`) and closes the transport. Clocks (loop times, for the protocol's
    heart-beats): :attr:`last_read`, set by the subclass's ``data_received``, and
    :attr:`last_written`, set by :meth:`_flush`; with :attr:`reading_paused` and
    :attr:`output_pending` they tell whether a silence is the peer's and a beat is due."""

    transport: Transport
    metrics: FrontendMetrics

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.closing = False  # the connection is on its way out: nothing more is read
        self._lost = False  # the transport is gone: nothing more is written
        self._torn_down = False
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._tick_scheduled = False
        self._busy: asyncio.Task[None] | None = None
        self._reading_paused = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.last_read = self.loop.time()  # when bytes last came in (data_received sets it)
        self.last_written = self.last_read  # when output last went to the transport

    @property
    def reading_paused(self) -> bool:
        """The session paused reading: a silence now is its own, not the peer's."""
        return self._reading_paused

    @property
    def output_pending(self) -> bool:
        """Output waits in the buffer (for this iteration's tick, or for the transport to
        drain): a heart-beat written now would overtake it."""
        return bool(self._out)

    # ---- what a subclass provides ------------------------------------------------------------
    def _tick(self) -> None:
        """Once per loop iteration with something to do; ends with :meth:`_flush`."""
        raise NotImplementedError

    def update_reading(self) -> None:
        """Pause or resume reading (with :meth:`_set_reading`) as the session's state says."""
        raise NotImplementedError

    def _teardown(self) -> None:
        """Release what the connection holds (once)."""
        raise NotImplementedError

    def _written(self, force: bool) -> None:
        """The output went to the transport (``force``: on a close)."""

    # ---- writing -----------------------------------------------------------------------------
    def resume_writing(self) -> None:
        self._flush()

    def _schedule(self) -> None:
        if not self._tick_scheduled:
            self._tick_scheduled = True
            self.loop.call_soon(self._tick)

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        self._schedule()

    def _flush(self, force: bool = False) -> None:
        """Hand the output to the transport while it drains (``force``: even if not)."""
        if not self._out or self._lost:
            return
        if not force and not self.transport.writable:
            self.update_reading()
            return
        out = self._out
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_bytes = 0
        self.transport.write(data)
        self.metrics.bytes_out.inc(len(data))
        self.last_written = self.loop.time()
        self._written(force)
        self.update_reading()

    # ---- reading -----------------------------------------------------------------------------
    def _set_reading(self, pause: bool) -> None:
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # ---- tasks -------------------------------------------------------------------------------
    def _run_busy(
        self, coro: Coroutine[Any, Any, None], done: Callable[[BaseException | None], None]
    ) -> None:
        """Run ``coro`` as the busy task (reading pauses while it runs); ``done(its
        exception or None)`` when it ends, unless it was cancelled."""
        task = self.loop.create_task(coro)
        self._busy = task
        self._tasks.add(task)
        task.add_done_callback(partial(self._busy_ended, done))
        self.update_reading()

    def _busy_ended(
        self, done: Callable[[BaseException | None], None], task: asyncio.Task[None]
    ) -> None:
        self._tasks.discard(task)
        if self._busy is task:
            self._busy = None
        if task.cancelled():
            return
        done(task.exception())

    def _run_task(
        self, coro: Coroutine[Any, Any, None], failed: Callable[[BaseException], None]
    ) -> None:
        """Run ``coro``, a task nothing waits for; ``failed(exception)`` if it raises."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)

        def ended(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                failed(exc)

        task.add_done_callback(ended)

    def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _wait_busy(self, grace: float) -> None:
        """Let the busy task (if any) end, ``grace`` seconds at most (its outcome is its
        ``done`` callback's)."""
        busy = self._busy
        if busy is not None:
            await asyncio.wait({busy}, timeout=grace)

    # ---- closing -----------------------------------------------------------------------------
    def _close(self) -> None:
        """Close after what is written: flush it, tear down, close the transport."""
        self.closing = True
        self._flush(force=True)
        self._teardown()
        self.transport.close()
