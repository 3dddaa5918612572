"""The overview's sampler (polymq_core.admin.overview), without sockets: rates from the counters,
a ring of 10 minutes, and SSE readers that are bounded, dropped when they fall behind and
ended at shutdown."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from polymq_core.admin.overview import BACKLOG, WINDOW, Overview, Reader
from polymq_core.broker import Broker
from polymq_core.metrics import Sensors


def fake_broker() -> Any:
    sensors = Sensors(CollectorRegistry())
    monitor = SimpleNamespace(
        alarms=frozenset({"disk"}),
        detail={
            "memory": {"used": 10, "limit": 100, "rises_at": 90, "clears_at": 80},
            "disk": {"free": 5, "limit": 50},
        },
    )
    return SimpleNamespace(
        settings=SimpleNamespace(node="n1"),
        sensors=sensors,
        monitor=monitor,
        sessions=set(),
        started=0.0,
        depth=lambda kind: {"queue": 3, "channel": 2}.get(kind, 100),
        in_flight=lambda: 4,
    )


def test_a_sample_has_the_rates_since_the_last_and_the_ring_keeps_ten_minutes() -> None:
    broker = fake_broker()
    overview = Overview(cast(Broker, broker), interval=5.0)
    first = overview.sample()
    assert (first["publish"], first["ready"], first["unacked"]) == (0.0, 5, 4)
    broker.sensors.on_publish("stomp", "queue", 30)
    broker.sensors.on_publish("http", "topic", 10)
    broker.sensors.on_ack(7)
    second = overview.sample()
    assert second["publish"] > 0 and second["ack"] > 0 and second["deliver"] == 0
    assert second["publish"] / second["ack"] == pytest.approx(40 / 7, rel=1e-3)  # one span
    doc = overview.document()
    assert doc["rates"]["publish"] == second["publish"]
    assert doc["alarms"] == ["disk"]
    assert doc["memory"] == {
        "used_bytes": 10,
        "limit_bytes": 100,
        "rises_at_bytes": 90,
        "clears_at_bytes": 80,
    }
    assert doc["disk"] == {"free_bytes": 5, "limit_bytes": 50}
    for _ in range(200):
        overview.sample()
    history = overview.history()
    assert len(history["samples"]) == WINDOW / 5.0 == 120


def test_a_reader_that_falls_behind_is_dropped_and_its_connection_cut() -> None:
    cut: list[bool] = []
    reader = Reader(lambda: cut.append(True))
    for i in range(BACKLOG):
        assert reader.push(b"%d" % i)
    assert not cut
    assert not reader.push(b"one too many")
    assert cut == [True] and reader.dropped and reader.ended
    assert not reader.push(b"after")  # (and nothing more is kept)
    assert len(reader.pending) == BACKLOG


async def test_readers_get_every_sample_and_end_when_the_streams_end() -> None:
    overview = Overview(cast(Broker, fake_broker()), interval=5.0)
    overview.sample()
    reader = overview.open(lambda: None)
    got: list[bytes] = []

    async def read() -> None:
        async for event in reader.events():
            got.append(event)

    task = asyncio.create_task(read())
    overview.sample()
    await asyncio.sleep(0)
    assert len(got) == 2 and all(e.startswith(b"event: overview\ndata: {") for e in got)
    overview.end_streams()
    await asyncio.wait_for(task, 1)  # the generator returns: the handler closes the body
    assert not overview.readers


async def test_a_slow_reader_is_dropped_while_the_others_go_on() -> None:
    overview = Overview(cast(Broker, fake_broker()), interval=5.0)
    cut: list[str] = []
    slow = overview.open(lambda: cut.append("slow"))
    fast = overview.open(lambda: cut.append("fast"))
    for _ in range(BACKLOG + 1):
        overview.sample()
        fast.pending.clear()  # (read)
    assert cut == ["slow"] and overview.readers == {fast} and slow.dropped


async def test_connections_per_protocol_are_the_clients_of_the_listing_when_watched() -> None:
    asked: list[int] = []

    async def lister() -> dict[str, Any]:
        asked.append(1)
        return {
            "connections": [
                {"protocol": "stomp", "user": "alice", "subscriptions": 2},
                {"protocol": "native", "user": "polymq-internal", "subscriptions": 9},
                {"protocol": "stomp", "user": None, "subscriptions": 1},
                {"protocol": "amqp", "user": "bob", "subscriptions": 0},
            ],
            "frontends": [],
        }

    overview = Overview(cast(Broker, fake_broker()), interval=5.0, lister=lister)
    overview.sample()
    await asyncio.sleep(0)
    assert asked == []  # nobody watches: no listing
    assert overview.document()["connections"] == {}  # (the core's sessions: none here)
    overview.open(lambda: None)
    overview.sample()
    await asyncio.sleep(0)
    doc = overview.document()
    assert asked == [1]
    assert doc["connections"] == {"amqp": 1, "stomp": 2}
    assert doc["subscriptions"] == {"amqp": 0, "stomp": 3}
    overview.sample()
    await asyncio.sleep(0)
    assert asked == [1]  # at most every LISTING_EVERY seconds
    await overview.stop()
