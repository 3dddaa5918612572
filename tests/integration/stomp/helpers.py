"""Helpers for the exhaustive STOMP integration tests (and the cross-protocol ones): a
stomp.py client whose listener keeps every frame (CONNECTED, RECEIPT headers, heart-beats),
raw STOMP over TCP and over WebSocket for what stomp.py would never send, and small checks.

Fixtures stay in each test module (pytest finds fixtures in conftest.py and the module
itself); what they build comes from here."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import requests
import stomp
import websocket
from stomp.utils import Frame as StompPyFrame

from ...procs import PolymqProcess
from .conftest import WAIT, Collector, unique

__all__ = [
    "QUIET",
    "WAIT",
    "Clients",
    "Frames",
    "Raw",
    "RawTcp",
    "RawWs",
    "StompClient",
    "control",
    "core_stats",
    "drop",
    "nothing_more",
    "raw_client",
    "unique",
]

QUIET = 0.5  # seconds to watch for something that must not come


class Frames(Collector):
    """A :class:`Collector` that also keeps CONNECTED frames, whole RECEIPT frames and the
    number of heart-beats received."""

    def __init__(self) -> None:
        super().__init__()
        self.connected: list[StompPyFrame] = []
        self.receipt_frames: dict[str, StompPyFrame] = {}
        self.heartbeats = 0

    def on_connected(self, frame: StompPyFrame) -> None:
        self._add(self.connected, frame)

    def on_receipt(self, frame: StompPyFrame) -> None:
        with self._cond:
            self.receipt_frames[frame.headers["receipt-id"]] = frame
        super().on_receipt(frame)

    def on_heartbeat(self) -> None:
        with self._cond:
            self.heartbeats += 1
            self._cond.notify_all()

    def receipt_frame(self, receipt: str, timeout: float = WAIT) -> StompPyFrame:
        self.wait_receipt(receipt, timeout)
        return self.receipt_frames[receipt]

    def bodies(self) -> list[Any]:
        with self._cond:
            return [m.body for m in self.messages]


_VERSIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class StompClient:
    """A stomp.py connection over TCP (STOMP 1.0, 1.1 or 1.2) or WebSocket (1.2), with a
    :class:`Frames` listener. ``kw`` goes to the stomp.py connection's constructor."""

    def __init__(
        self, proc: PolymqProcess, transport: str, version: str = "1.2", **kw: Any
    ) -> None:
        self.transport = transport
        self.version = version
        if transport == "tcp":
            self.conn: Any = _VERSIONS[version]([("127.0.0.1", proc.ports["stomp"])], **kw)
        else:
            assert version == "1.2", "stomp.py speaks STOMP 1.2 over WebSocket"
            self.conn = stomp.WSStompConnection(
                [("127.0.0.1", proc.ports["stomp_ws"])], ws_path="/ws", **kw
            )
        self.listener = Frames()
        self.conn.set_listener("frames", self.listener)

    def connect(self, **kw: Any) -> StompClient:
        self.conn.connect(wait=True, **kw)
        return self

    def send_receipted(self, destination: str, body: Any, **headers: str) -> None:
        """SEND with a receipt, and wait for it."""
        receipt = unique("r")
        self.conn.send(destination, body, headers={**headers, "receipt": receipt})
        self.listener.wait_receipt(receipt)

    def subscribe(
        self, destination: str, sid: str = "s", ack: str = "auto", **headers: str
    ) -> None:
        """SUBSCRIBE with a receipt, and wait for it (the subscription exists at the core)."""
        receipt = unique("sub")
        self.conn.subscribe(destination, id=sid, ack=ack, headers={**headers, "receipt": receipt})
        self.listener.wait_receipt(receipt)

    def close(self) -> None:
        if self.conn.is_connected():
            try:
                self.conn.disconnect()
            except Exception:
                pass
        try:
            self.conn.transport.stop()
        except Exception:
            pass


