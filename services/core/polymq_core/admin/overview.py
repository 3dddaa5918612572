"""The node's overview for the console (docs/admin-api.md): ``GET /api/overview``,
``/api/overview/history`` and ``/api/overview/stream``.

A sampler takes a sample every ``overview_interval`` seconds (5 by default): the publish,
deliver and ack rates since the last one (from the counters of :mod:`.metrics`), the
messages ready and unacked, and keeps the last 10 minutes of them in a ring. Connections and
subscriptions per protocol are the clients' (polymq's own links left out), from the admin
API's listing of every frontend's connections (``/api/connections``), taken at most every
:data:`LISTING_EVERY` seconds while someone watches (a stream is open, or the overview was
asked for within a minute); until the first listing, the core's own sessions. Each sample is
pushed, as the ``/api/overview`` document plus ``"t"``, to every open SSE stream. A stream
whose reader falls :data:`BACKLOG` samples behind is dropped (its connection aborted), never
buffered without bound; at shutdown every stream ends (its chunked body closed), so the
admin's graceful stop does not wait on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from polymq import __version__
from polymq_server.auth.provider import INTERNAL_PRINCIPAL

from ..broker import Broker
from ..metrics import protocol_label

__all__ = [
    "BACKLOG",
    "LISTING_EVERY",
    "STREAM_SAMPLES",
    "WINDOW",
    "Lister",
    "Overview",
    "Reader",
    "add_routes",
]

log = logging.getLogger(__name__)

WINDOW = 600.0  # seconds of samples kept for /api/overview/history
BACKLOG = 12  # samples an SSE reader may be behind before it is dropped
STREAM_SAMPLES = 60  # samples after which a stream ends (the browser opens another)
LISTING_EVERY = 10.0  # seconds between two listings of the frontends' connections
_WATCHED = 60.0  # seconds after a GET /api/overview during which listings go on
_RATES = ("publish", "deliver", "ack")
# the admin API's connection listing: {"connections": [Connection, ...], ...}
Lister = Callable[[], Awaitable[dict[str, Any]]]


class Reader:
    """One open ``/api/overview/stream``: the events not written yet, at most
    :data:`BACKLOG`; past that the reader is ended and ``drop`` (which aborts its
    connection) is called."""

    def __init__(self, drop: Callable[[], None]) -> None:
        self.pending: deque[bytes] = deque()
        self.ended = False
        self.dropped = False
        self._wake = asyncio.Event()
        self._drop = drop

    def push(self, event: bytes) -> bool:
        """Queue ``event``; False if this reader is (now) ended."""
        if self.ended:
            return False
        if len(self.pending) >= BACKLOG:
            self.dropped = True
            self.end()
            self._drop()
            return False
        self.pending.append(event)
        self._wake.set()
        return True

    def end(self) -> None:
        self.ended = True
        self._wake.set()

    async def events(self) -> AsyncIterator[bytes]:
        """The events as they come, until the reader is ended."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.pending and not self.dropped:
                yield self.pending.popleft()
            if self.ended:
                return


