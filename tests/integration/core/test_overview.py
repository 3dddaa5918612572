"""The overview routes of the admin API (docs/admin-api.md): ``/api/overview`` counts what a
client published, acked and holds unacked; ``/history`` keeps the samples; ``/stream`` pushes
each sample as an SSE ``overview`` event and ends cleanly when the node stops, without
holding the stop up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from polymq import Message
from polymq_core.admin.overview import LISTING_EVERY, STREAM_SAMPLES

from ...procs import PolymqProcess
from .helpers import collect, connect, eventually, uid

INTERVAL = 0.2  # seconds between samples (POLYMQ_OVERVIEW_INTERVAL) here


@pytest.fixture
def node(tmp_path: Path) -> Iterator[PolymqProcess]:
    env = {"POLYMQ_OVERVIEW_INTERVAL": str(INTERVAL)}
    with PolymqProcess("core", tmp_path / "core", env=env) as proc:
        yield proc


async def _get(admin: str, path: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(admin + path) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The ``overview`` events of an SSE response, parsed."""
    event, data = "", ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif not line and event:
            assert event == "overview", event
            yield json.loads(data)
            event, data = "", ""


async def test_the_overview_counts_what_clients_did(node: PolymqProcess) -> None:
    admin = node.url("admin")
    q = uid("overview")
    before = await _get(admin, "/api/overview")
    assert before["node"] and before["version"] and before["uptime_seconds"] >= 0
    assert before["memory"]["used_bytes"] > 0 and before["memory"]["limit_bytes"] > 0
    assert before["disk"]["free_bytes"] > before["disk"]["limit_bytes"] > 0
    assert before["alarms"] == []
    async with await connect(node.ports["core"]) as c:
        await c.publish(f"queue/{q}", [Message(body=b"%d" % i) for i in range(7)])
        doc = await _get(admin, "/api/overview")
        assert doc["messages"] == {"ready": 7, "unacked": 0}
        sub = await c.subscribe(f"queue/{q}", ack_mode="client-individual", prefetch=3)
        got = await collect(sub, 3)
        doc = await eventually(
            lambda: _ready(admin, {"ready": 4, "unacked": 3}), within=5, interval=0.1
        )
        # from the admin API's listing of the connections, as /api/connections has them
        listed = await _get(admin, "/api/connections")
        assert [
            c["subscriptions"] for c in listed["connections"] if c["user"] != "polymq-internal"
        ] == [1]
        doc = await eventually(
            lambda: _counted(admin, {"native": 1}, {"native": 1}), within=LISTING_EVERY + 5
        )
        await sub.ack_many([d.tag for d in got])

        async def rates_moved() -> dict[str, Any] | None:
            history = await _get(admin, "/api/overview/history")
            samples = history["samples"]
            seen = {k: sum(s[k] for s in samples) * INTERVAL for k in ("publish", "ack")}
            return history if seen["publish"] >= 6.5 and seen["ack"] >= 2.5 else None

        history = await eventually(rates_moved, within=5, interval=0.1)
    assert history["interval_seconds"] == INTERVAL
    times = [s["t"] for s in history["samples"]]
    assert times == sorted(times) and len(times) <= 600 / INTERVAL


async def _ready(admin: str, want: dict[str, int]) -> dict[str, Any] | None:
    doc = await _get(admin, "/api/overview")
    return doc if doc["messages"] == want else None


async def _counted(
    admin: str, connections: dict[str, int], subscriptions: dict[str, int]
) -> dict[str, Any] | None:
    doc = await _get(admin, "/api/overview")
    ok = doc["connections"] == connections and doc["subscriptions"] == subscriptions
    return doc if ok else None


async def test_the_stream_pushes_samples_and_ends_when_the_node_stops(
    node: PolymqProcess,
) -> None:
    admin = node.url("admin")
    q = uid("stream")
    timeout = aiohttp.ClientTimeout(total=None, sock_read=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.get(admin + "/api/overview/stream") as r,
    ):
        assert r.status == 200 and r.content_type == "text/event-stream"
        events = _events(r)
        first = await anext(events)
        assert {"t", "rates", "messages", "connections", "memory", "disk"} <= first.keys()
        async with await connect(node.ports["core"]) as c:
            await c.publish(f"queue/{q}", b"one")
            seen = first
            while seen["messages"]["ready"] != 1:
                seen = await anext(events)
                assert seen["t"] > first["t"]
        stopping = asyncio.create_task(asyncio.to_thread(node.stop))
        rest = [e async for e in events]  # ends: the chunked body was closed, not cut
        assert await stopping == 0, node.log()
    assert all(e["t"] >= seen["t"] for e in rest)


async def test_a_stream_ends_by_itself_after_its_samples_so_the_browser_logs_in_again(
    node: PolymqProcess,
) -> None:
    timeout = aiohttp.ClientTimeout(total=STREAM_SAMPLES * INTERVAL * 3, sock_read=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.get(node.url("admin") + "/api/overview/stream") as r,
    ):
        assert r.status == 200
        got = [e async for e in _events(r)]  # ends cleanly (else ClientPayloadError)
    assert STREAM_SAMPLES // 2 <= len(got) <= STREAM_SAMPLES + 2, len(got)
    assert node.alive  # (the node did not stop: the stream ended by itself)
