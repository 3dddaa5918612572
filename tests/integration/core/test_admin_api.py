"""The operator's HTTP API on the core's admin port (docs/admin-api.md), against a real
``polymq run`` with real clients: every frontend's connections listed and closed, peek,
publish, purge, delete, filters and sorts of the destinations."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pika
import pika.exceptions
import pytest
import requests
import stomp

from polymq import Client

from ...procs import PolymqProcess, serving
from ..webapi import assert_problem
from .helpers import bodies, collect, connect, eventually, uid


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    with serving("run", tmp_path_factory.mktemp("admin-api")) as proc:
        yield proc


def api(run: PolymqProcess, method: str, path: str, **kw: Any) -> requests.Response:
    kw.setdefault("timeout", 30)
    return requests.request(method, run.url("admin") + path, **kw)


def listed(run: PolymqProcess) -> list[dict[str, Any]]:
    r = api(run, "GET", "/api/connections")
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["connections"]
    return rows


def by_user(rows: list[dict[str, Any]], user: str) -> dict[str, Any]:
    found = [c for c in rows if c.get("user") == user]
    assert len(found) == 1, rows
    return found[0]


class _Errors(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.errors: list[Any] = []
        self.got = threading.Event()

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)
        self.got.set()


def test_the_index_names_every_route(run: PolymqProcess) -> None:
    links = api(run, "GET", "/api/").json()["links"]
    for name in ("overview", "nodes", "connections", "destinations", "messages", "contents"):
        assert links[name].startswith("/api/")
    doc = api(run, "GET", "/api/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert "/api/destinations/{kind}/{name}/messages" in doc["paths"]
    nodes = api(run, "GET", "/api/nodes").json()
    assert nodes["nodes"][0]["self"] and nodes["node_id"] == nodes["nodes"][0]["id"]


async def test_every_frontends_connections_are_listed(run: PolymqProcess) -> None:
    ports = run.ports
    stomp_conn = stomp.Connection([("127.0.0.1", ports["stomp"])])
    await asyncio.to_thread(stomp_conn.connect, "stomp-user", "pw", wait=True)
    stomp_port = stomp_conn.transport.socket.getsockname()[1]
    amqp = await asyncio.to_thread(
        pika.BlockingConnection,
        pika.ConnectionParameters(
            "127.0.0.1", ports["amqp"], credentials=pika.PlainCredentials("amqp-user", "pw")
        ),
    )
    native = await Client.connect("127.0.0.1", ports["core"], user="native-user", password="x")
    native_port = native._transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
    http = requests.Session()
    http.auth = ("http-user", "pw")
    lp = requests.Session()
    lp.auth = ("longpoll-user", "pw")
    async with aiohttp.ClientSession() as web:
        ws = await web.ws_connect(
            f"http://127.0.0.1:{ports['stomp_ws']}/ws", protocols=["v12.stomp"]
        )
        await ws.send_str("CONNECT\naccept-version:1.2\nhost:/\nlogin:ws-user\npasscode:x\n\n\x00")
        assert (await ws.receive(timeout=10)).data.startswith("CONNECTED")
        try:
            q = uid("conn")
            r = await asyncio.to_thread(
                http.post, f"{run.url('http')}/v1/queue/{q}/messages", json={"body": "x"}
            )
            assert r.status_code in (200, 201), r.text
            sub = (
                await asyncio.to_thread(
                    lp.post,
                    f"{run.url('longpoll')}/v1/subscriptions",
                    json={"destination": f"topic/{q}"},
                )
            ).json()
            waiting = asyncio.ensure_future(
                asyncio.to_thread(
                    lp.get,
                    f"{run.url('longpoll')}/v1/subscriptions/{sub['id']}/poll",
                    params={"wait": "8"},
                    timeout=30,
                )
            )
            await asyncio.sleep(0.5)  # the poll is held
            rows = await asyncio.to_thread(listed, run)
            assert not waiting.done()
            s = by_user(rows, "stomp-user")
            assert (s["protocol"], s["peer"], s["vhost"]) == (
                "stomp",
                f"127.0.0.1:{stomp_port}",
                "/",
            )
            assert by_user(rows, "ws-user")["protocol"] == "stomp-ws"
            a = by_user(rows, "amqp-user")
            assert a["protocol"] == "amqp" and a["vhost"] == "/" and a["channels"] == 0
            n = by_user(rows, "native-user")
            assert (n["protocol"], n["peer"]) == ("native", f"127.0.0.1:{native_port}")
            h = by_user(rows, "http-user")
            assert h["protocol"] == "http" and h["messages_in"] >= 1  # a keep-alive connection
            w = by_user(rows, "longpoll-user")
            assert w["protocol"] == "longpoll" and w["peer"].startswith("127.0.0.1:")
            for row in (s, a, n, h, w):
                assert row["id"].startswith(row["frontend"] + ".")
                assert row["connected_at"] > time.time() - 60
            # one connection by its id
            one = api(run, "GET", f"/api/connections/{a['id']}")
            assert one.status_code == 200 and one.json()["user"] == "amqp-user"
            assert_problem(api(run, "GET", "/api/connections/nobody.1"), 404)
            assert_problem(api(run, "DELETE", "/api/connections/nobody.1"), 404)
            await waiting
        finally:
            await ws.close()
            await native.close()
            await asyncio.to_thread(amqp.close)
            await asyncio.to_thread(stomp_conn.disconnect)
    # gone from the list once closed (as soon as each frontend saw its socket end)
    users = ("stomp-user", "ws-user", "amqp-user", "native-user")

    async def gone() -> bool:
        rows = await asyncio.to_thread(listed, run)
        return not [c for c in rows if c.get("user") in users]

    await eventually(gone, within=10)


def test_the_counters_follow_what_a_connection_sends_and_gets(run: PolymqProcess) -> None:
    q = uid("count")
    conn = stomp.Connection([("127.0.0.1", run.ports["stomp"])])
    conn.connect("counted", "pw", wait=True)
    try:
        conn.subscribe(f"/queue/{q}", id="1", ack="auto")
        for i in range(3):
            conn.send(f"/queue/{q}", f"m{i}")

        def row() -> dict[str, Any]:
            return by_user(listed(run), "counted")

        deadline = time.monotonic() + 10
        while (r := row())["messages_out"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (r["messages_in"], r["messages_out"], r["subscriptions"]) == (3, 3, 1)
    finally:
        conn.disconnect()


def test_delete_closes_a_stomp_connection_with_an_error_frame(run: PolymqProcess) -> None:
    conn = stomp.Connection([("127.0.0.1", run.ports["stomp"])])
    errors = _Errors()
    conn.set_listener("errors", errors)
    conn.connect("to-close", "pw", wait=True)
    conn_id = by_user(listed(run), "to-close")["id"]
    r = api(run, "DELETE", f"/api/connections/{conn_id}")
    assert r.status_code == 204, r.text
    assert errors.got.wait(10)
    assert errors.errors[0].headers["message"] == "connection closed"
    assert "closed by an administrator" in errors.errors[0].body
    deadline = time.monotonic() + 10
    while conn.is_connected() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not conn.is_connected()
    deadline = time.monotonic() + 10
    while [c for c in listed(run) if c.get("user") == "to-close"]:
        assert time.monotonic() < deadline, "still listed 10 s after it was closed"
        time.sleep(0.1)


def test_delete_closes_an_amqp_connection_with_reply_code_320(run: PolymqProcess) -> None:
    params = pika.ConnectionParameters(
        "127.0.0.1", run.ports["amqp"], credentials=pika.PlainCredentials("amqp-closed", "pw")
    )
    conn = pika.BlockingConnection(params)
    conn.channel()
    conn_id = by_user(listed(run), "amqp-closed")["id"]
    assert api(run, "DELETE", f"/api/connections/{conn_id}").status_code == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        for _ in range(100):
            conn.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320
    assert "closed by an administrator" in info.value.reply_text


async def test_delete_closes_a_native_client_with_a_goodbye(run: PolymqProcess) -> None:
    client = await connect(run.ports["core"], user="native-closed", password="x")
    rows = await asyncio.to_thread(listed, run)
    conn_id = by_user(rows, "native-closed")["id"]
    r = await asyncio.to_thread(api, run, "DELETE", f"/api/connections/{conn_id}")
    assert r.status_code == 204
    for _ in range(100):
        if client.closed:
            break
        await asyncio.sleep(0.05)
    assert client.closed and "closed by an administrator" in str(client.close_reason)


async def test_peek_shows_a_queues_messages_in_order_without_taking_them(
    run: PolymqProcess,
) -> None:
    q = f"queue/{uid('peek')}"
    async with await connect(run.ports["core"]) as c:
        for body, priority in ((b"low-1", 1), (b"high-1", 8), (b"mid", 4), (b"high-2", 8)):
            await c.publish(q, body, priority=priority)
        await c.publish(q, b"\xff\x00binary", priority=0)
        r = await asyncio.to_thread(api, run, "GET", f"/api/destinations/{q}/messages")
        assert r.status_code == 200, r.text
        shown = r.json()["messages"]
        assert [m.get("body") for m in shown] == ["high-1", "high-2", "mid", "low-1", None]
        assert shown[-1]["body_base64"] == "/wBiaW5hcnk="
        assert [m["priority"] for m in shown] == [8, 8, 4, 1, 0]
        assert not any(m["redelivered"] for m in shown)
        two = await asyncio.to_thread(api, run, "GET", f"/api/destinations/{q}/messages?count=2")
        assert [m["body"] for m in two.json()["messages"]] == ["high-1", "high-2"]
        # still all there, and a consumer gets them in the order shown
        stats = await c.stats(q)
        assert stats.messages == 5 and stats.in_flight == 0 and stats.delivered == 0
        sub = await c.subscribe(q, ack_mode="client-individual", prefetch=10)
        got = await collect(sub, 5)
        assert bodies(got) == [b"high-1", b"high-2", b"mid", b"low-1", b"\xff\x00binary"]
        assert [d.message.id for d in got] == [m["id"] for m in shown]
        assert not any(d.message.redelivered for d in got)
        for d in got:
            d.ack()


def declare(run: PolymqProcess, destination: str) -> None:
    """Declared, a queue stays when it is empty (one a publish made goes when emptied)."""

    async def go() -> None:
        async with await connect(run.ports["core"]) as c:
            await c.declare(destination, durable=True)

    asyncio.run(go())


def test_publish_then_peek_purge_and_delete(run: PolymqProcess) -> None:
    name = uid("pub")
    path = f"/api/destinations/queue/{name}"
    declare(run, f"queue/{name}")
    r = api(run, "POST", f"{path}/messages", json={"body": "one", "headers": {"k": "v"}})
    assert r.status_code == 201 and r.json()["seq"] == 1 and r.json()["id"]
    r = api(run, "POST", f"{path}/messages", json={"body_base64": "AAEC", "priority": 9})
    assert r.status_code == 201 and r.json()["seq"] == 2
    shown = api(run, "GET", f"{path}/messages").json()["messages"]
    assert [m.get("body") or m.get("body_base64") for m in shown] == ["AAEC", "one"]
    assert shown[1]["headers"] == {"k": "v"}
    assert shown[1]["content_type"] == "text/plain; charset=utf-8"
    assert shown[0]["content_type"] == "application/octet-stream"
    one = api(run, "GET", path).json()
    assert (one["kind"], one["name"], one["ready"], one["unacked"]) == ("queue", name, 2, 0)
    assert api(run, "DELETE", f"{path}/contents").json() == {"purged": 2}
    assert api(run, "GET", f"{path}/messages").json() == {"messages": []}
    assert api(run, "DELETE", path).status_code == 204
    assert_problem(api(run, "GET", path), 404)
    assert_problem(api(run, "DELETE", path), 404)
    assert_problem(api(run, "GET", f"{path}/messages"), 404)
    # what the API refuses
    refused: list[Any] = [{}, {"body": "x", "body_base64": "eA=="}, {"body": 1}, [1]]
    refused += [{"body": "x", "priority": 10}, {"body_base64": "%%%"}, {"body": "x", "extra": 1}]
    for bad in refused:
        assert_problem(api(run, "POST", f"{path}/messages", json=bad), 400)
    json_type = {"Content-Type": "application/json"}
    assert_problem(api(run, "POST", f"{path}/messages", data=b"{not json", headers=json_type), 400)
    assert_problem(api(run, "POST", f"{path}/messages", data=b"{not json"), 415)  # (no type)
    assert_problem(api(run, "GET", f"/api/destinations/topic/{name}/messages"), 409)
    assert_problem(api(run, "GET", f"{path}/messages?count=101"), 400)
    assert_problem(api(run, "GET", "/api/destinations/queue/bad%20name"), 400)
    assert_problem(api(run, "DELETE", f"/api/destinations/topic/{name}"), 409)


def test_a_streams_last_entries_are_peeked(run: PolymqProcess) -> None:
    path = f"/api/destinations/stream/{uid('s')}"
    for i in range(5):
        assert api(run, "POST", f"{path}/messages", json={"body": f"e{i}"}).status_code == 201
    shown = api(run, "GET", f"{path}/messages?count=2").json()["messages"]
    assert [(m["seq"], m["body"]) for m in shown] == [(4, "e3"), (5, "e4")]


def test_a_channel_is_its_two_inboxes(run: PolymqProcess) -> None:
    path = f"/api/destinations/channel/{uid('ch')}"
    assert api(run, "POST", f"{path}/messages", json={"body": "to the server"}).status_code == 201
    one = api(run, "GET", path).json()
    assert (one["kind"], one["ready"]) == ("channel", 1)
    assert (one["server"]["ready"], one["client"]["ready"]) == (1, 0)
    shown = api(run, "GET", f"{path}/messages").json()["messages"]  # the server's inbox
    assert [m["body"] for m in shown] == ["to the server"]


def test_destinations_filter_sort_and_limit(run: PolymqProcess) -> None:
    tag = uid("f")
    for name, n in ((f"{tag}-a", 3), (f"{tag}-b", 1), (f"{tag}-c", 2)):
        for i in range(n):
            api(run, "POST", f"/api/destinations/queue/{name}/messages", json={"body": str(i)})
    api(run, "POST", f"/api/destinations/stream/{tag}-s/messages", json={"body": "s"})

    def names(**query: str) -> list[str]:
        r = api(run, "GET", "/api/destinations", params={"q": tag, **query})
        assert r.status_code == 200, r.text
        return [d["name"] for d in r.json()["destinations"]]

    assert names() == [f"{tag}-a", f"{tag}-b", f"{tag}-c", f"{tag}-s"]
    assert names(kind="queue", sort="-ready") == [f"{tag}-a", f"{tag}-c", f"{tag}-b"]
    assert names(kind="queue", sort="ready") == [f"{tag}-b", f"{tag}-c", f"{tag}-a"]
    assert names(kind="stream") == [f"{tag}-s"]
    assert names(sort="-name", limit="2") == [f"{tag}-s", f"{tag}-c"]
    row = api(run, "GET", "/api/destinations", params={"q": f"{tag}-a"}).json()["destinations"]
    assert row[0]["destination"] == f"queue/{tag}-a" and row[0]["publish_rate"] >= 0
    for bad in ({"kind": "exchange"}, {"sort": "size"}, {"limit": "0"}, {"limit": "x"}):
        assert_problem(api(run, "GET", "/api/destinations", params=bad), 400)


def test_the_publish_rate_is_measured(run: PolymqProcess) -> None:
    name = uid("rate")
    path = f"/api/destinations/queue/{name}"
    api(run, "POST", f"{path}/messages", json={"body": "first"})
    deadline = time.monotonic() + 30
    rate = 0.0
    while time.monotonic() < deadline:
        for _ in range(5):
            api(run, "POST", f"{path}/messages", json={"body": "x"})
        rate = api(run, "GET", path).json()["publish_rate"]
        if rate > 0:
            break
        time.sleep(0.5)
    assert rate > 0
