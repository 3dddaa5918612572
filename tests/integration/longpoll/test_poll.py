"""Long polls: answered as soon as a message arrives, empty at the deadline; queue leases
that expire come back, and receipts settle from any connection."""

from __future__ import annotations

import email.utils
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from ...procs import PolymqProcess
from .conftest import Longpoll, bodies, metric, unique


def _kinds() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"queue/{unique()}", {}),
        (f"topic/{unique()}", {}),
        (f"stream/{unique()}", {"offset": "next"}),
    ]


def _publish_later(lp: Longpoll, destination: str, body: str, delay: float) -> threading.Thread:
    other = lp.fresh()
    thread = threading.Thread(target=lambda: (time.sleep(delay), other.publish(destination, body)))
    thread.start()
    return thread


@pytest.mark.parametrize("kind", ["queue", "topic", "stream"])
def test_a_long_poll_answers_as_soon_as_a_message_arrives(lp: Longpoll, kind: str) -> None:
    dest = f"{kind}/{unique()}"
    sub = lp.open(dest, **({"offset": "next"} if kind == "stream" else {}))
    publisher = _publish_later(lp, dest, "hello", 0.5)
    start = time.monotonic()
    answer = lp.poll(sub["id"], sub["cursor"], wait=20)
    took = time.monotonic() - start
    publisher.join()
    assert bodies(answer["messages"]) == ["hello"]
    assert 0.4 < took < 5.0, f"answered after {took:.2f}s (waits up to 20s; published at 0.5s)"
    message = answer["messages"][0]
    assert message["destination"] == dest
    assert message["encoding"] == "utf8"
    assert message["content_type"].startswith("text/plain")
    assert ("receipt" in message) is (kind == "queue")
    assert message["cursor"] == answer["cursor"]


@pytest.mark.parametrize("kind", ["queue", "topic", "stream"])
def test_a_long_poll_answers_empty_at_its_deadline(lp: Longpoll, kind: str) -> None:
    dest = f"{kind}/{unique()}"
    sub = lp.open(dest)
    start = time.monotonic()
    answer = lp.poll(sub["id"], sub["cursor"], wait=1.5)
    took = time.monotonic() - start
    assert answer == {"cursor": sub["cursor"], "messages": []}
    assert 1.4 < took < 4.0, f"an empty poll with wait=1.5 answered after {took:.2f}s"
    # wait=0 (the default) answers at once
    start = time.monotonic()
    assert lp.poll(sub["id"], sub["cursor"])["messages"] == []
    assert time.monotonic() - start < 1.0


def test_open_polls_and_their_latency_are_measured(lp: Longpoll, server: PolymqProcess) -> None:
    dest = f"topic/{unique()}"
    subs = [lp.open(dest) for _ in range(3)]
    before = lp.get("/metrics").text
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda s=s: results.append(lp.fresh().poll(s["id"], wait=10)))
        for s in subs
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while metric(lp.get("/metrics").text, "polymq_longpoll_polls_open") < 3:
        assert time.monotonic() < deadline, "three waiting polls never showed as open"
        time.sleep(0.05)
    lp.publish(dest, "wake")
    for t in threads:
        t.join(15)
    assert [bodies(r["messages"]) for r in results] == [["wake"]] * 3
    after = lp.get("/metrics").text
    assert metric(after, "polymq_longpoll_polls_open") == 0
    count = "polymq_longpoll_poll_duration_seconds_count"
    assert metric(after, count, outcome="messages") - metric(before, count, outcome="messages") == 3
    assert metric(after, "polymq_longpoll_messages_total", operation="poll") >= 3


def test_several_messages_come_in_order_up_to_max(lp: Longpoll) -> None:
    dest = f"stream/{unique()}"
    sub = lp.open(dest, offset="first")
    for i in range(7):
        lp.publish(dest, f"m{i}")
    first = lp.poll(sub["id"], sub["cursor"], max=3)
    assert bodies(first["messages"]) == ["m0", "m1", "m2"]
    rest = lp.poll(sub["id"], first["cursor"], max=100)
    assert bodies(rest["messages"]) == ["m3", "m4", "m5", "m6"]
    # each message's cursor resumes right after it
    again = lp.poll(sub["id"], first["messages"][1]["cursor"], max=2)
    assert bodies(again["messages"]) == ["m2", "m3"]
    # the subscription's prefetch is the default max
    small = lp.open(dest, offset="first", prefetch=2)
    assert bodies(lp.poll(small["id"], small["cursor"])["messages"]) == ["m0", "m1"]


