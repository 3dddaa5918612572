"""The answer :mod:`polymq_server.web.listener` writes on a connection past the limit."""

from __future__ import annotations

import json

from polymq_server.web.listener import refusal


def test_the_refusal_is_a_whole_503_problem_that_closes() -> None:
    head, _, body = refusal("the http listener has 2 connections").partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["Connection"] == "close" and headers["Retry-After"] == "1"
    assert headers["Content-Type"] == "application/problem+json"
    assert int(headers["Content-Length"]) == len(body)
    problem = json.loads(body)
    assert problem["title"] == "connection limit reached" and problem["status"] == 503
    assert problem["detail"] == "the http listener has 2 connections"
    assert problem["code"] == "unavailable"
