"""The load generator's STOMP client: hand-built frames, a scanning reader, TCP and WebSocket.

Not a general client: it is as little as :mod:`bench.stomp_load` needs, built for speed.

- :func:`frame` builds bytes templates; :func:`send_frame` a SEND.
- :class:`Scanner` splits received bytes at NULs (the generator's bodies never contain NUL,
  so every NUL ends a frame); a chunk whose NUL count equals its ``MESSAGE`` count holds
  nothing but whole MESSAGE frames and goes to ``on_messages(n, chunk)`` in one call
  (``bytes.count`` / ``bytes.rfind``, no per-frame Python); anything else (CONNECTED,
  RECEIPT, ERROR) takes a slow path that splits frames one by one (:func:`split_frames`).
- :class:`TcpLink` is an :class:`asyncio.Protocol` with a write buffer of 256 KiB whose
  ``pause_writing`` makes ``send`` wait (the broker stopped reading); :class:`WsLink` is
  aiohttp's WebSocket client with the ``v12.stomp`` subprotocol, one STOMP frame per
  WebSocket message by default (what stompjs sends, and what every STOMP-over-WebSocket
  server accepts; RabbitMQ's web-stomp also takes several per message, and sends one per
  message), text frames by default, no compression.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from .harness import BenchError

__all__ = [
    "BODY",
    "Link",
    "Scanner",
    "StompError",
    "TcpLink",
    "WsLink",
    "bodies",
    "close_link",
    "frame",
    "open_link",
    "send_frame",
    "split_frames",
]

BODY = b"x" * 32
_MESSAGE = b"MESSAGE\n"


class StompError(BenchError):
    """The broker answered with an ERROR frame, or the connection broke."""


def frame(command: str, headers: Mapping[str, str] | None = None, body: bytes = b"") -> bytes:
    """One STOMP frame (no header escaping: the bench's values need none)."""
    head = "".join(f"{k}:{v}\n" for k, v in (headers or {}).items())
    return f"{command}\n{head}\n".encode() + body + b"\0"


def send_frame(
    destination: str, body: bytes, persistent: bool | None = None, receipt: str | None = None
) -> bytes:
    """A SEND; ``persistent=None`` leaves the header out: transient, the STOMP default on
    both brokers. (RabbitMQ also reads ``persistent`` as the *queue's* ``durable`` flag when
    a SEND declares a ``/queue/`` destination, and ``persistent:false`` on a queue that a
    SUBSCRIBE declared durable is refused with RESOURCE_LOCKED.)"""
    headers = {"destination": destination}
    if persistent is not None:
        headers["persistent"] = "true" if persistent else "false"
    headers["content-length"] = str(len(body))
    if receipt is not None:
        headers["receipt"] = receipt
    return frame("SEND", headers, body)


def _headers(raw: bytes) -> tuple[str, dict[str, str]]:
    """The command and headers of one frame's head (first value wins, as STOMP 1.2 says)."""
    lines = raw.decode("utf-8", "replace").replace("\r\n", "\n").split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k and k not in headers:
            headers[k] = v
    return lines[0], headers


def split_frames(chunk: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """Every frame of ``chunk`` (which ends with a NUL): (command, headers, body)."""
    out = []
    pos, n = 0, len(chunk)
    while pos < n:
        while pos < n and chunk[pos] in b"\r\n":  # heart-beats and trailing EOLs
            pos += 1
        if pos >= n:
            break
        end = chunk.find(b"\0", pos)
        head_end = chunk.find(b"\n\n", pos, end)
        skip = 2
        if head_end < 0:
            head_end, skip = chunk.find(b"\r\n\r\n", pos, end), 4
        if head_end < 0:
            head_end, skip = end, 0
        command, headers = _headers(chunk[pos:head_end])
        out.append((command, headers, chunk[head_end + skip : end]))
        pos = end + 1
    return out


def bodies(chunk: bytes) -> list[bytes]:
    """The bodies of a chunk of MESSAGE frames (a fast path for the latency consumer)."""
    out = []
    pos, n = 0, len(chunk)
    while pos < n:
        h = chunk.find(b"\n\n", pos)
        if h < 0:
            break
        z = chunk.find(b"\0", h)
        out.append(chunk[h + 2 : z])
        pos = z + 1
    return out


# =========================================================================================
# receiving: a scanner per connection
# =========================================================================================
OnMessages = Callable[[int, bytes], None]


class Scanner:
    """Splits a connection's bytes at NULs; MESSAGE frames go to ``on_messages(n, chunk)``
    in runs, everything else is handled here (CONNECTED, RECEIPT, ERROR)."""

    __slots__ = ("_buf", "connected", "error", "messages", "on_messages", "receipts")

    def __init__(self, on_messages: OnMessages | None = None) -> None:
        self._buf = b""
        self.on_messages = on_messages
        self.messages = 0
        loop = asyncio.get_running_loop()
        self.connected: asyncio.Future[dict[str, str]] = loop.create_future()
        self.receipts: dict[str, asyncio.Future[None]] = {}
        self.error: StompError | None = None

    def feed(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\0")
        if end < 0:
            self._buf = buf
            return
        if end + 1 < len(buf):
            self._buf = buf[end + 1 :]
            chunk = buf[: end + 1]
        else:
            self._buf = b""
            chunk = buf
        n = chunk.count(b"\0")
        if chunk.count(_MESSAGE) == n:  # nothing but MESSAGE frames: the fast path
            self.messages += n
            if self.on_messages is not None:
                self.on_messages(n, chunk)
            return
        self._slow(chunk)

    def _slow(self, chunk: bytes) -> None:
        for command, headers, body in split_frames(chunk):
            if command == "MESSAGE":
                self.messages += 1
                if self.on_messages is not None:
                    self.on_messages(1, frame("MESSAGE", headers, body))
            elif command == "CONNECTED":
                if not self.connected.done():
                    self.connected.set_result(headers)
            elif command == "RECEIPT":
                fut = self.receipts.pop(headers.get("receipt-id", ""), None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            elif command == "ERROR":
                text = body.decode("utf-8", "replace").strip()
                self.fail(StompError(f"ERROR frame: {headers.get('message', '')} {text}"[:500]))

    def fail(self, exc: StompError) -> None:
        if self.error is None:
            self.error = exc
        futures: list[asyncio.Future[Any]] = [self.connected, *self.receipts.values()]
        for fut in futures:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: nobody may be waiting on it any more
        self.receipts.clear()


# =========================================================================================
# links: one STOMP connection over TCP or WebSocket
# =========================================================================================
class Link:
    """One STOMP connection. ``send`` takes complete frames; ACKs queued by the receive path
    (``queue_ack``) go out right after the bytes that caused them were scanned."""

    def __init__(self, scanner: Scanner) -> None:
        self.scanner = scanner
        self.version = "1.2"
        self._receipt_ids = itertools.count(1)
        self._acks: list[bytes] = []
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def send(self, frames: Sequence[bytes], blob: bytes | None = None) -> None:
        """Write ``frames`` (``blob`` is ``b"".join(frames)`` when the caller has it)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    def queue_ack(self, ack: bytes) -> None:
        self._acks.append(ack)

    def _check(self) -> None:
        if self.scanner.error is not None:
            raise self.scanner.error

    async def request(self, command: str, headers: dict[str, str], timeout: float = 30) -> None:
        """Send a frame with a ``receipt`` header and wait for the RECEIPT."""
        rid, fut = self.next_receipt()
        await self.send([frame(command, {**headers, "receipt": rid})])
        await self.wait_receipt(fut, command, timeout)

    async def wait_receipt(self, fut: asyncio.Future[None], what: str, timeout: float) -> None:
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._check()
            raise StompError(f"no RECEIPT for {what} within {timeout:.0f}s") from None

    def next_receipt(self) -> tuple[str, asyncio.Future[None]]:
        rid = f"r{next(self._receipt_ids)}"
        fut = asyncio.get_running_loop().create_future()
        self.scanner.receipts[rid] = fut
        return rid, fut

    async def handshake(self, params: Mapping[str, Any]) -> dict[str, str]:
        await self.send(
            [
                frame(
                    "CONNECT",
                    {
                        "accept-version": "1.2",
                        "host": params.get("vhost", "/"),
                        "login": params.get("login", "guest"),
                        "passcode": params.get("passcode", "guest"),
                        "heart-beat": "0,0",
                    },
                )
            ]
        )
        try:
            headers = await asyncio.wait_for(self.scanner.connected, 15)
        except TimeoutError:
            raise StompError("no CONNECTED frame within 15s") from None
        self.version = headers.get("version", "1.0")
        return headers

    async def disconnect(self, timeout: float = 30) -> None:
        """DISCONNECT with a receipt: every frame sent before it has been handled."""
        await self.request("DISCONNECT", {}, timeout)


class _TcpProtocol(asyncio.Protocol):
    def __init__(self, link: TcpLink) -> None:
        self.link = link

    def data_received(self, data: bytes) -> None:
        link = self.link
        link.scanner.feed(data)
        if link._acks:
            link.transport.write(b"".join(link._acks))
            link._acks.clear()

    def pause_writing(self) -> None:
        self.link._can_write.clear()

    def resume_writing(self) -> None:
        self.link._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        link = self.link
        link._can_write.set()
        link.scanner.fail(StompError(f"connection closed by the broker ({exc or 'EOF'})"))
        if not link.closed.done():
            link.closed.set_result(None)


class TcpLink(Link):
    transport: asyncio.Transport

    def __init__(self, scanner: Scanner) -> None:
        super().__init__(scanner)
        self._can_write = asyncio.Event()
        self._can_write.set()

    async def open(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: _TcpProtocol(self), host, port)
        self.transport = cast(Any, transport)  # uvloop's is no asyncio.Transport subclass
        self.transport.set_write_buffer_limits(high=1 << 18)

    async def send(self, frames: Sequence[bytes], blob: bytes | None = None) -> None:
        self._check()
        self.transport.write(blob if blob is not None else b"".join(frames))
        if not self._can_write.is_set():
            await self._can_write.wait()
            self._check()

    async def aclose(self) -> None:
        self.transport.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.closed), 2)


class WsLink(Link):
    """STOMP over aiohttp's WebSocket client (no compression, no WebSocket heart-beat)."""

    def __init__(self, scanner: Scanner, per_message: int = 1, opcode: str = "text") -> None:
        super().__init__(scanner)
        self.per_message = per_message
        import aiohttp

        self._opcode = aiohttp.WSMsgType.TEXT if opcode == "text" else aiohttp.WSMsgType.BINARY
        self._session: Any = None
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self.ws_messages = 0  # WebSocket messages received (a broker may put frames together)

    async def open(self, url: str) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()
        try:
            self._ws = await self._session.ws_connect(
                url,
                protocols=("v12.stomp", "v11.stomp", "v10.stomp"),
                autoping=True,
                max_msg_size=0,
                decode_text=False,
                compress=0,
            )
        except BaseException:
            await self._session.close()
            raise
        self.subprotocol = self._ws.protocol
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        import aiohttp

        ws, scanner = self._ws, self.scanner
        try:
            async for msg in ws:
                if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    self.ws_messages += 1
                    scanner.feed(msg.data)
                    if self._acks:
                        acks, self._acks = self._acks, []
                        await self.send(acks)
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    raise StompError(f"WebSocket error: {msg.data}")
        except StompError as exc:
            scanner.fail(exc)
        finally:
            scanner.fail(StompError(f"WebSocket closed by the broker (code {ws.close_code})"))
            if not self.closed.done():
                self.closed.set_result(None)

    async def send(self, frames: Sequence[bytes], blob: bytes | None = None) -> None:
        self._check()
        ws, opcode, k = self._ws, self._opcode, self.per_message
        if k == 1:
            for f in frames:
                await ws.send_frame(f, opcode)
        else:
            for i in range(0, len(frames), k):
                await ws.send_frame(b"".join(frames[i : i + k]), opcode)

    async def aclose(self) -> None:
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 2)
            if self._reader is not None:
                self._reader.cancel()
                with contextlib.suppress(BaseException):
                    await self._reader
        finally:
            await self._session.close()


async def open_link(params: Mapping[str, Any], on_messages: OnMessages | None = None) -> Link:
    """Connect (TCP or WebSocket, per ``params["transport"]``) and do the STOMP handshake."""
    scanner = Scanner(on_messages)
    link: Link
    if params.get("transport", "tcp") == "ws":
        ws = WsLink(
            scanner,
            per_message=int(params.get("ws_frames_per_message", 1)),
            opcode=params.get("ws_opcode", "text"),
        )
        await ws.open(f"ws://{params['host']}:{params['port']}{params.get('path', '/ws')}")
        link = ws
    else:
        tcp = TcpLink(scanner)
        await tcp.open(params["host"], params["port"])
        link = tcp
    try:
        await link.handshake(params)
    except BaseException:
        await link.aclose()
        raise
    return link


async def close_link(link: Link) -> None:
    """DISCONNECT (waiting briefly for its RECEIPT, which RabbitMQ's web-stomp never sends),
    then close."""
    with contextlib.suppress(Exception):
        if link.scanner.error is None:
            await link.disconnect(timeout=2)
    await link.aclose()
