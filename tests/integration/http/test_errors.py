"""Bad input, one case per test: each answer is an RFC 9457 problem with the right status,
and the process goes on serving (checked last, and by the fixture as it stops it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ...procs import PolymqProcess, serving
from .conftest import Api, assert_problem, unique

MAX_BODY = 8192
MAX_BATCH = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    env = {"POLYMQ_MAX_BODY": str(MAX_BODY), "POLYMQ_MAX_BATCH": str(MAX_BATCH)}
    with serving("run", tmp_path_factory.mktemp("http-errors"), env=env) as proc:
        yield proc


def post_raw(api: Api, path: str, data: bytes | str, **headers: str) -> Any:
    headers.setdefault("Content-Type", "application/json")
    return api.post(path, data=data, headers=headers)


def test_malformed_json(api: Api) -> None:
    body = assert_problem(post_raw(api, f"/v1/queue/{unique()}/messages", '{"body": "x"'), 400)
    assert "malformed JSON" in body["detail"]


def test_json_that_is_not_an_object(api: Api) -> None:
    assert_problem(post_raw(api, f"/v1/queue/{unique()}/messages", "[1, 2]"), 400)


def test_empty_body(api: Api) -> None:
    assert_problem(post_raw(api, f"/v1/queue/{unique()}/messages", b""), 400)


@pytest.mark.parametrize(
    "message",
    [
        {"body": 5},
        {"body": "x", "priority": "high"},
        {"body": "x", "priority": 10},
        {"body": "x", "priority": True},
        {"body": "x", "persistent": "yes"},
        {"body": "x", "headers": {"a": 1}},
        {"body": "x", "headers": ["a"]},
        {"body": "x", "ttl": -1},
        {"body": "x", "encoding": "latin1"},
        {"body": "x", "role": "boss"},
        {"body": "x", "correlation_id": 7},
    ],
    ids=lambda m: ",".join(f"{k}={v!r}" for k, v in m.items() if k != "body" or v != "x"),
)
def test_wrong_types(api: Api, message: dict[str, Any]) -> None:
    assert_problem(api.post(f"/v1/queue/{unique()}/messages", json=message), 400)


def test_unknown_field(api: Api) -> None:
    r = api.post(f"/v1/queue/{unique()}/messages", json={"body": "x", "colour": "red"})
    assert "colour" in assert_problem(r, 400)["detail"]


def test_unknown_destination_kind(api: Api) -> None:
    r = api.post("/v1/bucket/things/messages", json={"body": "x"})
    assert "unknown destination kind" in assert_problem(r, 400)["detail"]


def test_name_too_long(api: Api) -> None:
    r = api.post(f"/v1/queue/{'n' * 256}/messages", json={"body": "x"})
    assert "longer than 255" in assert_problem(r, 400)["detail"]


@pytest.mark.parametrize("name", ["bad%20name", "caf%C3%A9", "a..b", "a%2Fb", ".hidden", "x%23"])
def test_illegal_characters_in_name(api: Api, name: str) -> None:
    assert_problem(api.post(f"/v1/queue/{name}/messages", json={"body": "x"}), 400)


def test_body_over_the_maximum(api: Api) -> None:
    big = json.dumps({"body": "x" * MAX_BODY})
    body = assert_problem(post_raw(api, f"/v1/queue/{unique()}/messages", big), 413)
    assert str(MAX_BODY) in body["detail"]


def test_chunked_body_over_the_maximum(api: Api) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        yield b'{"body": "'
        for _ in range(MAX_BODY // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    r = api.post(
        f"/v1/queue/{unique()}/messages",
        data=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert_problem(r, 413)


def test_unknown_receipt(api: Api) -> None:
    r = api.post("/v1/ack", json={"receipts": [f"queue/{unique()}|1|1"]})
    assert_problem(r, 404)


def test_malformed_receipt(api: Api) -> None:
    assert_problem(api.post("/v1/nack", json={"receipts": ["garbage"]}), 404)


def test_bad_base64(api: Api) -> None:
    r = api.post(
        f"/v1/queue/{unique()}/messages", json={"body": "not*base64", "encoding": "base64"}
    )
    assert "base64" in assert_problem(r, 400)["detail"]


def test_batch_too_large(api: Api) -> None:
    batch = {"messages": [{"body": str(i)} for i in range(MAX_BATCH + 1)]}
    r = api.post(f"/v1/queue/{unique()}/messages", json=batch)
    assert f"1..{MAX_BATCH}" in assert_problem(r, 400)["detail"]


def test_empty_batch(api: Api) -> None:
    assert_problem(api.post(f"/v1/queue/{unique()}/messages", json={"messages": []}), 400)


def test_wrong_method(api: Api) -> None:
    r = api.request("PATCH", f"/v1/queue/{unique()}")
    assert_problem(r, 405)
    assert "PUT" in r.headers["Allow"] and "DELETE" in r.headers["Allow"]
    assert_problem(api.get("/v1/ack"), 405)


def test_unknown_route(api: Api) -> None:
    assert_problem(api.get("/v2/queue/x"), 404)
    assert_problem(api.post(f"/v1/topic/{unique()}/pull"), 404)  # pull is for queues


def test_not_json_content_type(api: Api) -> None:
    r = post_raw(
        api,
        f"/v1/queue/{unique()}/messages",
        "body=x",
        **{"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert_problem(r, 415)


@pytest.mark.parametrize(
    "raw",
    [
        '{"body": "\\ud800"}',  # a lone surrogate cannot be sent on
        '{"body": "x", "priority": 1000000000000000000000000000000}',
        '{"body": "x", "ttl": NaN}',
        '{"body": "x", "ttl": 1e400}',
        "[" * 4000 + "]" * 4000,  # deeper than Python's recursion limit, under MAX_BODY
    ],
    ids=["surrogate", "huge-int", "nan", "infinity", "deep"],
)
def test_values_that_cannot_be_encoded(api: Api, raw: str) -> None:
    assert_problem(post_raw(api, f"/v1/queue/{unique()}/messages", raw), 400)


@pytest.mark.parametrize(
    "query",
    [
        "max=0",
        "max=abc",
        "max=1001",
        "wait=31",
        "wait=-1",
        "visibility=0",
        "wait=nan",
        "colour=red",
        "max=1&max=2",
    ],
)
def test_bad_pull_parameters(api: Api, query: str) -> None:
    assert_problem(api.post(f"/v1/queue/{unique()}/pull?{query}"), 400)


@pytest.mark.parametrize(
    "options",
    [
        {"colour": "red"},
        {"overflow": "sometimes"},
        {"dead_letter": "bogus"},
        {"max_length": 0},
        {"durable": "yes"},
        {"idle_ttl": "soon"},
    ],
)
def test_bad_declare_options(api: Api, options: dict[str, Any]) -> None:
    assert_problem(api.put(f"/v1/queue/{unique()}", json=options), 400)


def test_declare_body_null(api: Api) -> None:
    r = api.put(f"/v1/queue/{unique()}", data="null", headers={"Content-Type": "application/json"})
    assert_problem(r, 400)


def test_query_parameters_elsewhere(api: Api) -> None:
    assert_problem(api.get(f"/v1/queue/{unique()}?verbose=1"), 400)


def test_still_alive_and_serving(server: PolymqProcess, api: Api) -> None:
    assert server.alive
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").status_code == 200
    q = unique()
    api.publish(f"queue/{q}", {"body": "still here"})
    [msg] = api.pull(q)
    assert msg["body"] == "still here"
    assert api.ack(msg["receipt"])["settled"] == 1
