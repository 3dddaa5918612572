"""A trivial STOMP "broker" for measuring the load generator's own ceiling.

It does as little as a broker can: SENDs are turned into MESSAGEs a whole chunk at a time
(``bytes.replace`` of the command line, no parsing) and written to the subscriber(s) of the
destination: round-robin per chunk on a ``/queue/``, to every subscriber on a ``/topic/``.
Frames other than SEND (CONNECT, SUBSCRIBE, DISCONNECT, anything carrying ``receipt``) take a
slow path that answers them. A subscriber whose transport is full pauses reading from every
producer, so the relay never buffers a backlog.

Driving it with the same workers and parameters as a real broker gives the rate at which the
generator itself tops out (:func:`relay` runs it as a worker, on the broker's CPU): when that
is well above a broker's figure, the generator was not what limited the broker. Over
WebSocket the relay is an aiohttp server (one WebSocket message in, one out), so its figure
is a floor of the generator's ceiling, not the ceiling itself.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any, cast

from .stomp_wire import frame, split_frames

__all__ = ["relay"]

_CONNECTED = frame("CONNECTED", {"version": "1.2", "heart-beat": "0,0", "server": "relay"})
_MESSAGE = b"MESSAGE\nsubscription:0\nmessage-id:m\nack:m\n"

Write = Callable[[bytes], None]


class _Hub:
    """Who subscribed to what, and the pause/resume of producers when a subscriber is full."""

    def __init__(self) -> None:
        self.queue_subs: list[_Session] = []
        self.topic_subs: list[_Session] = []
        self._turns = itertools.count()  # round-robin over the queue subscribers
        self.sessions: set[_Session] = set()
        self.full: set[_Session] = set()
        self.relayed = 0

    def route(self, chunk: bytes, n: int, topic: bool) -> list[tuple[_Session, bytes]]:
        out = chunk.replace(b"SEND\n", _MESSAGE)
        self.relayed += n
        if topic:
            return [(s, out) for s in self.topic_subs]
        if not self.queue_subs:
            return []
        return [(self.queue_subs[next(self._turns) % len(self.queue_subs)], out)]

    def set_full(self, s: _Session, full: bool) -> None:
        was = bool(self.full)
        if full:
            self.full.add(s)
        else:
            self.full.discard(s)
        if was != bool(self.full):
            for other in self.sessions:
                if other not in self.full:
                    other.pause_reading(bool(self.full))


class _Session:
    """One client connection, transport-independent: ``handle`` returns what to write where."""

    def __init__(self, hub: _Hub) -> None:
        self.hub = hub
        self.buf = b""
        self.topic = False  # the destination this connection SENDs to
        self.write: Write = lambda data: None
        self.pause_reading: Callable[[bool], None] = lambda pause: None
        self.close: Callable[[], None] = lambda: None
        hub.sessions.add(self)

    def gone(self) -> None:
        hub = self.hub
        hub.sessions.discard(self)
        for subs in (hub.queue_subs, hub.topic_subs):
            if self in subs:
                subs.remove(self)
        hub.set_full(self, False)

    def handle(self, data: bytes) -> list[tuple[_Session, bytes]]:
        buf = self.buf + data if self.buf else data
        end = buf.rfind(b"\0")
        if end < 0:
            self.buf = buf
            return []
        self.buf, chunk = buf[end + 1 :], buf[: end + 1]
        n = chunk.count(b"\0")
        if chunk.count(b"SEND\n") == n and b"\nreceipt:" not in chunk:
            if not self.topic and b"destination:/topic/" in chunk[:200]:
                self.topic = True
            return self.hub.route(chunk, n, self.topic)
        out: list[tuple[_Session, bytes]] = []
        for command, headers, body in split_frames(chunk):
            dest = headers.get("destination", "")
            if command == "SEND":
                self.topic = dest.startswith("/topic/")
                f = frame("SEND", {k: v for k, v in headers.items() if k != "receipt"}, body)
                out += self.hub.route(f, 1, self.topic)
            elif command in ("CONNECT", "STOMP"):
                out.append((self, _CONNECTED))
            elif command == "SUBSCRIBE":
                subs = self.hub.topic_subs if dest.startswith("/topic/") else self.hub.queue_subs
                subs.append(self)
            if "receipt" in headers:
                out.append((self, frame("RECEIPT", {"receipt-id": headers["receipt"]})))
            if command == "DISCONNECT":
                out.append((self, b""))  # close after the RECEIPT
        return out


class _TcpConn(asyncio.Protocol):
    def __init__(self, hub: _Hub) -> None:
        self.s = _Session(hub)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        t.set_write_buffer_limits(high=1 << 18)
        self.s.write = t.write
        self.s.close = t.close
        self.s.pause_reading = lambda pause: t.pause_reading() if pause else t.resume_reading()

    def data_received(self, data: bytes) -> None:
        for target, out in self.s.handle(data):
            if out:
                target.write(out)
            else:
                target.close()

    def pause_writing(self) -> None:
        self.s.hub.set_full(self.s, True)

    def resume_writing(self) -> None:
        self.s.hub.set_full(self.s, False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.s.gone()


async def _serve_ws(hub: _Hub, host: str) -> tuple[Any, int]:
    from aiohttp import WSMsgType, web

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            protocols=("v12.stomp", "v11.stomp", "v10.stomp"), max_msg_size=0, compress=False
        )
        await ws.prepare(request)
        s = _Session(hub)
        sockets[s] = ws
        try:
            async for msg in ws:
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    continue
                data = msg.data.encode() if isinstance(msg.data, str) else msg.data
                for target, out in s.handle(data):
                    peer = sockets.get(target)
                    if peer is None:
                        continue
                    if out:
                        await peer.send_frame(out, WSMsgType.TEXT)
                    else:
                        await peer.close()
        finally:
            s.gone()
            sockets.pop(s, None)
        return ws

    sockets: dict[_Session, web.WebSocketResponse] = {}
    app = web.Application()
    app.router.add_get("/ws", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, int(port)


async def relay(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Serve until the parent says stop; ``params["transport"]`` is tcp or ws."""
    hub = _Hub()
    host = params.get("host", "127.0.0.1")
    cpu0 = time.process_time()
    if params.get("transport", "tcp") == "ws":
        runner, port = await _serve_ws(hub, host)
        try:
            ch.send(ready=True, port=port)
            await ch.recv()  # stop
        finally:
            await runner.cleanup()
    else:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _TcpConn(hub), host, 0)
        port = server.sockets[0].getsockname()[1]
        try:
            ch.send(ready=True, port=port)
            await ch.recv()  # stop
        finally:
            server.close()
    return {"relayed": hub.relayed, "cpu_seconds": time.process_time() - cpu0}