def test_queue_leases_expire_and_are_delivered_again(lp: Longpoll) -> None:
    dest = f"queue/{unique()}"
    sub = lp.open(dest, visibility=1)
    assert sub["visibility"] == 1
    lp.publish(dest, "lease me")
    first = lp.poll(sub["id"], wait=5)["messages"]
    assert bodies(first) == ["lease me"]
    assert first[0]["delivery_count"] == 1 and first[0]["redelivered"] is False
    # leased: nobody sees it until the lease is over
    assert lp.poll(sub["id"], wait=0.3)["messages"] == []
    start = time.monotonic()
    again = lp.poll(sub["id"], wait=10)["messages"]
    took = time.monotonic() - start
    assert bodies(again) == ["lease me"], "an unacked lease did not come back"
    assert again[0]["redelivered"] is True and again[0]["delivery_count"] == 2
    assert again[0]["receipt"] != first[0]["receipt"]
    assert took < 5.0
    # the old receipt settles nothing now (404: every receipt unknown); the new one does
    r = lp.post("/v1/ack", json={"receipts": [first[0]["receipt"]]})
    assert r.status_code == 404 and "expired" in r.json()["detail"], r.text
    assert lp.settle("ack", again[0]["receipt"]) == {"settled": 1, "missing": []}
    assert lp.poll(sub["id"], wait=2)["messages"] == []


def test_a_receipt_is_acked_from_another_connection(lp: Longpoll, server: PolymqProcess) -> None:
    dest = f"queue/{unique()}"
    sub = lp.open(dest, visibility=2)
    for i in range(3):
        lp.publish(dest, f"job {i}")
    got = lp.poll(sub["id"], wait=5, max=10)["messages"]
    assert bodies(got) == ["job 0", "job 1", "job 2"]
    # another client, its own connection, nothing shared but the receipts
    other = lp.fresh()
    assert other.settle("ack", got[0]["receipt"], got[2]["receipt"]) == {
        "settled": 2,
        "missing": [],
    }
    # the one not acked comes back after its lease; the acked ones never do
    back = lp.poll(sub["id"], wait=10, max=10)["messages"]
    assert bodies(back) == ["job 1"]
    other.settle("ack", back[0]["receipt"])
    assert lp.poll(sub["id"], wait=3)["messages"] == []
    stats = requests.get(f"{server.url('http')}/v1/{dest}", timeout=10).json()
    assert stats["messages"] == 0 and stats["in_flight"] == 0, stats


def test_nack_requeues_at_once_and_reject_drops(lp: Longpoll) -> None:
    dest = f"queue/{unique()}"
    sub = lp.open(dest, visibility=60)
    lp.publish(dest, "again")
    got = lp.poll(sub["id"], wait=5)["messages"]
    assert lp.settle("nack", got[0]["receipt"])["settled"] == 1
    back = lp.poll(sub["id"], wait=5)["messages"]  # long before its 60 s lease is over
    assert bodies(back) == ["again"] and back[0]["redelivered"] is True
    r = lp.post("/v1/nack", json={"receipts": [back[0]["receipt"]], "requeue": False})
    assert r.status_code == 200 and r.json()["settled"] == 1
    assert lp.poll(sub["id"], wait=1.5)["messages"] == []


def test_auto_ack_settles_what_it_answers(lp: Longpoll) -> None:
    dest = f"queue/{unique()}"
    sub = lp.open(dest, visibility=1, ack="auto")
    lp.publish(dest, "once")
    got = lp.poll(sub["id"], wait=5)["messages"]
    assert bodies(got) == ["once"]
    time.sleep(1.5)  # past the lease: an unacked message would be back
    assert lp.poll(sub["id"], wait=1.5)["messages"] == []


def test_an_idle_subscription_is_removed_and_its_leases_go_to_others(lp: Longpoll) -> None:
    dest = f"queue/{unique()}"
    idle = lp.open(dest, ttl=1, visibility=2)
    lp.publish(dest, "orphan")
    assert bodies(lp.poll(idle["id"], wait=5)["messages"]) == ["orphan"]
    other = lp.open(dest)
    # the idle subscriber never acks: the message goes to the other once its lease is over
    got = lp.poll(other["id"], wait=10)["messages"]
    assert bodies(got) == ["orphan"] and got[0]["redelivered"] is True
    time.sleep(2.5)  # past the ttl without a poll
    r = lp.get(f"/v1/subscriptions/{idle['id']}/poll")
    assert r.status_code == 404, r.text
    assert "ttl" in r.json()["detail"]


