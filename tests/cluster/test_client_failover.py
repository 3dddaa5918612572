"""The native client fails over by itself: given the addresses of a real three-node
cluster, it connects to the first that answers, and when the node it is connected to is
killed (``kill -9``) it goes on with another: a publisher awaiting persistent confirms and
a consumer acking what it gets, on that one client, see no error, and every confirmed
message is consumed (at least once). The application only learns of it through
``on_reconnect``. Measured: the client was connected again 0.002-0.005 s after the kill,
and every confirmed message consumed 4.5-8.1 s after it (a JetStream election); in about a
third of the runs the survivor first reached cancelled the subscription after 30 s (its
relay's resubscription raced the new leader's takeover: "subscription id already in
use") and the client failed over once more, to the third node, where it went on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from polymq import Client, Message, Reconnected

from ..procs import PolymqProcess
from .harness import Cluster, Node, free_ports, shard_of, unique

pytestmark = pytest.mark.timeout(240)

BEFORE = 20  # confirmed publishes before the kill
AFTER = 20  # confirmed publishes begun after the kill
WAIT = 60.0  # seconds for anything that takes a failover (a JetStream election is 4-9 s)


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


def core(node_port: int) -> str:
    return f"127.0.0.1:{node_port}"


def all_running(cluster: Cluster) -> dict[int, Node]:
    """Every node running again (a test before may have killed or frozen one); the
    leaders by shard once they formed."""
    for node in cluster.nodes:
        if node.state == "frozen":
            cluster.thaw(node)
        elif node.state != "running":
            cluster.restart(node)
    return cluster.wait_formed(timeout=90)


def led_elsewhere(leaders: dict[int, Node], kind: str, prefix: str) -> tuple[str, Node, Node]:
    """A fresh destination (``<kind>/<name>``), the node leading its shard, and another
    node (the victim), whose fault then needs no election for that destination."""
    name = f"{kind}/{unique(prefix)}"
    leader = leaders[shard_of(name)]
    victim = next(n for n in leader.cluster.nodes if n is not leader)
    return name, leader, victim


def test_a_dead_first_address_is_passed_over(cluster: Cluster) -> None:
    """Two addresses, the first a port nobody listens on: the client connects to the
    second, and it works."""
    [dead] = free_ports(1)
    node = cluster.nodes[0]
    q = f"queue/{unique('dead')}"

    async def run() -> None:
        async with await Client.connect([core(dead), core(node.ports["core"])]) as client:
            assert client.address is not None and client.address.port == node.ports["core"]
            await client.declare(q, durable=True)
            await client.publish(q, [Message(b"hello", persistent=True)])
            [lease] = await client.pull(q, wait=10)
            assert lease.message.body == b"hello"

    asyncio.run(run())


def test_a_frontend_given_every_core_passes_over_a_dead_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``polymq http --core DEAD,N1,N2,N3``: the frontend's core link connects to the
    first that answers, says so in /readyz, and a message goes through it."""
    [dead] = free_ports(1)
    given = ",".join([core(dead)] + [core(n.ports["core"]) for n in cluster.nodes])
    q = unique("front")
    with PolymqProcess("http", tmp_path, "--core", given) as http:
        ready = requests.get(f"{http.url()}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert ready.json()["core"] == core(cluster.nodes[0].ports["core"])
        r = requests.post(
            f"{http.url()}/v1/queue/{q}/messages",
            json={"body": "through the second", "persistent": True},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        r = requests.post(f"{http.url()}/v1/queue/{q}/pull", params={"wait": 10}, timeout=40)
        assert [m["body"] for m in r.json()["messages"]] == ["through the second"]


async def publish_and_consume_through(
    addresses: list[str], q: str, fault: Callable[[], None], events: list[Reconnected]
) -> tuple[list[str], set[str], float]:
    """A client given ``addresses`` (connected to the first) publishes persistent messages
    to ``q`` one at a time, each awaited, and consumes them with acks; once ``BEFORE`` are
    confirmed and one consumed, ``fault()`` (in a thread). Returns once ``AFTER`` publishes
    begun after it were confirmed and every confirmed message was consumed (AssertionError
    if either stalls past ``WAIT``): what was confirmed, what was consumed, and the seconds
    from the fault to the end. Its failovers go to ``events``."""
    async with await Client.connect(addresses, on_reconnect=events.append) as client:
        assert client.address is not None and str(client.address) == addresses[0]
        return await _publish_and_consume(client, q, fault, events)


async def _publish_and_consume(
    client: Client, q: str, fault: Callable[[], None], events: list[Reconnected]
) -> tuple[list[str], set[str], float]:
    await client.declare(q, durable=True)
    confirmed: list[str] = []
    consumed: set[str] = set()
    faulted = asyncio.Event()
    enough = asyncio.Event()  # BEFORE confirmed
    got_one = asyncio.Event()

    async def publish() -> None:
        after = 0
        n = 0
        while after < AFTER:
            body = f"m{n:04d}"
            n += 1
            began_after_fault = faulted.is_set()
            await client.publish(q, [Message(body.encode(), persistent=True)])
            confirmed.append(body)
            if len(confirmed) >= BEFORE:
                enough.set()
            if began_after_fault:
                after += 1

    async def consume() -> None:
        sub = await client.subscribe(q, ack_mode="client-individual", prefetch=10)
        async for delivery in sub:
            consumed.add(delivery.message.body.decode())
            delivery.ack()
            got_one.set()

    publisher = asyncio.create_task(publish())
    consumer = asyncio.create_task(consume())
    try:
        async with asyncio.timeout(WAIT):
            await enough.wait()
            await got_one.wait()
        await asyncio.to_thread(fault)
        fault_at = time.monotonic()
        faulted.set()
        try:
            async with asyncio.timeout(WAIT):
                await asyncio.shield(publisher)
        except TimeoutError:
            raise AssertionError(
                f"the publisher stalled: {len(confirmed)} confirmed, events {events}"
            ) from None
        wanted = set(confirmed)
        deadline = time.monotonic() + WAIT
        while not wanted <= consumed:
            assert time.monotonic() < deadline, (
                f"not consumed: {sorted(wanted - consumed)}; events {events}; "
                f"the consumer: {consumer}"
            )
            await asyncio.sleep(0.1)
        assert not consumer.done(), consumer  # (it did not end with an error)
        return confirmed, consumed, time.monotonic() - fault_at
    finally:
        publisher.cancel()
        consumer.cancel()
        await asyncio.gather(publisher, consumer, return_exceptions=True)


def test_publishing_and_consuming_go_on_through_a_kill_of_the_connected_node(
    cluster: Cluster,
) -> None:
    """The client is connected to the node leading the queue's shard (the worst case: its
    connection and the queue's leader die together). It keeps publishing persistent
    messages one at a time, each awaited, and consuming them with acks; the node is killed
    halfway. Nothing the application awaits fails, the client reports one failover to
    another node, and every message whose publish was confirmed is consumed."""
    leaders = cluster.wait_formed(timeout=60)
    victim = leaders[0]
    others = cluster.others(victim)
    q = f"queue/{unique('failover')}"
    while shard_of(q) != 0:
        q = f"queue/{unique('failover')}"
    addresses = [core(n.ports["core"]) for n in [victim, *others]]
    events: list[Reconnected] = []

    confirmed, consumed, took = asyncio.run(
        publish_and_consume_through(addresses, q, lambda: cluster.kill(victim), events)
    )
    assert len(confirmed) >= BEFORE + AFTER
    assert set(confirmed) <= consumed, sorted(set(confirmed) - consumed)
    # one failover, from the killed node to a survivor; sometimes a second, between
    # survivors: the node first reached cancels the subscription when its relay did not
    # get it to the shard's new leader (see docs/cluster.md, "Clients that fail over")
    assert events, "no failover reported"
    assert events[0].previous == core(victim.ports["core"])
    assert all(e.address in addresses[1:] for e in events), events
    print(
        f"failed over in {events[0].downtime:.2f} s ({len(events)} failovers: {events}); "
        f"{len(confirmed)} confirmed, all consumed {took:.1f} s after the kill"
    )


def test_a_stream_read_from_next_that_got_nothing_yet_misses_nothing_across_a_failover(
    cluster: Cluster,
) -> None:
    """A reader subscribes to a stream at ``next`` through one node and is given nothing;
    that node freezes, ten messages are appended (confirmed) through the stream's leader,
    then it is killed. The reader fails over and gets those ten, then ten appended after,
    each once and in order: it went on from the seq the core said it started at, where
    subscribing at ``next`` again would have skipped the ten."""
    leaders = all_running(cluster)
    s, leader, victim = led_elsewhere(leaders, "stream", "next")
    third = next(n for n in cluster.nodes if n not in (leader, victim))
    events: list[Reconnected] = []

    async def run() -> tuple[list[tuple[int, str]], list[str]]:
        moved = asyncio.Event()

        def reconnected(event: Reconnected) -> None:
            events.append(event)
            moved.set()

        writer = await Client.connect([core(n.ports["core"]) for n in (leader, third)])
        reader = await Client.connect(
            [core(n.ports["core"]) for n in (victim, leader, third)], on_reconnect=reconnected
        )
        try:
            assert reader.address is not None and reader.address.port == victim.ports["core"]
            await writer.declare(s, durable=True)
            await writer.publish(
                s, [Message(f"old{i}".encode(), persistent=True) for i in range(3)]
            )
            sub = await reader.subscribe(s, offset="next")
            await asyncio.to_thread(cluster.freeze, victim)
            sent = []
            for i in range(10):
                body = f"between{i}"
                await writer.publish(s, [Message(body.encode(), persistent=True)])
                sent.append(body)
            await asyncio.to_thread(cluster.kill, victim)
            async with asyncio.timeout(WAIT):
                await moved.wait()
            for i in range(10):
                body = f"after{i}"
                await writer.publish(s, [Message(body.encode(), persistent=True)])
                sent.append(body)
            got: list[tuple[int, str]] = []
            async with asyncio.timeout(WAIT):
                while len(got) < len(sent):
                    d = await sub.get()
                    got.append((d.message.seq, d.message.body.decode()))
            try:  # (a duplicate would come right behind)
                extra = await sub.get(1.0)
                got.append((extra.message.seq, extra.message.body.decode()))
            except TimeoutError:
                pass
            return got, sent
        finally:
            await reader.close()
            await writer.close()

    got, sent = asyncio.run(run())
    assert [body for _, body in got] == sent, f"got {got}; events {events}"
    assert [seq for seq, _ in got] == list(range(4, 24))
    assert events and events[0].previous == core(victim.ports["core"]), events
    print(f"failed over in {events[0].downtime:.2f} s; {len(got)} of {len(sent)} read, in order")


def test_a_client_whose_node_hangs_fails_over_and_goes_on(cluster: Cluster) -> None:
    """The client's node is stopped with SIGSTOP (its sockets stay open: nothing tells the
    client it is gone) while the client publishes persistent messages one at a time, each
    awaited, and consumes them with acks. Its heartbeat (5 s by default with failover)
    finds the node silent and the client moves to another node: nothing the application
    awaits fails, the publishes go on being confirmed and every confirmed message is
    consumed."""
    leaders = all_running(cluster)
    q, leader, victim = led_elsewhere(leaders, "queue", "hang")
    third = next(n for n in cluster.nodes if n not in (leader, victim))
    addresses = [core(n.ports["core"]) for n in (victim, leader, third)]
    events: list[Reconnected] = []

    try:
        confirmed, consumed, took = asyncio.run(
            publish_and_consume_through(addresses, q, lambda: cluster.freeze(victim), events)
        )
    finally:
        cluster.thaw(victim)
    assert len(confirmed) >= BEFORE + AFTER
    assert set(confirmed) <= consumed, sorted(set(confirmed) - consumed)
    assert events, "no failover reported"
    assert events[0].previous == core(victim.ports["core"]), events
    assert "heartbeat" in events[0].reason, events
    assert all(e.address in addresses[1:] for e in events), events
    print(
        f"failed over {events[0].downtime:.2f} s after losing the node ({len(events)} "
        f"failovers); {len(confirmed)} confirmed, all consumed {took:.1f} s after the freeze"
    )
