"""Requests that never finish, on every HTTP listener of one ``polymq run`` (the HTTP,
long-polling and Avro frontends), with ``POLYMQ_HANDSHAKE_TIMEOUT=1``: a body shorter than
its ``Content-Length`` or a chunk that never comes is answered 408 (a JSON problem) and the
connection closed; headers that never end (bare CRLFs, or nothing at all) are closed; a body
that keeps coming, however slowly, is served."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ...procs import PolymqProcess
from ...sockets import read_all

pytestmark = pytest.mark.timeout(60)

LISTENERS = ("http", "longpoll", "avro")
PATHS = {  # a request with a body on each
    "http": "/v1/queue/deadline/messages",
    "longpoll": "/v1/queue/deadline/messages",
    "avro": "/v1/queue/deadline/records",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir: Path = tmp_path_factory.mktemp("deadlines")
    with PolymqProcess("run", workdir, env={"POLYMQ_HANDSHAKE_TIMEOUT": "1"}) as proc:
        yield proc


def connect(run: PolymqProcess, listener: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", run.ports[listener]), timeout=10)
    return sock


def problem(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/problem+json" in head.lower(), head
    return status, json.loads(body)


def request_head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode()


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_body_shorter_than_its_length_gets_408(run: PolymqProcess, listener: str) -> None:
    with connect(run, listener) as sock:
        sock.sendall(request_head(PATHS[listener], "Content-Length: 100") + b'{"body": ')
        status, body = problem(read_all(sock))
    assert status == 408 and body["code"] == "timeout", body
    assert "1 seconds" in str(body["detail"])


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_chunk_that_never_comes_is_refused(run: PolymqProcess, listener: str) -> None:
    with connect(run, listener) as sock:
        head = request_head(PATHS[listener], "Transfer-Encoding: chunked")
        sock.sendall(head + b"FFFFFFFFFFFF\r\n" + b"x" * 10)
        status, body = problem(read_all(sock))
    assert status in (400, 408, 413), body  # refused at once, or when nothing more came


@pytest.mark.parametrize("listener", LISTENERS)
def test_headers_that_never_end_are_closed(run: PolymqProcess, listener: str) -> None:
    with connect(run, listener) as sock:
        for _ in range(50):  # 5 s of bare CRLFs, far past the 1 s timeout
            try:
                sock.sendall(b"\r\n")
            except OSError:  # closed under us: what this test wants
                break
            time.sleep(0.1)
        else:
            pytest.fail("still open after 5 s of bare CRLFs")
    with connect(run, listener) as silent:
        assert read_all(silent) == b""  # nothing said, nothing answered: closed


@pytest.mark.parametrize("listener", ["http", "longpoll"])
def test_a_slow_body_that_keeps_coming_is_served(run: PolymqProcess, listener: str) -> None:
    body = json.dumps({"body": "slow but steady"}).encode()
    with connect(run, listener) as sock:
        sock.sendall(request_head(PATHS[listener], f"Content-Length: {len(body)}"))
        for i in range(0, len(body), 8):  # 2+ s in all, a piece every 0.4 s
            time.sleep(0.4)
            sock.sendall(body[i : i + 8])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