def test_a_wait_longer_than_the_ttl_keeps_the_subscription(lp: Longpoll) -> None:
    """The core renews a subscription when a poll starts: a wait longer than the ttl is
    served as several shorter ones, so the waiting client does not lose it."""
    dest = f"topic/{unique()}"
    sub = lp.open(dest, ttl=1)
    start = time.monotonic()
    assert lp.poll(sub["id"], sub["cursor"], wait=3.5)["messages"] == []
    assert time.monotonic() - start > 3.3
    publisher = _publish_later(lp, dest, "still here", 2.5)
    assert bodies(lp.poll(sub["id"], sub["cursor"], wait=8)["messages"]) == ["still here"]
    publisher.join()


def test_delete_closes_the_subscription(lp: Longpoll) -> None:
    sub = lp.open(f"topic/{unique()}")
    assert lp.delete(f"/v1/subscriptions/{sub['id']}").status_code == 204
    assert lp.get(f"/v1/subscriptions/{sub['id']}/poll").status_code == 404
    assert lp.delete(f"/v1/subscriptions/{sub['id']}").status_code == 404


def test_publish_takes_the_http_frontends_body(lp: Longpoll) -> None:
    dest = f"stream/{unique()}"
    sub = lp.open(dest, offset="first")
    r = lp.post(
        f"/v1/{dest}/messages",
        json={
            "messages": [
                {"body": "/wA=", "encoding": "base64", "headers": {"k": "v"}, "priority": 7},
                {"body": "text", "content_type": "text/x-demo", "correlation_id": "c1"},
            ]
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 2 and len(r.json()["seqs"]) == 2
    got = lp.poll(sub["id"], sub["cursor"])["messages"]
    assert [(m["body"], m["encoding"]) for m in got] == [("/wA=", "base64"), ("text", "utf8")]
    assert got[0]["headers"] == {"k": "v"} and got[0]["priority"] == 7
    assert got[1]["content_type"] == "text/x-demo" and got[1]["correlation_id"] == "c1"
    assert [m["seq"] for m in got] == r.json()["seqs"]


def _exchange(sock: socket.socket, request: bytes, *, head_only: bool = False) -> HttpAnswer:
    """Send ``request`` and read one whole answer (framed by Content-Length)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before an answer's head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = 0 if head_only else int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection ended inside the body"
        body += chunk
    assert len(body) == length, "more bytes than the answer's Content-Length"
    return HttpAnswer(status, headers, body)


@dataclass
class HttpAnswer:
    status: str
    headers: dict[str, str]
    body: bytes


def test_a_poll_answer_is_a_whole_http_answer_on_a_kept_connection(lp: Longpoll) -> None:
    dest = f"stream/{unique()}"
    for body in ("one", "two \u00e9"):
        lp.publish(dest, body)
    sub = lp.open(dest, offset="first")
    expected = lp.poll(sub["id"], sub["cursor"])
    assert bodies(expected["messages"]) == ["one", "two \u00e9"]
    url = urllib.parse.urlsplit(lp.base)
    path = f"/v1/subscriptions/{sub['id']}/poll?cursor={sub['cursor']}"
    get = f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nOrigin: http://localhost:3000\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        answers = [_exchange(sock, f"{get}\r\n".encode()) for _ in range(2)]  # kept alive
        closing = _exchange(sock, f"{get}Connection: close\r\n\r\n".encode())
        assert sock.recv(1) == b"", "the connection was not closed after Connection: close"
    for a in [*answers, closing]:
        assert a.status == "HTTP/1.1 200 OK"
        assert json.loads(a.body) == expected
        assert a.headers["content-type"] == "application/json; charset=utf-8"
        assert a.headers["access-control-allow-origin"] == "*"
        assert a.headers["server"].startswith("Python/") and "aiohttp" in a.headers["server"]
        assert email.utils.parsedate_to_datetime(a.headers["date"]).tzinfo is not None
    assert all("connection" not in a.headers for a in answers)
    assert closing.headers["connection"] == "close"
    # HTTP/1.0 and HEAD take aiohttp's own path: the same headers, the same body (or none)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        old = _exchange(sock, f"GET {path} HTTP/1.0\r\nOrigin: http://a.example\r\n\r\n".encode())
    assert old.status == "HTTP/1.0 200 OK" and json.loads(old.body) == expected
    assert set(old.headers) - {"connection"} == set(closing.headers) - {"connection"}
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        head = _exchange(sock, f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), head_only=True)
    assert head.status == "HTTP/1.1 200 OK" and head.body == b""
    assert head.headers["content-type"] == "application/json; charset=utf-8"