class Overview:
    """The sampler, its ring of samples and the open streams."""

    def __init__(self, broker: Broker, interval: float, lister: Lister | None = None) -> None:
        self.broker = broker
        self.interval = interval
        self.lister = lister
        # per protocol, the clients' connections and subscriptions at the last listing
        self.clients: tuple[dict[str, int], dict[str, int]] | None = None
        self.asked = -_WATCHED  # (monotonic) when /api/overview was last asked for
        self._listed = -LISTING_EVERY
        self._listing: asyncio.Task[None] | None = None
        self.samples: deque[dict[str, float]] = deque(maxlen=max(1, round(WINDOW / interval)))
        self.rates = dict.fromkeys(_RATES, 0.0)
        self.readers: set[Reader] = set()
        self.last_event = b""  # the latest sample's event, sent first to a new stream
        self._then = 0.0
        self._totals: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="overview")

    async def stop(self) -> None:
        self.end_streams()
        for task in (self._task, self._listing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._listing = None

    def list_clients(self, now: float) -> None:
        """Start a listing of the clients' connections if one is due and someone watches."""
        if self.lister is None or (self._listing is not None and not self._listing.done()):
            return
        if now - self._listed < LISTING_EVERY or not (self.readers or now - self.asked < _WATCHED):
            return
        self._listed = now
        self._listing = asyncio.get_running_loop().create_task(
            self._listed_clients(self.lister), name="overview-connections"
        )

    async def _listed_clients(self, lister: Lister) -> None:
        try:
            listing = await lister()
        except Exception as exc:  # (a core that is stopping or not ready: the last one stays)
            log.debug("overview: listing the connections failed: %s", exc)
            return
        connections: Counter[str] = Counter()
        subscriptions: Counter[str] = Counter()
        for conn in listing.get("connections", []):
            if conn.get("user") == INTERNAL_PRINCIPAL:  # a frontend's or a peer's link
                continue
            protocol = str(conn.get("protocol"))
            connections[protocol] += 1
            subscriptions[protocol] += int(conn.get("subscriptions") or 0)
        self.clients = dict(sorted(connections.items())), dict(sorted(subscriptions.items()))

    def end_streams(self) -> None:
        """End every open stream (shutdown): their handlers close the responses."""
        for reader in self.readers:
            reader.end()
        self.readers.clear()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()

    def sample(self) -> dict[str, float]:
        """Take a sample: rates since the last one, ready and unacked; push it to the streams."""
        now = time.monotonic()
        self.list_clients(now)
        totals = self.broker.sensors.totals()
        if self._totals:
            span = max(now - self._then, 1e-6)
            self.rates = {k: max(0.0, (totals[k] - self._totals[k]) / span) for k in _RATES}
        self._then, self._totals = now, totals
        doc = self.document()
        t = round(time.time(), 3)
        rates = {k: round(v, 3) for k, v in self.rates.items()}
        point = {"t": t, **rates, **doc["messages"]}
        self.samples.append(point)
        self.last_event = b"event: overview\ndata: %s\n\n" % json.dumps({**doc, "t": t}).encode()
        for reader in list(self.readers):
            if not reader.push(self.last_event):
                self.readers.discard(reader)
        return point

    def document(self) -> dict[str, Any]:
        """``GET /api/overview``: this node now, with the rates of the last sample."""
        broker = self.broker
        connections, subscriptions = self.clients or self._sessions()
        monitor = broker.monitor
        memory = monitor.detail.get("memory", {})
        disk = monitor.detail.get("disk", {})
        return {
            "node": broker.settings.node,
            "version": __version__,
            "uptime_seconds": round(time.time() - broker.started, 3),
            "rates": {k: round(v, 3) for k, v in self.rates.items()},
            "messages": {
                "ready": broker.depth("queue") + broker.depth("channel"),
                "unacked": broker.in_flight(),
            },
            "connections": connections,
            "subscriptions": subscriptions,
            "memory": {
                "used_bytes": memory.get("used", 0),
                "limit_bytes": memory.get("limit", 0),  # the high watermark
                # the alarm rises at, and once on clears under (alarms.py)
                "rises_at_bytes": memory.get("rises_at", 0),
                "clears_at_bytes": memory.get("clears_at", 0),
            },
            "disk": {"free_bytes": disk.get("free", -1), "limit_bytes": disk.get("limit", 0)},
            "alarms": sorted(monitor.alarms),
        }

    def _sessions(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per protocol, the connections and subscriptions of the core's own sessions (in
        ``polymq run`` also the frontends' links, unless they log in as polymq's own)."""
        connections: Counter[str] = Counter()
        subscriptions: Counter[str] = Counter()
        for session in self.broker.sessions:
            who = session.principal
            if who is None or who.name == INTERNAL_PRINCIPAL:  # (not logged in yet; our own)
                continue
            protocol = protocol_label(session.protocol)
            connections[protocol] += 1
            subscriptions[protocol] += len(session.subs)
        return dict(sorted(connections.items())), dict(sorted(subscriptions.items()))

    def history(self) -> dict[str, Any]:
        return {"interval_seconds": self.interval, "samples": list(self.samples)}

    def open(self, drop: Callable[[], None]) -> Reader:
        """A new stream's reader, the latest sample already queued."""
        reader = Reader(drop)
        if self.last_event:
            reader.push(self.last_event)
        self.readers.add(reader)
        return reader

    def close(self, reader: Reader) -> None:
        reader.end()
        self.readers.discard(reader)


OVERVIEW = web.AppKey("overview", Overview)


async def overview(request: web.Request) -> web.Response:
    sampler = request.app[OVERVIEW]
    sampler.asked = time.monotonic()
    sampler.list_clients(sampler.asked)
    return web.json_response(sampler.document())


async def history(request: web.Request) -> web.Response:
    return web.json_response(request.app[OVERVIEW].history())


async def stream(request: web.Request) -> web.StreamResponse:
    """``text/event-stream``: the latest sample at once, then each new one, for
    :data:`STREAM_SAMPLES` samples (5 minutes at the default interval); then it ends and the
    browser's EventSource opens another, logging in again: a login a reload removed stops
    being served within that time, not at the console's next page load."""
    sampler = request.app[OVERVIEW]
    transport = request.transport

    def drop() -> None:  # a reader this far behind is not reading: cut it off
        if transport is not None:
            transport.abort()

    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # (a proxy in front must not hold the events)
        }
    )
    reader = sampler.open(drop)
    ending = asyncio.get_running_loop().call_later(sampler.interval * STREAM_SAMPLES, reader.end)
    try:
        await response.prepare(request)
        await response.write(b"retry: %d\n\n" % int(sampler.interval * 1000))
        async for event in reader.events():
            await response.write(event)
        if not reader.dropped:
            await response.write_eof()
    except ConnectionError:  # the console went away (or was dropped): nothing to answer
        pass
    finally:
        ending.cancel()
        sampler.close(reader)
    return response


def add_routes(app: web.Application, broker: Broker, lister: Lister | None = None) -> None:
    """The overview's routes on ``app``; its sampler runs while ``app`` does, and its
    streams end when ``app`` shuts down (before aiohttp waits for open requests).
    ``lister``: the admin API's listing of every frontend's connections."""
    sampler = app[OVERVIEW] = Overview(broker, broker.settings.overview_interval, lister)

    async def run(app: web.Application) -> AsyncIterator[None]:
        sampler.start()
        yield
        await sampler.stop()

    async def end_streams(app: web.Application) -> None:
        sampler.end_streams()

    app.cleanup_ctx.append(run)
    app.on_shutdown.append(end_streams)
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/overview/history", history)
    app.router.add_get("/api/overview/stream", stream)
