"""A subscription as Server-Sent Events (``GET /v1/subscriptions/{id}/events``).

Each message is one event: ``id:`` is the cursor that resumes right after it, ``data:`` the
message as JSON (as in a poll answer). A client resumes with the ``Last-Event-ID`` header
(what ``EventSource`` sends when it reconnects) or ``?cursor=``; the header wins, being the
newer. Comments are sent as keep-alives; ``retry:`` asks for a reconnect after a second.

Why the stream pauses after writing messages before it reads on: reading on confirms the
cursor at the core, and for a topic the core then drops what came before it. A connection
that breaks with events in flight (or that the client closes with events it has not read)
must not have confirmed them, or the client, resuming from its ``Last-Event-ID``, would find
them gone (410). So the poll after a write (which confirms it) waits until the write is
``longpoll_sse_grace`` seconds old, the connection still open, and every byte of it
acknowledged by the client's TCP (``SIOCOUTQ`` on Linux, plus what the transport still
buffers). Messages arriving meanwhile wait in the core and go in the next answer, so a busy
topic stream sends one answer per grace period (the price: up to that much latency). A
client that stops reading for ``longpoll_keepalive`` seconds is disconnected unconfirmed.
Streams and queues need none of this: a stream's log stays where it is (a client may resume
from any event it still holds), and unsettled queue leases come back when they expire.

Errors before the stream starts (unknown id, expired cursor, bad input) are problem
details with their status, like any request; errors after it are one ``event: problem``
whose data is the problem, and the stream ends (``EventSource`` then reconnects, which a
client that wants to stop must prevent by closing it). So does a users reload that removed
the caller's user or changed its password (401), or withdrew its read permission (403).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import struct
import termios
import time
from typing import Any

from aiohttp import web

from polymq import CursorPage
from polymq.errors import Forbidden, PolymqError, Unauthorized
from polymq.types import Kind, Outcome
from polymq_server.web.access import until_revoked
from polymq_server.web.problems import from_exception

from .api import CORE, METRICS, SETTINGS, WINDOWS, answer_json, held, resume_cursor, subscription
from .leases import Window
from .payloads import no_query, parse_max
from .subscriptions import AckMode, SubscriptionRef

__all__ = ["add_routes", "events"]

log = logging.getLogger(__name__)

RETRY_MS = 1000
KEEPALIVE = b": keep-alive\n\n"
_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache, no-store",
    "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
}
_ACK_POLL = (0.001, 0.05)  # seconds between checks of the peer's acknowledgement: min, max


def unacknowledged(transport: asyncio.BaseTransport) -> int | None:
    """Bytes written to ``transport`` that the peer has not acknowledged; None if unknown."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # == SIOCOUTQ
    except (OSError, ValueError):
        return None
    buffered = getattr(transport, "get_write_buffer_size", lambda: 0)()
    return int(struct.unpack("i", raw)[0]) + int(buffered)


async def acknowledged(request: web.Request, since: float, grace: float, timeout: float) -> bool:
    """Wait until the last write (at ``since``) is ``grace`` seconds old and the client's TCP
    acknowledged everything written; False if it did not within ``timeout`` or the
    connection went away."""
    await asyncio.sleep(max(since + grace - time.monotonic(), 0.0))
    deadline = time.monotonic() + timeout
    delay = _ACK_POLL[0]
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return False
        left = unacknowledged(transport)
        if left is None or left == 0:
            return True  # None: we cannot tell on this platform; trust the write
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, _ACK_POLL[1])


def message_events(answer: dict[str, Any], with_ids: bool) -> bytes:
    out = []
    for m in answer["messages"]:
        data = json.dumps(m, separators=(",", ":"))  # one line: JSON escapes newlines
        out.append(f"id: {m['cursor']}\ndata: {data}\n\n" if with_ids else f"data: {data}\n\n")
    return "".join(out).encode()


def problem_event(exc: BaseException) -> bytes:
    response = from_exception(exc)
    if response is None or not isinstance(response.body, bytes):
        body = {"status": 500, "title": "Internal Server Error", "detail": "internal error",
                "code": "internal", "type": "about:blank"}  # fmt: skip
        data = json.dumps(body)
    else:
        data = response.body.decode()
    return f"event: problem\ndata: {data}\n\n".encode()


