"""Publishing, pulling, acking and nacking over HTTP against ``polymq run``."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import aiohttp

from polymq import Client

from ...procs import PolymqProcess
from .conftest import Api, assert_problem, start_run, unique


def test_publish_pull_ack_then_gone(api: Api) -> None:
    q = unique()
    published = api.publish(f"queue/{q}", {"body": "hello", "headers": {"k": "v"}})
    assert published["count"] == 1 and len(published["ids"]) == 1 and published["seqs"] == [1]

    [msg] = api.pull(q, max=5)
    assert msg["body"] == "hello" and msg["encoding"] == "utf8"
    assert msg["id"] == published["ids"][0] and msg["seq"] == 1
    assert msg["destination"] == f"queue/{q}"
    assert msg["headers"] == {"k": "v"}
    assert msg["content_type"] == "text/plain; charset=utf-8"
    assert msg["delivery_count"] == 1 and msg["redelivered"] is False
    assert abs(msg["timestamp"] - time.time()) < 60

    assert api.ack(msg["receipt"]) == {"settled": 1, "missing": []}
    assert api.pull(q, max=5) == []
    stats = api.get(f"/v1/queue/{q}").json()
    assert stats["messages"] == 0 and stats["in_flight"] == 0
    # the receipt is spent: acking it again finds nothing
    assert_problem(api.post("/v1/ack", json={"receipts": [msg["receipt"]]}), 404)


def test_nack_requeues_and_nack_without_requeue_dead_letters(api: Api) -> None:
    q, dead = unique(), unique("dead")
    assert api.put(f"/v1/queue/{q}", json={"dead_letter": f"queue/{dead}"}).status_code == 200
    api.publish(f"queue/{q}", {"body": "again"})

    [first] = api.pull(q)
    r = api.post("/v1/nack", json={"receipts": [first["receipt"]]})
    assert r.status_code == 200 and r.json() == {"settled": 1, "missing": []}
    [second] = api.pull(q)
    assert second["id"] == first["id"]
    assert second["delivery_count"] == 2 and second["redelivered"] is True

    r = api.post("/v1/nack", json={"receipts": [second["receipt"]], "requeue": False})
    assert r.status_code == 200 and r.json()["settled"] == 1
    assert api.pull(q) == []
    [dl] = api.pull(dead)
    assert dl["body"] == "again" and dl["headers"]["x-death-reason"] == "rejected"
    assert dl["headers"]["x-original-destination"] == f"queue/{q}"


def test_visibility_timeout_makes_message_pullable_again(api: Api) -> None:
    q = unique()
    api.publish(f"queue/{q}", {"body": "lease"})
    [first] = api.pull(q, visibility=0.3)
    assert api.pull(q) == []  # leased: invisible
    [again] = api.pull(q, wait=5)
    assert again["id"] == first["id"]
    assert again["delivery_count"] == 2 and again["redelivered"] is True
    # the first lease expired: its receipt no longer settles anything
    r = api.post("/v1/ack", json={"receipts": [first["receipt"], again["receipt"]]})
    assert r.status_code == 200
    assert r.json() == {"settled": 1, "missing": [first["receipt"]]}


def test_batch_publish_and_pull_in_order(api: Api) -> None:
    q = unique()
    out = api.publish(f"queue/{q}", {"messages": [{"body": f"m{i}"} for i in range(5)]})
    assert out["count"] == 5 and out["seqs"] == [1, 2, 3, 4, 5] and len(set(out["ids"])) == 5
    msgs = api.pull(q, max=10)
    assert [m["body"] for m in msgs] == [f"m{i}" for i in range(5)]
    assert api.ack(*(m["receipt"] for m in msgs))["settled"] == 5


def test_priority_order(api: Api) -> None:
    q = unique()
    batch = [{"body": f"p{p}", "priority": p} for p in (1, 9, 5, 0, 9)]
    api.publish(f"queue/{q}", {"messages": batch})
    msgs = api.pull(q, max=10)
    assert [m["body"] for m in msgs] == ["p9", "p9", "p5", "p1", "p0"]
    assert [m["priority"] for m in msgs] == [9, 9, 5, 1, 0]


def test_binary_body_round_trips_as_base64(api: Api) -> None:
    q = unique()
    raw = bytes(range(256))
    api.publish(f"queue/{q}", {"body": base64.b64encode(raw).decode(), "encoding": "base64"})
    [msg] = api.pull(q)
    assert msg["encoding"] == "base64" and base64.b64decode(msg["body"]) == raw
    assert msg["content_type"] == "application/octet-stream"


def test_message_fields_are_carried(api: Api) -> None:
    q = unique()
    api.publish(
        f"queue/{q}",
        {
            "body": "{}",
            "content_type": "application/json",
            "correlation_id": "c-1",
            "reply_to": "queue/replies",
            "ttl": 60,
            "ack_timeout": 5,
        },
    )
    [msg] = api.pull(q)
    assert msg["content_type"] == "application/json"
    assert msg["correlation_id"] == "c-1" and msg["reply_to"] == "queue/replies"
    assert 0 < msg["expires"] - time.time() <= 60


def test_expired_message_is_not_delivered(api: Api) -> None:
    q = unique()
    api.publish(f"queue/{q}", {"body": "stale", "ttl": 0.2})
    time.sleep(0.4)
    assert api.pull(q) == []


async def test_long_poll_returns_early_when_a_message_arrives(server: PolymqProcess) -> None:
    base, q = server.url("http"), unique()
    async with aiohttp.ClientSession(base) as http:

        async def long_poll() -> tuple[float, dict[str, object]]:
            t0 = time.monotonic()
            async with http.post(f"/v1/queue/{q}/pull", params={"wait": "20"}) as r:
                assert r.status == 200
                return time.monotonic() - t0, await r.json()

        poll = asyncio.create_task(long_poll())
        await asyncio.sleep(0.5)
        assert not poll.done()
        async with http.post(f"/v1/queue/{q}/messages", json={"body": "wake"}) as r:
            assert r.status == 200
        elapsed, body = await asyncio.wait_for(poll, 10)
    assert 0.4 < elapsed < 5
    assert [m["body"] for m in body["messages"]] == ["wake"]  # type: ignore[union-attr]


async def test_long_poll_returns_empty_at_the_deadline(server: PolymqProcess) -> None:
    base, q = server.url("http"), unique()
    async with aiohttp.ClientSession(base) as http:
        t0 = time.monotonic()
        async with http.post(f"/v1/queue/{q}/pull", params={"wait": "1", "max": "3"}) as r:
            assert r.status == 200
            assert await r.json() == {"messages": []}
        elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 4


async def test_abandoned_long_poll_does_not_hide_messages(server: PolymqProcess) -> None:
    """A client that gives up on a long poll must not leave a message leased to nobody."""
    base, q = server.url("http"), unique()
    async with aiohttp.ClientSession(base) as http:
        with_timeout = aiohttp.ClientTimeout(total=0.5)
        try:
            await http.post(f"/v1/queue/{q}/pull", params={"wait": "3"}, timeout=with_timeout)
        except TimeoutError:
            pass
        await asyncio.sleep(0.3)  # the frontend notices the client left
        async with http.post(f"/v1/queue/{q}/messages", json={"body": "x"}) as r:
            assert r.status == 200
        t0 = time.monotonic()
        async with http.post(f"/v1/queue/{q}/pull", params={"wait": "10"}) as r:
            body = await r.json()
        assert [m["body"] for m in body["messages"]] == ["x"]
        assert time.monotonic() - t0 < 5  # not after a 30 s visibility timeout


def test_persistent_messages_survive_a_restart(tmp_path: Path) -> None:
    q = unique()
    proc = start_run(tmp_path / "node")
    try:
        api = Api(proc.url("http"))
        api.publish(f"queue/{q}", {"body": "kept", "persistent": True})
        api.publish(f"queue/{q}", {"body": "lost", "persistent": False})
        assert proc.stop() == 0, proc.log()
        proc = start_run(tmp_path / "node")
        api = Api(proc.url("http"))
        msgs = api.pull(q, max=10)
        assert [(m["body"], m["persistent"]) for m in msgs] == [("kept", True)]
    finally:
        proc.kill()


async def test_http_to_native_client_and_back(server: PolymqProcess) -> None:
    api, q = Api(server.url("http")), unique()
    async with await Client.connect("127.0.0.1", server.ports["core"]) as client:
        handle = client.queue(q)
        async with await handle.consume(ack_mode="client-individual") as sub:
            api.publish(f"queue/{q}", {"body": "from http", "priority": 7, "headers": {"a": "b"}})
            delivery = await sub.get(timeout=5)
            assert delivery.message.body == b"from http"
            assert delivery.message.priority == 7 and delivery.message.headers == {"a": "b"}
            # awaited: a fire-and-forget delivery.ack() right before unsubscribing is lost
            # (the client drops acks of a subscription it marked closed; reported)
            await sub.ack_many([delivery.tag])

        await handle.push(b"\xff\xfe native", correlation_id="n-1")
        [msg] = api.pull(q)
        assert msg["encoding"] == "base64"
        assert base64.b64decode(msg["body"]) == b"\xff\xfe native"
        assert msg["correlation_id"] == "n-1"
        api.ack(msg["receipt"])


async def test_topic_and_channel_publish_reach_native_subscribers(server: PolymqProcess) -> None:
    api, t, ch = Api(server.url("http")), unique(), unique()
    assert api.publish(f"topic/{t}", {"body": "nobody"}) == {"count": 1, "subscribers": 0}
    async with await Client.connect("127.0.0.1", server.ports["core"]) as client:
        async with await client.topic(t).subscribe() as sub:
            assert api.publish(f"topic/{t}", {"body": "news"}) == {"count": 1, "subscribers": 1}
            assert (await sub.get(timeout=5)).message.body == b"news"
        async with await client.channel(ch, "server").receive() as sub:
            api.publish(f"channel/{ch}", {"body": "request", "role": "client"})
            assert (await sub.get(timeout=5)).message.body == b"request"
    out = api.publish(f"stream/{unique()}", {"messages": [{"body": "a"}, {"body": "b"}]})
    assert out["count"] == 2 and out["seqs"] == [1, 2]
