"""Fixtures for the STOMP frontend's integration tests: one ``polymq run`` per module (core,
HTTP and STOMP on 127.0.0.1, ephemeral ports), reached with stomp.py over TCP and over
WebSocket, and with raw sockets for what stomp.py would never send."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
from stomp.utils import Frame as StompPyFrame

from ...procs import WAIT, PolymqProcess, RawSocket
from ...rabbit import RabbitNode, find_server, has_plugin, rabbit_node


def eventually(check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def unique(prefix: str = "t") -> str:
    """A destination name no other test uses."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


class Recorder(stomp.ConnectionListener):  # type: ignore[misc]
    """The MESSAGE and ERROR frames and RECEIPT ids stomp.py hands its listener, each added
    under ``_cond`` and notified: what :class:`Collector` (and the browser tests' own
    collector) wait on, each their own way."""

    def __init__(self) -> None:
        self.messages: list[StompPyFrame] = []
        self.receipts: list[str] = []
        self.errors: list[StompPyFrame] = []
        self._cond = threading.Condition()

    def _add(self, items: list[Any], item: Any) -> None:
        with self._cond:
            items.append(item)
            self._cond.notify_all()

    def on_message(self, frame: StompPyFrame) -> None:
        self._add(self.messages, frame)

    def on_receipt(self, frame: StompPyFrame) -> None:
        self._add(self.receipts, frame.headers["receipt-id"])

    def on_error(self, frame: StompPyFrame) -> None:
        self._add(self.errors, frame)


class Collector(Recorder):
    """Every frame stomp.py hands its listener, and a way to wait for them."""

    def __init__(self) -> None:
        super().__init__()
        self.disconnected = threading.Event()

    def on_disconnected(self) -> None:
        self.disconnected.set()
        with self._cond:
            self._cond.notify_all()

    def wait(self, check: Callable[[], bool], timeout: float = WAIT) -> None:
        with self._cond:
            assert self._cond.wait_for(check, timeout), "condition not reached in time"

    def wait_messages(self, n: int, timeout: float = WAIT) -> list[StompPyFrame]:
        self.wait(lambda: len(self.messages) >= n, timeout)
        return list(self.messages)

    def wait_receipt(self, receipt: str, timeout: float = WAIT) -> None:
        self.wait(lambda: receipt in self.receipts, timeout)

    def wait_error(self, timeout: float = WAIT) -> StompPyFrame:
        self.wait(lambda: bool(self.errors), timeout)
        return self.errors[0]


class Stomp:
    """A stomp.py connection (STOMP 1.2) over TCP or WebSocket, with its collector."""

    def __init__(self, proc: PolymqProcess, transport: str, **kw: Any) -> None:
        self.transport = transport
        if transport == "tcp":
            self.conn: Any = stomp.Connection12([("127.0.0.1", proc.ports["stomp"])], **kw)
        else:
            self.conn = stomp.WSStompConnection(
                [("127.0.0.1", proc.ports["stomp_ws"])], ws_path="/ws", **kw
            )
        self.listener = Collector()
        self.conn.set_listener("collector", self.listener)

    def connect(self, **kw: Any) -> Stomp:
        self.conn.connect(wait=True, **kw)
        return self

    def close(self) -> None:
        if self.conn.is_connected():
            try:
                self.conn.disconnect()
            except Exception:
                pass


@pytest.fixture(scope="module")
def run_stomp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """One ``polymq run`` for the module (every test uses its own destinations)."""
    workdir: Path = tmp_path_factory.mktemp("stomp")
    with PolymqProcess("run", workdir) as proc:
        yield proc


@pytest.fixture(params=["tcp", "ws"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_STOMP_PLUGINS = ("rabbitmq_stomp", "rabbitmq_web_stomp")


@pytest.fixture(scope="package")
def rabbit_stomp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A private RabbitMQ node (``tests/rabbit.py``) with its STOMP plugins, on ports of its
    own, for the tests that show RabbitMQ does what polymq does; skipped where RabbitMQ or
    its STOMP plugins are not installed."""
    if find_server() is None or not all(map(has_plugin, _STOMP_PLUGINS)):
        pytest.skip("RabbitMQ with its STOMP plugins is not installed here")
    with rabbit_node(tmp_path_factory.mktemp("rabbit"), plugins=_STOMP_PLUGINS) as node:
        yield node


@pytest.fixture
def connect(run_stomp: PolymqProcess, transport: str) -> Iterator[Callable[..., Stomp]]:
    """``connect(**headers)``: a connected stomp.py client over the parametrized transport."""
    made: list[Stomp] = []

    def make(**kw: Any) -> Stomp:
        client = Stomp(run_stomp, transport).connect(**kw)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


class RawStomp(RawSocket):
    """STOMP over a plain TCP socket: frames in, bytes out, for bad input and heart-beats."""

    def frame(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        lines = [command] + [f"{k}:{v}" for k, v in (headers or {}).items()]
        self.send(("\n".join(lines) + "\n\n").encode() + body + b"\0")

    def read_frame(self, timeout: float = WAIT) -> tuple[str, dict[str, str], bytes]:
        """The next frame (heart-beats skipped); AssertionError if the socket closes first."""
        deadline = time.monotonic() + timeout
        while True:
            self.buf = self.buf.lstrip(b"\r\n")
            end = self.buf.find(b"\0")
            if end >= 0:
                raw, self.buf = self.buf[:end], self.buf[end + 1 :]
                head, _, body = raw.partition(b"\n\n")
                command, *lines = head.decode().split("\n")
                headers: dict[str, str] = {}
                for line in lines:
                    k, _, v = line.partition(":")
                    headers.setdefault(k, v)
                return command, headers, body
            self.receive(deadline)