class _Stream:
    """One SSE response: what it has written and what it may confirm."""

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        ref: SubscriptionRef,
        window: Window | None,
    ) -> None:
        app = request.app
        self.request = request
        self.response = response
        self.ref = ref
        self.window = window
        self.core = app[CORE]
        self.metrics = app[METRICS]
        self.keepalive = app[SETTINGS].longpoll_keepalive
        self.grace = app[SETTINGS].longpoll_sse_grace
        self.with_ids = ref.kind is not Kind.QUEUE
        self.written: float | None = None  # when messages not yet confirmed were written

    async def send(self, result: CursorPage, preamble: bytes = b"") -> None:
        """Write an answer's messages; leases nobody will see go back to their queue."""
        leased = result.leased
        try:
            answer = await answer_json(self.ref, result, self.core.schemas)
            data = preamble + message_events(answer, self.with_ids)
            if not data:
                return
            await self.response.write(data)
        except BaseException:
            self.core.requeue(leased)
            raise
        self.metrics.delivered("sse", len(result.messages))
        if result.messages:
            self.written = time.monotonic()
        if not leased:
            return
        if self.ref.ack is AckMode.AUTO:
            self.core.settle_soon(leased, Outcome.ACK)
        elif self.window is not None:
            self.window.add(leased)

    async def run(self, cursor: int | None, batch: int) -> None:
        while not self.core.stopping.is_set():
            room = batch
            if self.window is not None:
                room = min(batch, await self.window.room(self.keepalive))
                if room == 0:  # the client holds a full window of unsettled leases
                    await self.response.write(KEEPALIVE)
                    continue
            elif self.written is not None and self.ref.kind is Kind.TOPIC:
                # the next poll confirms what was written: only once the client has it
                if not await acknowledged(self.request, self.written, self.grace, self.keepalive):
                    log.debug("longpoll: an SSE stream ended with messages unconfirmed")
                    return
                self.written = None
            try:
                result = await self.core.poll(
                    self.ref.core_id, cursor, room, min(self.keepalive, self.ref.max_step)
                )
            except (PolymqError, TimeoutError) as exc:
                await self.response.write(problem_event(exc))
                return
            if result.cursor is not None:
                cursor = result.cursor
            if result.messages:
                await self.send(result)
            else:
                await self.response.write(KEEPALIVE)


async def events(request: web.Request) -> web.StreamResponse:
    ref = await subscription(request)
    no_query(request, frozenset({"cursor", "max"}))
    app = request.app
    settings, core, metrics = app[SETTINGS], app[CORE], app[METRICS]
    cursor, _ = resume_cursor(request, header_first=True)
    batch = parse_max(request, ref.prefetch, settings.longpoll_max_poll)
    window = None
    if ref.kind is Kind.QUEUE and ref.ack is AckMode.CLIENT:
        window = app[WINDOWS].open(batch, ref.visibility)
    # The first poll comes before the headers, so that an unknown id, an expired cursor or
    # an unavailable core is a plain problem answer (which EventSource does not retry).
    result = await core.poll(ref.core_id, cursor, batch, 0.0)
    if cursor is not None:
        metrics.reconnects.labels("sse").inc()
    response = web.StreamResponse(headers=_HEADERS)
    stream = _Stream(request, response, ref, window)
    metrics.sse_streams.inc()
    try:
        try:
            await response.prepare(request)
        except BaseException:
            core.requeue(result.leased)
            raise
        await stream.send(result, preamble=f"retry: {RETRY_MS}\n\n".encode())
        if result.cursor is not None:
            cursor = result.cursor
        with await held(request, ref) as revocation:
            try:
                await until_revoked(stream.run(cursor, batch), revocation)
            except (Unauthorized, Forbidden) as exc:  # a users reload took it away
                await response.write(problem_event(exc))
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
    except ConnectionError:
        pass  # the client went away: nothing to finish
    finally:
        metrics.sse_streams.dec()
        if window is not None:
            window.close()
    return response


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/subscriptions/{id}/events", events)
