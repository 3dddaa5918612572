"""The codec against stomp.py's own encoder and parser (no sockets): what stomp.py's
Protocol10/11/12 write, a polymq server reads; what a polymq server writes, stomp.py reads."""

from __future__ import annotations

from typing import Any

import pytest
from stomp import utils
from stomp.protocol import Protocol10, Protocol11, Protocol12

from polymq_stomp.codec import Role, StompConnection
from polymq_stomp.frames import Command, Frame

from .helpers import open_connection, receive, tr

PROTOCOLS = {"1.0": Protocol10, "1.1": Protocol11, "1.2": Protocol12}
# Header values that need escaping in 1.1/1.2; stomp.py escapes values (not names).
AWKWARD = {
    "1.0": "a:b\\c ünï ✓",
    "1.1": "a:b\nc\\d ünï ✓",
    "1.2": "a:b\nc\r\\d ünï ✓",
}


class Capture:
    """Just enough of a stomp.py transport to capture the frames its protocol sends."""

    vhost = "polymq"
    current_host_and_port = ("127.0.0.1", 61613)

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def set_listener(self, name: str, listener: Any) -> None:
        pass

    def is_connected(self) -> bool:
        return True

    def transmit(self, frame: utils.Frame) -> None:
        self.sent.append(utils.pack(utils.convert_frame(frame)))  # what transmit() writes


def stomppy(version: str) -> tuple[Any, Capture]:
    transport = Capture()
    proto = PROTOCOLS[version](transport, auto_content_length=True)
    proto.set_receipt = lambda receipt, command: None  # a stomp.Connection mixin's, unused here
    return proto, transport


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_server_reads_what_stomppy_writes(version: str) -> None:
    proto, transport = stomppy(version)
    value = AWKWARD[version]
    body = "body with NUL \0 and ünïcode".encode()
    proto.connect("guest", "pass:word\\x", wait=False)
    proto.send("/queue/a", body, content_type="text/plain", headers={"x-awkward": value})
    proto.subscribe("/queue/a", id="s:1", ack="client-individual")
    proto.ack("m:1", **({"subscription": "s:1"} if version == "1.1" else {}))
    if version != "1.0":
        proto.nack("m:2", **({"subscription": "s:1"} if version == "1.1" else {}))
    proto.begin("t\\1")
    proto.commit("t\\1")
    proto.abort("t\\1")
    proto.unsubscribe(id="s:1")
    proto.disconnect(receipt="bye")

    conn = open_connection(Role.SERVER, version)
    connect, *frames = transport.sent
    # CONNECT (STOMP for 1.1/1.2) goes to a fresh server, unescaped
    got, exc = receive(StompConnection(Role.SERVER), [connect])
    assert exc is None
    first = got[0]
    assert isinstance(first, Frame)
    assert first.command is (Command.CONNECT if version == "1.0" else Command.STOMP)
    assert first.get("passcode") == "pass:word\\x"
    assert first.get("login") == "guest"
    assert len(got) == 1

    got, exc = receive(conn, [b"".join(frames)])
    assert exc is None
    decoded = [f for f in got if isinstance(f, Frame)]
    assert len(decoded) == len(got)
    assert [f.command for f in decoded] == [
        Command.SEND,
        Command.SUBSCRIBE,
        Command.ACK,
        *([Command.NACK] if version != "1.0" else []),
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.UNSUBSCRIBE,
        Command.DISCONNECT,
    ]
    send = decoded[0]
    assert send.body == body
    assert send.get("x-awkward") == value
    assert send.get("destination") == "/queue/a"
    assert send.get("content-length") == str(len(body))
    assert decoded[1].get("id") == "s:1"
    assert decoded[-1].get("receipt") == "bye"
    assert all(f.get("transaction") == "t\\1" for f in decoded if f.command is Command.BEGIN)


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_stomppy_frames_fed_every_way(version: str) -> None:
    proto, transport = stomppy(version)
    proto.send("/topic/x", b"\0\0", headers={"k": AWKWARD[version]})
    expected = Frame(
        Command.SEND,
        tuple(
            sorted(
                {"content-length": "2", "destination": "/topic/x", "k": AWKWARD[version]}.items()
            )
        ),
        b"\0\0",
    )
    tr(lambda: open_connection(Role.SERVER, version), transport.sent[0], [expected])


def test_stomppy_reads_what_the_server_writes() -> None:
    server = open_connection(Role.SERVER, "1.2")
    message = Frame(
        Command.MESSAGE,
        (
            ("destination", "/queue/a:b"),
            ("message-id", "m\n1"),
            ("subscription", "s\\1"),
            ("x-cr", "a\rb"),
            ("content-length", "4"),
        ),
        b"a\0b\n",
    )
    data = server.send(message)
    assert data.endswith(b"\0")
    parsed = utils.parse_frame(data[:-1])  # stomp.py's transport strips the NUL first
    assert parsed.cmd == "MESSAGE"
    assert parsed.headers == dict(message.headers)
    assert parsed.body == b"a\0b\n"
    error = utils.parse_frame(server.error_bytes("bad: thing", "why", receipt_id="r:1")[:-1])
    assert error.cmd == "ERROR"
    assert error.headers["message"] == "bad: thing"
    assert error.headers["receipt-id"] == "r:1"
    assert error.body == b"why"