class Clients:
    """Makes stomp.py clients for one process and transport, and closes them all."""

    def __init__(self, proc: PolymqProcess, transport: str) -> None:
        self.proc = proc
        self.transport = transport
        self.made: list[StompClient] = []

    def __call__(self, version: str = "1.2", ctor: dict[str, Any] | None = None,
                 **connect: Any) -> StompClient:  # fmt: skip
        client = StompClient(self.proc, self.transport, version, **(ctor or {}))
        self.made.append(client)
        return client.connect(**connect)

    def close(self) -> None:
        for client in self.made:
            client.close()


@contextmanager
def clients(proc: PolymqProcess, transport: str) -> Iterator[Clients]:
    made = Clients(proc, transport)
    try:
        yield made
    finally:
        made.close()


def drop(client: StompClient) -> None:
    """Cut the client's socket without a DISCONNECT (as a crash would), and wait until
    stomp.py noticed."""
    sock = client.conn.transport.socket
    if client.transport == "ws":
        sock = sock.sock
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.shutdown(socket.SHUT_RDWR)
    assert client.listener.disconnected.wait(WAIT), "stomp.py did not see the socket close"


def nothing_more(listener: Collector, n: int, wait: float = QUIET) -> None:
    """No message beyond the first ``n`` arrives within ``wait`` seconds."""
    time.sleep(wait)
    with listener._cond:
        extra = listener.messages[n:]
    assert not extra, f"unexpected messages: {[m.body for m in extra]}"


def control(client: StompClient, destination: str) -> dict[str, str]:
    """The RECEIPT headers a control destination answers with."""
    receipt = unique("ctl")
    client.conn.send(destination, "", headers={"receipt": receipt})
    return dict(client.listener.receipt_frame(receipt).headers)


# ---- raw STOMP --------------------------------------------------------------------------
RawFrame = tuple[str, dict[str, str], bytes]


