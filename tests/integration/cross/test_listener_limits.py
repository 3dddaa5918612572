"""Handshake timeouts and connection limits of the STOMP and AMQP listeners, against one
``polymq run`` with ``POLYMQ_HANDSHAKE_TIMEOUT=1`` and ``POLYMQ_MAX_CONNECTIONS=2``: a STOMP
socket that sends no CONNECT gets an ERROR and is closed; a third STOMP or AMQP connection is
told why (an ERROR ``Connection limit reached``; a ``connection.close`` 530 NOT_ALLOWED at
``connection.open``, as RabbitMQ refuses its connection limits), and
a place that frees up is taken again. The core's wire port has its own tests
(tests/integration/core/test_limits.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from ...procs import PolymqProcess
from ...sockets import read_all

pytestmark = pytest.mark.timeout(60)
WAIT = 10


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir: Path = tmp_path_factory.mktemp("limits")
    env = {"POLYMQ_HANDSHAKE_TIMEOUT": "1", "POLYMQ_MAX_CONNECTIONS": "2"}
    with PolymqProcess("run", workdir, env=env) as proc:
        yield proc


def stomp_connect(run: PolymqProcess) -> tuple[socket.socket, bytes]:
    """A STOMP connection that sent CONNECT (accept-version 1.2), and the first frame back."""
    sock = socket.create_connection(("127.0.0.1", run.ports["stomp"]), timeout=WAIT)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
    answer = b""
    while b"\x00" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return sock, answer


def test_a_stomp_socket_without_connect_gets_an_error_and_is_closed(run: PolymqProcess) -> None:
    with socket.create_connection(("127.0.0.1", run.ports["stomp"]), timeout=WAIT) as sock:
        answer = read_all(sock)  # closed by the server (a socket timeout fails the test)
    assert answer.startswith(b"ERROR\n"), answer
    assert b"message:Handshake timeout" in answer
    assert b"no CONNECT (login) within 1 seconds" in answer


def test_stomp_connections_past_the_limit_are_refused_with_a_reason(run: PolymqProcess) -> None:
    first, a = stomp_connect(run)
    second, b = stomp_connect(run)
    try:
        assert a.startswith(b"CONNECTED") and b.startswith(b"CONNECTED"), (a, b)
        third, c = stomp_connect(run)
        with third:
            assert c.startswith(b"ERROR\n") and b"message:Connection limit reached" in c, c
            assert read_all(third) == b""  # and closed
        first.close()
        deadline = time.monotonic() + WAIT
        while True:  # the place is taken again once the server saw the close
            again, d = stomp_connect(run)
            again.close()
            if d.startswith(b"CONNECTED") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert d.startswith(b"CONNECTED"), d
    finally:
        first.close()
        second.close()


def test_amqp_connections_past_the_limit_are_closed_with_530(run: PolymqProcess) -> None:
    params = pika.ConnectionParameters("127.0.0.1", run.ports["amqp"])
    held = [pika.BlockingConnection(params), pika.BlockingConnection(params)]
    try:
        # (pika calls a close during the handshake a "probable access denied" error)
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            pika.BlockingConnection(params)
        assert "(530)" in str(info.value) and "connection limit reached" in str(info.value)
        held.pop().close()
        deadline = time.monotonic() + WAIT
        while True:
            try:
                held.append(pika.BlockingConnection(params))
                break
            except pika.exceptions.ProbableAccessDeniedError:
                assert time.monotonic() < deadline, "the freed place was not taken again"
                time.sleep(0.1)
    finally:
        for c in held:
            c.close()
