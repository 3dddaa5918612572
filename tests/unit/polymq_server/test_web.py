"""The routes and answers ``polymq_server.web.app`` (and its ``receipts``) give every JSON
frontend, on an app with no listener (requests are resolved and answered in process)."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from polymq.answers import Published
from polymq.types import Destination, Outcome
from polymq_server.web.app import add_openapi_route, published_json
from polymq_server.web.receipts import add_settle_routes, settle_outcome


async def answer(app: web.Application, method: str, path: str) -> web.StreamResponse:
    match = await app.router.resolve(make_mocked_request(method, path, app=app))
    if match.http_exception is not None:
        raise match.http_exception
    return await match.handler(make_mocked_request(method, path, match_info=dict(match), app=app))


@pytest.mark.parametrize(
    ("nack", "requeue", "outcome"),
    [(False, True, Outcome.ACK), (True, True, Outcome.REQUEUE), (True, False, Outcome.REJECT)],
)
def test_settle_outcome(nack: bool, requeue: bool, outcome: Outcome) -> None:
    assert settle_outcome(nack=nack, requeue=requeue) is outcome


def test_published_json_of_a_topic_counts_subscribers() -> None:
    result = Published(2, ["a", "b"], [1, 2], subscribers=3)
    assert published_json(Destination.parse("topic/t"), result) == {
        "count": 2,
        "subscribers": 3,
    }


@pytest.mark.parametrize("dest", ["queue/q", "stream/s", "channel/c"])
def test_published_json_of_a_stored_destination_names_the_messages(dest: str) -> None:
    result = Published(2, ["a", "b"], [1, 2])
    answer = published_json(Destination.parse(dest), result)
    assert answer == {"count": 2, "ids": ["a", "b"], "seqs": [1, 2]}
    assert list(answer) == ["count", "ids", "seqs"]  # the order clients see in the JSON


async def test_settle_routes_call_one_handler_with_nack() -> None:
    calls: list[bool] = []

    async def settle(request: web.Request, *, nack: bool) -> web.Response:
        calls.append(nack)
        return web.json_response({"nack": nack}, status=201)

    app = web.Application()
    add_settle_routes(app, settle)
    ack = await answer(app, "POST", "/v1/ack")
    nack = await answer(app, "POST", "/v1/nack")
    assert calls == [False, True]
    assert isinstance(ack, web.Response) and isinstance(nack, web.Response)
    assert (ack.status, ack.body) == (201, b'{"nack": false}')
    assert (nack.status, nack.body) == (201, b'{"nack": true}')
    with pytest.raises(web.HTTPMethodNotAllowed):
        await answer(app, "GET", "/v1/ack")
    assert calls == [False, True]


async def test_openapi_route_serves_the_stored_document() -> None:
    key = web.AppKey("openapi", bytes)
    app = web.Application()
    app[key] = json.dumps({"openapi": "3.1.0"}).encode()
    add_openapi_route(app, key)
    response = await answer(app, "GET", "/openapi.json")
    assert isinstance(response, web.Response)
    assert response.status == 200
    assert response.content_type == "application/json"
    assert response.body == b'{"openapi": "3.1.0"}'
    with pytest.raises(web.HTTPMethodNotAllowed):
        await answer(app, "POST", "/openapi.json")
