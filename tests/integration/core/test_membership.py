"""polymq_core.cluster.membership over a real three-node NATS cluster: each node sees the others,
a stopped node is "leaving", a silent one "unreachable" after three periods."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from polymq_core.cluster.membership import Membership

from .test_natsd import nats_cluster

PERIOD = 0.2


def sees(m: Membership, ids: set[str]) -> bool:
    return set(m.peers()) == ids


def is_state(m: Membership, node: str, state: str) -> bool:
    return bool(m.state_of(node) == state)


async def until(pred: Callable[[], bool], within: float = 10.0, what: str = "") -> float:
    """Wait until ``pred()``; the monotonic time it became true."""
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic()


@contextlib.asynccontextmanager
async def members(
    tmp_path: Path,
) -> AsyncIterator[tuple[list[Membership], list[NatsClient], list[list[dict[str, Any]]]]]:
    async with nats_cluster(tmp_path) as servers:
        ncs = [await nats.connect(s.client_url, no_echo=True) for s in servers]
        heard: list[list[dict[str, Any]]] = [[] for _ in servers]
        ms = []
        for i, s in enumerate(servers):
            node = s.config.server_name

            def describe(i: int = i, node: str = node) -> dict[str, Any]:
                return {
                    "addresses": {"core": f"127.0.0.{i + 1}:{7400 + i}", "v6": f"[::1]:{i + 1}"},
                    "admin_url": f"http://127.0.0.1:{7500 + i}",
                    "shards_led": [i],
                    "version": "0.1.0",
                    "started": 1_700_000_000.0 + i,
                    "applied": {0: 10 * i, 1: 5},
                }

            ms.append(
                Membership(ncs[i], node, describe, period=PERIOD, on_announce=heard[i].append)
            )
        try:
            for m in ms:
                await m.start()
            yield ms, ncs, heard
        finally:
            for m in ms:
                await m.stop()
            for nc in ncs:
                await nc.close()


async def test_membership(tmp_path: Path) -> None:
    async with members(tmp_path) as (ms, ncs, heard):
        ids = [m.node_id for m in ms]
        for m in ms:
            await until(partial(sees, m, set(ids)), what=f"{m.node_id} sees all")
            assert all(m.state_of(i) == "ready" for i in ids)
            assert m.state_of("nobody") == "unknown"
        m0 = ms[0]
        p2 = m0.peers()[ids[2]]
        assert p2.shards_led == (2,)
        assert p2.applied == {0: 20, 1: 5}
        assert p2.admin_url == "http://127.0.0.1:7502"
        assert p2.version == "0.1.0"
        assert p2.started == 1_700_000_002.0
        assert m0.address_of(ids[2]) == ("127.0.0.3", 7402)
        assert m0.address_of(ids[2], "v6") == ("::1", 3)
        assert m0.address_of(ids[2], "nope") is None
        assert m0.address_of("nobody") is None
        view = m0.describe()
        assert [d["id"] for d in view] == sorted(ids)
        mine = next(d for d in view if d["self"])
        assert mine["id"] == ids[0]
        assert sum(d["self"] for d in view) == 1
        for d in view:
            assert d["state"] == "ready"
            assert d["last_heard_seconds_ago"] < 3 * PERIOD
            assert set(d) >= {"id", "addresses", "admin_url", "state", "shards_led",
                              "last_heard_seconds_ago", "version", "started", "self"}  # fmt: skip
        # on_announce sees our own announcements (no echo from NATS) and the others'
        for i, h in enumerate(heard):
            assert {b["node_id"] for b in h} == set(ids)
            assert sum(b["node_id"] == ids[i] for b in h) >= 1

        # garbage on the subject is ignored
        await ncs[1].publish(Membership.SUBJECT, b"not json")
        await ncs[1].publish(Membership.SUBJECT, b'{"node_id": 3}')
        await ncs[1].publish(Membership.SUBJECT, b'{"node_id": "x", "shards_led": "a"}')
        await asyncio.sleep(3 * PERIOD)
        assert set(m0.peers()) == set(ids)

        # a node that stops says so
        await ms[2].stop()
        assert ms[2].state_of(ids[2]) == "leaving"
        for m in ms[:2]:
            await until(partial(is_state, m, ids[2], "leaving"), what="leaving")
        assert m0.peers()[ids[2]].shards_led == (2,)  # what it said before is kept
        await asyncio.sleep(4 * PERIOD)
        assert m0.state_of(ids[2]) == "leaving"  # not "unreachable": it said goodbye

        # a node that falls silent (its NATS connection gone, no goodbye) is unreachable
        await until(lambda: m0.state_of(ids[1]) == "ready", what="n1 ready")
        await ncs[1].close()
        silent = time.monotonic()
        seen = await until(lambda: m0.state_of(ids[1]) == "unreachable", what="unreachable")
        # heard last at most one period before it fell silent: unreachable 2-3 periods later
        assert seen - silent >= 2 * PERIOD - 0.05
        assert m0.state_of(ids[0]) == "ready"
        d1 = next(d for d in m0.describe() if d["id"] == ids[1])
        assert d1["state"] == "unreachable"
        # unreachable past 3 periods; shown rounded to the millisecond, so 0.6004 s is 0.6
        assert d1["last_heard_seconds_ago"] >= 3 * PERIOD


async def test_joining_state_is_announced(tmp_path: Path) -> None:
    async with nats_cluster(tmp_path, n=2) as servers:
        a = await nats.connect(servers[0].client_url, no_echo=True)
        b = await nats.connect(servers[1].client_url, no_echo=True)
        state = {"state": "joining"}
        ma = Membership(a, "a", lambda: dict(state), period=PERIOD)
        mb = Membership(b, "b", dict, period=PERIOD)
        try:
            assert ma.state_of("a") == "unknown"
            await ma.start()
            await mb.start()
            assert ma.state_of("a") == "joining"
            await until(lambda: mb.state_of("a") == "joining", what="b sees a joining")
            state["state"] = "ready"
            await ma.announce()
            assert ma.state_of("a") == "ready"
            await until(lambda: mb.state_of("a") == "ready", what="b sees a ready")
            await until(lambda: ma.state_of("b") == "ready", what="a sees b")
        finally:
            await ma.stop()
            await mb.stop()
            await ma.stop()  # idempotent
            await a.close()
            await b.close()
