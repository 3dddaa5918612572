"""polymq_core.topics.mesh over a real two-node NATS cluster: a topic message published on one
node reaches the nodes whose patterns match it, once each and in order, and no other."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import nats
from nats.aio.client import Client as NatsClient

from polymq.types import Message
from polymq_core.topics.mesh import TopicMesh

from .test_natsd import nats_cluster


class Node:
    """A mesh and what it delivered locally."""

    def __init__(self, nc: NatsClient, node_id: str) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.mesh = TopicMesh(nc, node_id, self.deliver)

    def deliver(self, name: str, messages: list[Message], answer: bool) -> None:
        """The mesh's ``deliver_local``: nothing committed here, so nothing to answer."""
        self.got.extend((name, m.body) for m in messages)

    def bodies(self, prefix: bytes = b"") -> list[bytes]:
        return [b for _, b in self.got if b.startswith(prefix)]


async def until(pred: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            return  # the assertions that follow say what is missing
        await asyncio.sleep(0.05)


async def probe(a: Node, name: str, b: Node, within: float = 15.0) -> None:
    """Publish probes on ``name`` from ``a`` until ``b`` gets one: its interest reached
    ``a``'s server across the route."""
    deadline = time.monotonic() + within
    while not b.bodies(b"probe"):
        assert time.monotonic() < deadline, f"{b.mesh.node_id}'s interest never reached {name}"
        a.mesh.publish(name, [Message(body=b"probe")])
        await asyncio.sleep(0.1)


async def test_topic_messages_cross_nodes(tmp_path: Path) -> None:
    async with nats_cluster(tmp_path, n=2) as servers:
        # a's connection echoes: its own messages come back and are dropped by the header
        nc_a = await nats.connect(servers[0].client_url)
        nc_b = await nats.connect(servers[1].client_url, no_echo=True)
        nc_c = await nats.connect(servers[1].client_url, no_echo=True)
        a, b, c = Node(nc_a, "a"), Node(nc_b, "b"), Node(nc_c, "c")
        try:
            for n in (a, b, c):
                await n.mesh.start()
            a.mesh.interest("a.#", 1)  # a's own subscription: never fed by a's publishes
            b.mesh.interest("a.*.c", 1)
            b.mesh.interest("a.#", 1)  # overlaps a.*.c: still one copy
            c.mesh.interest("x.#", 1)
            await probe(a, "a.b.c", b)
            await probe(a, "x.y", c)
            for n in (a, b, c):
                n.got.clear()

            for i in range(200):
                a.mesh.publish("a.b.c", [Message(body=b"m%d" % i)])
            a.mesh.publish("a.b.c", [Message(body=b"batch1"), Message(body=b"batch2")])
            a.mesh.publish("x.y", [Message(body=b"for c")])
            a.mesh.publish("a.b.d", [Message(body=b"a.# only")])
            a.mesh.publish("q.r", [Message(body=b"nobody")])
            want = [b"m%d" % i for i in range(200)] + [b"batch1", b"batch2", b"a.# only"]
            await until(lambda: len(b.got) >= len(want) and bool(c.got))
            await asyncio.sleep(0.3)  # any duplicate or stray would have come by now
            assert b.bodies() == want  # all, once each, in order
            assert {n for n, _ in b.got} == {"a.b.c", "a.b.d"}
            assert c.got == [("x.y", b"for c")]
            assert a.got == []

            # interest gone: b's NATS subscriptions go, nothing more reaches it
            b.mesh.interest("a.*.c", -1)
            b.mesh.interest("a.#", -1)
            await asyncio.sleep(0.2)
            await nc_b.flush()
            b.got.clear()
            c.mesh.interest("a.#", 1)
            await probe(a, "a.b.c", c)  # c's interest arrived; b's removal came earlier
            a.mesh.publish("a.b.c", [Message(body=b"after")])
            await asyncio.sleep(0.5)
            assert b.got == []
            assert c.bodies(b"after") == [b"after"]
        finally:
            for n in (a, b, c):
                await n.mesh.stop()
            for nc in (nc_a, nc_b, nc_c):
                await nc.close()
