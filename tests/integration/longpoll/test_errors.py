"""Bad input gets a clear 4xx problem (RFC 9457), and the process carries on (the module's
``server`` must still be alive and stop cleanly at the end)."""

from __future__ import annotations

import pytest
import requests

from polymq.types import Destination
from polymq_longpoll.subscriptions import AckMode, SubscriptionRef, ids_key

from .conftest import SECRET, Longpoll, assert_problem, unique


def _forged_id(core_id: str, destination: str) -> str:
    """A well-formed id, signed with the key of the server's ids, naming a subscription
    the core never had."""
    dest = Destination.parse(destination, pattern=True)
    return SubscriptionRef(core_id, dest, AckMode.CLIENT, 10).encode(ids_key(SECRET))


@pytest.mark.parametrize(
    "sub_id",
    ["nope", "x" * 3000, _forged_id("AAAAAAAAAAAAAAAA", "topic/t"), "%00", "WzEsMiwzXQ"],
)
def test_unknown_subscription_ids_are_404(lp: Longpoll, sub_id: str) -> None:
    for method, path in (
        ("GET", f"/v1/subscriptions/{sub_id}/poll"),
        ("GET", f"/v1/subscriptions/{sub_id}/events"),
        ("DELETE", f"/v1/subscriptions/{sub_id}"),
    ):
        body = assert_problem(lp.request(method, path), 404)
        assert body["code"] == "not-found"


def test_ids_are_signed_with_the_configured_secret(lp: Longpoll) -> None:
    """POLYMQ_LONGPOLL_SECRET is the key (so the 404s above are the core's, not the MAC's)."""
    sub = lp.open(f"queue/{unique()}")
    ref = SubscriptionRef.decode(sub["id"], ids_key(SECRET))
    assert str(ref.destination) == sub["destination"] and ref.owner == ""


def test_an_expired_cursor_is_410(lp: Longpoll) -> None:
    dest = f"topic/{unique()}"
    sub = lp.open(dest, buffer=3)  # the core holds at most 3 messages for it
    for i in range(6):
        lp.publish(dest, str(i))
    for r in (
        lp.get(f"/v1/subscriptions/{sub['id']}/poll", params={"cursor": sub["cursor"]}),
        lp.get(f"/v1/subscriptions/{sub['id']}/events", headers={"Last-Event-ID": "1"}),
    ):
        body = assert_problem(r, 410)
        assert body["code"] == "gone" and "older" in body["detail"]
    # without a cursor: what is still held, the oldest dropped
    assert [m["body"] for m in lp.poll(sub["id"])["messages"]] == ["3", "4", "5"]


@pytest.mark.parametrize(
    ("body", "content_type", "status", "words"),
    [
        (b"{not json", "application/json", 400, "malformed JSON"),
        (b"[1, 2]", "application/json", 400, "JSON object"),
        (b"", "application/json", 400, "needs a JSON body"),
        (b'{"destination": "queue/a"}', "text/plain", 415, "application/json"),
        (b'{"destination": "nowhere"}', "application/json", 400, "destination"),
        (b'{"destination": "queue/a b"}', "application/json", 400, "illegal characters"),
        (b'{"destination": "channel/c"}', "application/json", 400, "channel"),
        (b'{"destination": "queue/a", "offset": "first"}', "application/json", 400, "streams"),
        (b'{"destination": "stream/s", "offset": "sideways"}', "application/json", 400, "offset"),
        # past a stream's sequences (2**63 - 1): not an overflow at the core
        (
            b'{"destination": "stream/s", "offset": "9999999999999999999999999"}',
            "application/json",
            400,
            "offset sequence must be 0..9223372036854775807",
        ),
        (
            b'{"destination": "stream/s", "offset": "9223372036854775808"}',
            "application/json",
            400,
            "offset sequence",
        ),
        (
            b'{"destination": "stream/s", "offset": 9223372036854775808}',
            "application/json",
            400,
            "64-bit",
        ),
        (b'{"destination": "queue/a", "ttl": 0}', "application/json", 400, "ttl"),
        (b'{"destination": "queue/a", "ttl": 1e9}', "application/json", 400, "ttl"),
        (b'{"destination": "queue/a", "visibility": -1}', "application/json", 400, "visibility"),
        (b'{"destination": "topic/a", "buffer": 0}', "application/json", 400, "buffer"),
        (b'{"destination": "topic/a", "ack": "auto"}', "application/json", 400, "queues"),
        (b'{"destination": "queue/a", "ack": "maybe"}', "application/json", 400, "ack"),
        (b'{"destination": "queue/a", "prefetch": 0}', "application/json", 400, "prefetch"),
        (b'{"destination": "queue/a", "colour": 1}', "application/json", 400, "colour"),
    ],
)
def test_bad_subscriptions_are_400(
    lp: Longpoll, body: bytes, content_type: str, status: int, words: str
) -> None:
    r = lp.post("/v1/subscriptions", data=body, headers={"Content-Type": content_type})
    problem = assert_problem(r, status)
    assert words in problem["detail"], problem


