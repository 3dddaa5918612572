"""The node's overview for the console (docs/admin-api.md): ``GET /api/overview``,
``/api/overview/history`` and ``/api/overview/stream``.

A sampler takes a sample every ``overview_interval`` seconds (5 by default): the publish,
deliver and ack rates since the last one (from the counters of :mod:`.metrics`), the
messages ready and unacked, and keeps the last 10 minutes of them in a ring. Each sample is
pushed, as the ``/api/overview`` document plus ``"t"``, to every open SSE stream. A stream
whose reader falls :data:`BACKLOG` samples behind is dropped (its connection aborted), never
buffered without bound; at shutdown every stream ends (its chunked body closed), so the
admin's graceful stop does not wait on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from polymq import __version__

from .broker import Broker
from .metrics import protocol_label

__all__ = ["BACKLOG", "WINDOW", "Overview", "Reader", "add_routes"]

WINDOW = 600.0  # seconds of samples kept for /api/overview/history
BACKLOG = 12  # samples an SSE reader may be behind before it is dropped
_RATES = ("publish", "deliver", "ack")


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

    def __init__(self, broker: Broker, interval: float) -> None:
        self.broker = broker
        self.interval = interval
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
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
        connections: Counter[str] = Counter()
        subscriptions: Counter[str] = Counter()
        for session in broker.sessions:
            if session.principal is None:  # (not logged in yet)
                continue
            protocol = protocol_label(session.protocol)
            connections[protocol] += 1
            subscriptions[protocol] += len(session.subs)
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
            "connections": dict(sorted(connections.items())),
            "subscriptions": dict(sorted(subscriptions.items())),
            "memory": {"used_bytes": memory.get("used", 0), "limit_bytes": memory.get("limit", 0)},
            "disk": {"free_bytes": disk.get("free", -1), "limit_bytes": disk.get("limit", 0)},
            "alarms": sorted(monitor.alarms),
        }

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
    return web.json_response(request.app[OVERVIEW].document())


async def history(request: web.Request) -> web.Response:
    return web.json_response(request.app[OVERVIEW].history())


async def stream(request: web.Request) -> web.StreamResponse:
    """``text/event-stream``: the latest sample at once, then each new one."""
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
        sampler.close(reader)
    return response


def add_routes(app: web.Application, broker: Broker) -> None:
    """The overview's routes on ``app``; its sampler runs while ``app`` does, and its
    streams end when ``app`` shuts down (before aiohttp waits for open requests)."""
    sampler = app[OVERVIEW] = Overview(broker, broker.settings.overview_interval)

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
