"""Helpers for the AMQP frontend's integration tests (and the cross-protocol ones): the
processes under test, pika and aio-pika connections to them, and AMQP written by hand over
a raw socket for what no client library would send."""

from __future__ import annotations

import contextlib
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
from pamqp import base, commands, frame, header, heartbeat
from pamqp.body import ContentBody

from ...procs import WAIT, PolymqProcess, RawSocket, serving

__all__ = [
    "QUIET",
    "WAIT",
    "Broker",
    "RawAmqp",
    "Target",
    "eventually",
    "pika_connection",
    "serving_broker",
    "unique",
]

ENV = {
    "POLYMQ_AMQP_HANDSHAKE_TIMEOUT": "3",  # the handshake timeout test waits less
    "POLYMQ_AMQP_VHOSTS": "/,other",
    "POLYMQ_AMQP_ALARM_SWITCH": "1",  # /alarm/forced on the admin port (test_alarms.py)
}
QUIET = 0.5  # seconds to watch for something that must not come


def unique(prefix: str = "t") -> str:
    """A name no other test uses (the broker is shared, and state may be left over)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def eventually(check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


class Broker:
    """The process under test: ``polymq run`` (the core and every frontend, AMQP included);
    ``ports`` holds every listener (``amqp``, ``amqp_admin``, ``core``, ``http``, ``stomp``,
    ...)."""

    def __init__(self, run: PolymqProcess) -> None:
        self.run = run
        self.ports = run.ports

    @property
    def amqp_port(self) -> int:
        return self.ports["amqp"]

    def url(self, name: str = "http") -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def amqp_url(self, vhost: str = "/") -> str:
        from urllib.parse import quote

        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/{quote(vhost, safe='')}"

    def log(self) -> str:
        return self.run.log()


@contextlib.contextmanager
def serving_broker(
    workdir: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[Broker]:
    """A broker shared by several tests: it must still be alive at the end and stop with 0."""
    with serving("run", workdir, *args, env={**ENV, **(env or {})}) as run:
        yield Broker(run)


class Target:
    """A broker a test runs against (polymq or RabbitMQ): its name and AMQP port;
    ``set_alarm(True)`` forces a resource alarm (publishers blocked), ``False`` clears it."""

    def __init__(self, name: str, port: int, set_alarm: Callable[[bool], None]) -> None:
        self.name = name
        self.port = port
        self.set_alarm = set_alarm

    def __repr__(self) -> str:
        return self.name

    @property
    def rabbitmq(self) -> bool:
        return self.name == "rabbitmq"

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def pika(self, **params: Any) -> pika.BlockingConnection:
        params.setdefault("blocked_connection_timeout", WAIT)
        params.setdefault("socket_timeout", WAIT)
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, **params))


def pika_connection(broker: Broker, **params: Any) -> pika.BlockingConnection:
    params.setdefault("blocked_connection_timeout", WAIT)
    params.setdefault("socket_timeout", WAIT)
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, **params)
    )


# ---- raw AMQP ------------------------------------------------------------------------------
Received = tuple[int, Any]  # (channel, pamqp frame object)


class RawAmqp(RawSocket):
    """AMQP 0-9-1 by hand over a socket: pamqp marshals what we send and parses what comes."""

    def method(self, channel: int, method: base.Frame) -> None:
        self.send(frame.marshal(method, channel))

    def publish(
        self, channel: int, exchange: str, key: str, body: bytes, *, mandatory: bool = False
    ) -> None:
        publish = commands.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory)
        self.method(channel, publish)
        head = header.ContentHeader(0, len(body), commands.Basic.Properties())
        self.send(frame.marshal(head, channel))
        self.send(frame.marshal(ContentBody(body), channel))

    def heartbeat(self) -> None:
        self.send(frame.marshal(heartbeat.Heartbeat(), 0))

    def read(self, timeout: float = WAIT) -> Received:
        """The next frame (heartbeats skipped); AssertionError if the socket closes first."""
        deadline = time.monotonic() + timeout
        while True:
            if self.buf.startswith(b"AMQP") and len(self.buf) >= 8:
                data, self.buf = self.buf[:8], self.buf[8:]
                return 0, data
            if len(self.buf) >= 7:
                _, _, size = struct.unpack(">BHI", self.buf[:7])
                if len(self.buf) >= size + 8:
                    n, channel, value = frame.unmarshal(self.buf)
                    self.buf = self.buf[n:]
                    if isinstance(value, heartbeat.Heartbeat):
                        continue
                    return channel, value
            self.receive(deadline)

    def expect(self, cls: type, timeout: float = WAIT) -> Any:
        channel, value = self.read(timeout)
        assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r} on {channel}"
        return value

    def handshake(self, *, heartbeat: int = 0, frame_max: int = 131072) -> commands.Connection.Tune:
        """Header, start-ok (PLAIN guest/guest), tune-ok, open: an open connection."""
        self.send(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start)
        self.method(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "raw"}, mechanism="PLAIN",
                response="\0guest\0guest", locale="en_US",
            ),
        )  # fmt: skip
        tune = self.expect(commands.Connection.Tune)
        self.method(0, commands.Connection.TuneOk(2047, frame_max, heartbeat))
        self.method(0, commands.Connection.Open("/"))
        self.expect(commands.Connection.OpenOk)
        return tune

    def open_channel(self, channel: int = 1) -> None:
        self.method(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)