@pytest.mark.parametrize(
    ("params", "headers", "words"),
    [
        ({"wait": "31"}, {}, "at most 30"),
        ({"wait": "-1"}, {}, "wait"),
        ({"wait": "soon"}, {}, "wait"),
        ({"wait": "nan"}, {}, "wait"),
        ({"max": "0"}, {}, "max"),
        ({"max": "1001"}, {}, "max"),
        ({"cursor": "-1"}, {}, "cursor"),
        ({"cursor": "abc"}, {}, "cursor"),
        ({"cursor": "99999999999999999999"}, {}, "cursor"),
        ({"cursor": "50"}, {}, "ahead"),
        ({}, {"Last-Event-ID": "x1"}, "Last-Event-ID"),
        ({"colour": "red"}, {}, "colour"),
    ],
)
def test_bad_polls_are_400(
    lp: Longpoll, params: dict[str, str], headers: dict[str, str], words: str
) -> None:
    sub = lp.open(f"topic/{unique()}")
    r = lp.get(f"/v1/subscriptions/{sub['id']}/poll", params=params, headers=headers)
    problem = assert_problem(r, 400)
    assert words in problem["detail"], problem
    if "wait" not in params:  # the same checks before an event stream starts
        r = lp.get(f"/v1/subscriptions/{sub['id']}/events", params=params, headers=headers)
        assert_problem(r, 400)


def test_a_repeated_query_parameter_is_400(lp: Longpoll) -> None:
    sub = lp.open(f"topic/{unique()}")
    r = lp.get(f"/v1/subscriptions/{sub['id']}/poll?wait=1&wait=2")
    assert "more than once" in assert_problem(r, 400)["detail"]


@pytest.mark.parametrize(
    ("path", "payload", "status"),
    [
        ("/v1/ack", {"receipts": []}, 400),
        ("/v1/ack", {"receipts": "r"}, 400),
        ("/v1/ack", {"receipts": ["garbage"]}, 404),
        ("/v1/ack", {"receipts": ["queue/nothing-here|1|1"]}, 404),
        ("/v1/nack", {"receipts": ["queue/x|1|1"], "requeue": "yes"}, 400),
        ("/v1/queue/x/messages", {"body": 5}, 400),
        ("/v1/queue/x/messages", {"body": "x", "priority": 10}, 400),
        ("/v1/queue/x/messages", {"body": "x", "encoding": "base64"}, 400),
        ("/v1/nowhere/x/messages", {"body": "x"}, 400),
        ("/v1/topic/a.*/messages", {"body": "x"}, 400),
    ],
)
def test_bad_settles_and_publishes(lp: Longpoll, path: str, payload: object, status: int) -> None:
    assert_problem(lp.post(path, json=payload), status)


def test_unknown_routes_and_methods_are_problems(lp: Longpoll) -> None:
    assert "/v1/" in assert_problem(lp.get("/v2/anything"), 404)["detail"]
    r = lp.request("PUT", "/v1/subscriptions")
    assert_problem(r, 405)
    assert "POST" in r.headers["Allow"]


def test_a_body_too_large_is_413(lp: Longpoll) -> None:
    r = lp.post(
        "/v1/queue/x/messages",
        data=b'{"body": "' + b"x" * (17 * 1024 * 1024) + b'"}',
        headers={"Content-Type": "application/json"},
    )
    assert_problem(r, 413)


def test_the_service_still_answers(lp: Longpoll) -> None:
    assert lp.get("/healthz").json() == {"status": "ok"}
    assert lp.get("/readyz").status_code == 200
    sub = lp.open(f"queue/{unique()}")
    assert lp.poll(sub["id"]) == {"cursor": "0", "messages": []}
    assert requests.get(lp.base + "/metrics", timeout=10).status_code == 200
