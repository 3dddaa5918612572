"""Helpers for the core's integration tests: unique names, collecting deliveries, and a raw
wire-protocol socket for what the polymq client would never send (or never stop reading)."""

from __future__ import annotations

import asyncio
import socket
import struct
import uuid
from collections.abc import Sequence
from typing import Any

import msgpack

from polymq import Client, Delivery, Subscription
from polymq.codec import PREAMBLE

HELLO, SUBSCRIBE, PING = 1, 14, 26
WELCOME, OK, FAIL, DELIVER, GOODBYE = 2, 40, 41, 42, 45


def uid(prefix: str = "t") -> str:
    """A destination name no other test uses."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


async def connect(port: int, **kw: Any) -> Client:
    return await Client.connect("127.0.0.1", port, **kw)


async def collect(sub: Subscription, n: int, within: float = 10.0) -> list[Delivery]:
    """Exactly ``n`` deliveries, or fail saying how many came."""
    out: list[Delivery] = []

    async def take() -> None:
        while len(out) < n:
            out.append(await sub.__anext__())

    try:
        await asyncio.wait_for(take(), within)
    except TimeoutError:
        raise AssertionError(f"got {len(out)} of {n} deliveries within {within}s") from None
    return out


async def nothing_more(sub: Subscription, wait: float = 0.4) -> None:
    """Assert that no further delivery arrives within ``wait`` seconds."""
    try:
        d = await sub.get(wait)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected delivery {d.message.body!r} (tag {d.tag})")


def bodies(ds: Sequence[Delivery]) -> list[bytes]:
    return [d.message.body for d in ds]


async def eventually(pred: Any, within: float = 5.0, interval: float = 0.05) -> Any:
    """Await ``pred()`` (sync or async) until it returns a truthy value."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        v = pred()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(interval)


# ---- the wire protocol by hand ------------------------------------------------------------


def frame(*ops: list[Any]) -> bytes:
    """One frame carrying the raw operations ``[opcode, field, ...]``."""
    payload = msgpack.packb(list(ops), use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def hello(client: str = "raw-test") -> list[Any]:
    return [HELLO, 1, client, None, None, None]


class FrameReader:
    """Splits what a raw socket received into operations; tolerates a cut final frame."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.ops: list[list[Any]] = []
        self.nbytes = 0

    def feed(self, data: bytes) -> list[list[Any]]:
        self.buf += data
        self.nbytes += len(data)
        new: list[list[Any]] = []
        while len(self.buf) >= 4:
            (n,) = struct.unpack_from(">I", self.buf)
            if len(self.buf) < 4 + n:
                break
            new.extend(msgpack.unpackb(bytes(self.buf[4 : 4 + n]), raw=False))
            del self.buf[: 4 + n]
        self.ops.extend(new)
        return new

    @property
    def truncated(self) -> int:
        """Bytes of a frame that never completed."""
        return len(self.buf)

    def of(self, opcode: int) -> list[list[Any]]:
        return [op for op in self.ops if op[0] == opcode]


class RawConn:
    """A non-blocking socket speaking the wire protocol by hand, on the running loop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader()
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, port: int, *, rcvbuf: int | None = None) -> RawConn:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect, so that the window is small from the start
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return cls(sock)

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def handshake(self, *ops: list[Any]) -> None:
        """Preamble, Hello and ``ops`` in one frame; wait for the Welcome."""
        await self.send(PREAMBLE + frame(hello(), *ops))
        await self.until(lambda r: r.of(WELCOME))

    async def until(self, pred: Any, within: float = 5.0) -> None:
        """Read until ``pred(self.reader)`` holds."""

        async def loop() -> None:
            while not pred(self.reader):
                data = await self.loop.sock_recv(self.sock, 65536)
                if not data:
                    raise AssertionError(f"EOF before the expected answer: {self.reader.ops}")
                self.reader.feed(data)

        await asyncio.wait_for(loop(), within)

    async def read_to_eof(self, within: float = 10.0) -> FrameReader:
        """Read everything until the peer closes; raises TimeoutError if it does not."""

        async def loop() -> None:
            while True:
                try:
                    data = await self.loop.sock_recv(self.sock, 1 << 20)
                except ConnectionResetError:
                    return
                if not data:
                    return
                self.reader.feed(data)

        await asyncio.wait_for(loop(), within)
        return self.reader

    async def drain(self, quiet: float = 0.5, within: float = 30.0) -> None:
        """Read until nothing has come for ``quiet`` seconds."""

        async def loop() -> None:
            while True:
                try:
                    data = await asyncio.wait_for(self.loop.sock_recv(self.sock, 1 << 20), quiet)
                except TimeoutError:
                    return
                if not data:
                    return
                self.reader.feed(data)

        await asyncio.wait_for(loop(), within)

    def close(self) -> None:
        self.sock.close()
