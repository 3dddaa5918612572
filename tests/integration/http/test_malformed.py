"""Requests that aiohttp itself cannot read, on every aiohttp listener of one ``polymq run``
(HTTP, long polling, Avro and STOMP over WebSocket): a body whose ``Content-Encoding`` does
not decode is a 400 problem, a NUL in a header aiohttp's 400; neither writes an ERROR or a
traceback into the log (anyone who can connect could fill it), and the listener serves on."""

from __future__ import annotations

import gzip
import socket
import time
from collections.abc import Iterator

import pytest
import requests

from ...procs import PolymqProcess, serving
from .conftest import assert_problem, unique


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    with serving("run", tmp_path_factory.mktemp("http-malformed")) as proc:
        yield proc


def logged_since(server: PolymqProcess, start: int) -> str:
    """What the server logged after ``start`` characters of its log, once it is quiet
    (aiohttp logs what it meets reading the rest of a request after the answer)."""
    time.sleep(0.3)
    return server.log()[start:]


@pytest.mark.parametrize(
    ("listener", "path", "content_type", "body"),
    [
        ("http", "/v1/queue/{q}/messages", "application/json", b'{"body": "x"}'),
        ("longpoll", "/v1/subscriptions", "application/json", b'{"destination": "queue/{q}"}'),
        ("avro", "/v1/queue/{q}/records", "avro/binary", b"Obj\x01\x00"),
    ],
)
def test_a_body_that_does_not_decode_is_a_400_problem(
    server: PolymqProcess, listener: str, path: str, content_type: str, body: bytes
) -> None:
    q = unique("gz")
    start = len(server.log())
    r = requests.post(
        server.url(listener) + path.format(q=q),
        data=body.replace(b"{q}", q.encode()),
        headers={"Content-Type": content_type, "Content-Encoding": "gzip"},
        timeout=10,
    )
    problem = assert_problem(r, 400, "bad-request")
    assert "content-encoding: gzip" in problem["detail"], problem
    assert r.headers["Connection"] == "close"
    logged = logged_since(server, start)
    assert "ERROR" not in logged and "Traceback" not in logged, logged
    assert requests.get(server.url(listener) + "/healthz", timeout=10).status_code == 200


def test_the_body_is_decoded_when_it_is_gzip(server: PolymqProcess) -> None:
    """(So the 400 above is for the bytes, not for the header.)"""
    q = unique("gz")
    r = requests.post(
        f"{server.url('http')}/v1/queue/{q}/messages",
        data=gzip.compress(b'{"body": "zipped"}'),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    pulled = requests.post(f"{server.url('http')}/v1/queue/{q}/pull", timeout=10).json()
    assert [m["body"] for m in pulled["messages"]] == ["zipped"]


@pytest.mark.parametrize("listener", ["http", "longpoll", "avro", "stomp_ws"])
def test_a_nul_in_a_header_is_a_400_without_a_traceback(
    server: PolymqProcess, listener: str
) -> None:
    start = len(server.log())
    with socket.create_connection(("127.0.0.1", server.ports[listener]), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Probe: \x00\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):  # (aiohttp closes the connection after it)
            answer += chunk
    assert answer.startswith(b"HTTP/1.") and answer.split(b" ", 2)[1] == b"400", answer
    logged = logged_since(server, start)
    assert "ERROR" not in logged and "Traceback" not in logged, logged
    assert requests.get(server.url(listener) + "/healthz", timeout=10).status_code == 200
