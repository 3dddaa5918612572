"""Fuzzing the JSON frontends' request bodies (``polymq_server.web.payloads``, shared by the
HTTP, long-polling and Avro frontends): JSON nested up to 200,000 deep, as a whole body and
inside a message, a batch, a declare and a settle. Every body is taken or answered with a
4xx problem (``Problem``), never another exception (which aiohttp would answer with 500)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

from aiohttp import streams, web
from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymq.types import Destination
from polymq_server.web.payloads import parse_declare, parse_publish, parse_settle, read_json
from polymq_server.web.problems import Problem

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
DEPTHS = st.sampled_from([1, 100, 990, 1000, 5000, 200_000]) | st.integers(0, 3000)
QUEUE = Destination.parse("queue/q")


def nested(kind: str, depth: int, leaf: str = "1") -> str:
    if kind == "list":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


def read(body: bytes) -> Any:
    async def go() -> Any:
        protocol = mock.Mock(_reading_paused=False)
        payload = streams.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
        payload.feed_data(body)
        payload.feed_eof()
        request = make_mocked_request(
            "POST",
            "/",
            headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
            payload=payload,
        )
        data, _ = await read_json(request, 16 * 1024 * 1024)
        return data

    return asyncio.run(go())


def answered(call: Any) -> Problem | web.HTTPException | None:
    """None if ``call`` took the body, else the 4xx it answered with (a Problem, or
    aiohttp's 413 past the request size)."""
    try:
        call()
    except Problem as problem:
        assert 400 <= problem.status < 500, problem
        return problem
    except web.HTTPException as exc:
        assert 400 <= exc.status < 500, exc
        return exc
    return None


@FUZZ
@given(st.sampled_from(["list", "object"]), DEPTHS)
def test_a_deep_body_is_taken_or_a_400(kind: str, depth: int) -> None:
    text = nested(kind, depth)
    problem = answered(lambda: read(text.encode()))
    if problem is None:
        assert json.dumps(read(text.encode()), separators=(",", ":")) == text


@FUZZ
@given(
    st.sampled_from(["list", "object"]),
    DEPTHS,
    st.sampled_from(["headers", "body", "priority", "batch", "declare", "settle"]),
)
def test_deep_json_inside_a_request_is_a_4xx(kind: str, depth: int, where: str) -> None:
    deep = nested(kind, depth)
    text = {
        "headers": f'{{"body":"x","headers":{{"h":{deep}}}}}',
        "body": f'{{"body":{deep}}}',
        "priority": f'{{"body":"x","priority":{deep}}}',
        "batch": f'{{"messages":[{{"body":"x"}},{deep}]}}',
        "declare": f'{{"max_length":{deep}}}',
        "settle": f'{{"receipts":{deep}}}',
    }[where]

    def request() -> None:
        data = read(text.encode())
        if where == "declare":
            parse_declare(data)
        elif where == "settle":
            parse_settle(data, 100, nack=False)
        else:
            parse_publish(data, QUEUE, 100)

    answered(request)
