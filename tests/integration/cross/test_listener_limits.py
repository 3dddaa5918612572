"""Handshake timeouts and connection limits of the STOMP and AMQP listeners, against one
``polymq run`` with ``POLYMQ_HANDSHAKE_TIMEOUT=1`` and ``POLYMQ_MAX_CONNECTIONS=2``: a STOMP
socket that sends no CONNECT gets an ERROR and is closed; a third STOMP or AMQP connection is
told why (an ERROR ``Connection limit reached``; a ``connection.close`` 530 NOT_ALLOWED at
``connection.open``, as RabbitMQ refuses its connection limits), and
a place that frees up is taken again. The core's wire port has its own tests
(tests/integration/core/test_limits.py)."""

from __future__ import annotations

import json
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


# ---- the HTTP listeners: the frontends' and the core's admin port ------------------------------
HTTP_LISTENERS = {  # listener: the prefix of its metrics
    "http": "polymq_http",
    "longpoll": "polymq_longpoll",
    "avro": "polymq_avro",
    "admin": "polymq_admin",
}


@pytest.fixture(scope="module")
def http_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """``POLYMQ_MAX_CONNECTIONS=2`` with the handshake timeout long enough (idle
    keep-alive connections close after it) for the held connections to stay."""
    workdir: Path = tmp_path_factory.mktemp("http-limits")
    env = {"POLYMQ_HANDSHAKE_TIMEOUT": "20", "POLYMQ_MAX_CONNECTIONS": "2"}
    with PolymqProcess("run", workdir, env=env) as proc:
        yield proc


def get(sock: socket.socket, path: str) -> tuple[int, bytes, bytes]:
    """``GET path`` on a kept-alive connection: the status, the head and the body."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {answer!r}"
        body += chunk
    return int(head.split(b" ", 2)[1]), head, body


def held(run: PolymqProcess, listener: str) -> socket.socket:
    """A connection that was answered 200 and is kept alive."""
    sock = socket.create_connection(("127.0.0.1", run.ports[listener]), timeout=WAIT)
    status, head, _ = get(sock, "/healthz")
    assert status == 200, head
    return sock


@pytest.mark.parametrize("listener", list(HTTP_LISTENERS))
def test_http_connections_past_the_limit_get_503_and_are_closed(
    http_run: PolymqProcess, listener: str
) -> None:
    first, second = held(http_run, listener), held(http_run, listener)
    try:
        with socket.create_connection(("127.0.0.1", http_run.ports[listener]), timeout=WAIT) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = read_all(s)  # and closed (a socket timeout fails the test)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer
        assert b"connection: close" in head.lower() and b"application/problem+json" in head
        problem = json.loads(body)
        assert problem["title"] == "connection limit reached" and problem["status"] == 503
        assert "2 connections, the most it takes" in problem["detail"], problem
        assert get(second, "/healthz")[0] == 200  # those held are still served
        first.close()
        deadline = time.monotonic() + WAIT
        while True:  # the place is taken again once the server saw the close
            try:
                again = held(http_run, listener)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "the freed place was not taken again"
                time.sleep(0.1)
        with again:
            status, _, metrics = get(again, "/metrics")
        assert status == 200
        prefix = HTTP_LISTENERS[listener]
        text = metrics.decode()
        assert f'{prefix}_connections{{listener="{listener}"}} 2.0' in text
        refused = f'{prefix}_connections_refused_total{{listener="{listener}"}} '
        assert float(text.split(refused, 1)[1].split("\n", 1)[0]) >= 1
    finally:
        first.close()
        second.close()


def test_the_admin_port_closes_a_silent_socket(run: PolymqProcess) -> None:
    with socket.create_connection(("127.0.0.1", run.ports["admin"]), timeout=WAIT) as sock:
        started = time.monotonic()
        assert read_all(sock) == b""  # nothing said, nothing answered: closed
    assert time.monotonic() - started < 5  # at the 1 s timeout, not aiohttp's 75 s


def test_the_admin_port_answers_408_to_a_body_that_stops(run: PolymqProcess) -> None:
    with socket.create_connection(("127.0.0.1", run.ports["admin"]), timeout=WAIT) as sock:
        sock.sendall(
            b"POST /api/config/reload HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        answer = read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(body)["code"] == "timeout"