class Raw:
    """STOMP written by hand over a byte pipe: frames in, bytes out. Parses what the server
    sends (heart-beats counted and skipped, ``content-length`` bodies honoured)."""

    kind = "?"

    def __init__(self) -> None:
        self.buf = b""
        self.heartbeats = 0
        self.eof = False

    # the pipe
    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def _recv(self, timeout: float) -> bytes:
        """Bytes from the server; b"" once it closed; TimeoutError if none came in time."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Close with a reset, as a crashed client would."""
        raise NotImplementedError

    # frames
    def frame(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send(encode(command, headers, body))

    def connect(self, **headers: str) -> dict[str, str]:
        """CONNECT (accept-version 1.2 unless told), expect CONNECTED; its headers."""
        self.frame("CONNECT", {"accept-version": "1.2", "host": "localhost", **headers})
        command, got, body = self.read_frame()
        assert command == "CONNECTED", (command, got, body)
        return got

    def _parse(self) -> RawFrame | None:
        while self.buf[:1] in (b"\n", b"\r"):
            if self.buf.startswith(b"\r\n"):
                self.buf = self.buf[2:]
            elif self.buf.startswith(b"\r"):
                return None  # half a CRLF
            else:
                self.buf = self.buf[1:]
            self.heartbeats += 1
        end = self.buf.find(b"\n\n")
        if end < 0:
            return None
        command, *lines = self.buf[:end].decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines:
            k, _, v = line.partition(":")
            headers.setdefault(k, v)
        start = end + 2
        if "content-length" in headers:
            stop = start + int(headers["content-length"])
            if len(self.buf) <= stop:
                return None
            assert self.buf[stop : stop + 1] == b"\0", "no NUL after the body"
        else:
            stop = self.buf.find(b"\0", start)
            if stop < 0:
                return None
        body = self.buf[start:stop]
        self.buf = self.buf[stop + 1 :]
        return command, headers, body

    def read_frame(self, timeout: float = WAIT) -> RawFrame:
        """The next frame; AssertionError if the server closes (or says nothing) first."""
        deadline = time.monotonic() + timeout
        while True:
            got = self._parse()
            if got is not None:
                return got
            assert not self.eof, f"the server closed the connection; unread: {self.buf!r}"
            left = deadline - time.monotonic()
            assert left > 0, f"no frame within {timeout}s; unread: {self.buf!r}"
            try:
                chunk = self._recv(left)
            except TimeoutError:
                continue
            if not chunk:
                self.eof = True
            self.buf += chunk

    def read_error(self, timeout: float = WAIT) -> RawFrame:
        """The next frame, which must be an ERROR with a ``message`` header."""
        frame = self.read_frame(timeout)
        command, headers, _ = frame
        assert command == "ERROR", frame
        assert headers.get("message"), frame
        return frame

    def closed_by_server(self, timeout: float = WAIT) -> bool:
        """Wait for the server to close; True if it did (reading and dropping what comes)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                chunk = self._recv(left)
            except TimeoutError:
                continue
            if not chunk:
                self.eof = True
            self.buf += chunk
        return True

    def count_heartbeats(self, duration: float) -> int:
        """Heart-beats received in the next ``duration`` seconds (no frame may come)."""
        before = self.heartbeats
        deadline = time.monotonic() + duration
        while (left := deadline - time.monotonic()) > 0:
            try:
                chunk = self._recv(left)
            except TimeoutError:
                break
            assert chunk, "the server closed the connection"
            self.buf += chunk
            assert self._parse() is None, f"a frame instead of heart-beats: {self.buf!r}"
        return self.heartbeats - before


def encode(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in (headers or {}).items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


class RawTcp(Raw):
    kind = "tcp"

    def __init__(self, port: int) -> None:
        super().__init__()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv(self, timeout: float) -> bytes:
        self.sock.settimeout(max(0.01, timeout))
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""
        except TimeoutError as exc:
            raise TimeoutError from exc

    def close(self) -> None:
        self.sock.close()

    def kill(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


class RawWs(Raw):
    """STOMP over a WebSocket (websocket-client), as a browser's stompjs would send it: text
    messages, ``v12.stomp`` offered."""

    kind = "ws"

    def __init__(self, port: int, *, binary: bool = False) -> None:
        super().__init__()
        self.binary = binary
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}/ws",
            subprotocols=["v12.stomp", "v11.stomp", "v10.stomp"],
            timeout=WAIT,
        )
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        """One WebSocket message: text when ``data`` is UTF-8 (unless ``binary``), else
        binary."""
        try:
            text = None if self.binary else data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None:
            self.ws.send_binary(data)
        else:
            self.ws.send(text)

    def send_message(self, data: bytes, binary: bool = True) -> None:
        """One WebSocket message of raw bytes."""
        opcode = websocket.ABNF.OPCODE_BINARY if binary else websocket.ABNF.OPCODE_TEXT
        self.ws.send(data, opcode)

    def _recv(self, timeout: float) -> bytes:
        self.ws.settimeout(max(0.01, timeout))
        try:
            opcode, data = self.ws.recv_data(control_frame=False)
        except websocket.WebSocketTimeoutException as exc:
            raise TimeoutError from exc
        except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError):
            return b""
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return b""
        return data if isinstance(data, bytes) else data.encode()

    def close(self) -> None:
        try:
            self.ws.close(timeout=1)
        except Exception:
            pass

    def kill(self) -> None:
        sock = self.ws.sock
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()


def raw_client(proc: PolymqProcess, transport: str) -> Raw:
    if transport == "tcp":
        return RawTcp(proc.ports["stomp"])
    return RawWs(proc.ports["stomp_ws"])


def wait_for(check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def core_stats(proc: PolymqProcess, destination: str) -> dict[str, Any]:
    """The core's stats of ``destination`` (``/queue/x`` or ``queue/x``), over HTTP:
    ``messages`` (ready), ``in_flight`` (delivered, unacknowledged), ``subscribers``..."""
    path = destination.lstrip("/")
    r = requests.get(f"{proc.url('http')}/v1/{path}", timeout=WAIT)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out
