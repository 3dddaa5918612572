"""Paging in the replicated core: a leader keeps a window of each durable queue's ready
messages in memory (``POLYMQ_QUEUE_WINDOW_MESSAGES``, here 200) and reads the rest back from
its local store, which applies the log a step behind its commits.

A backlog of 1 KB persistent messages many times the window grows no node's memory by
anything near its size, and every message comes back once, in order. The leader of a paged
backlog killed (``kill -9``), the new leader serves the rest at once (it loaded one window
and counted the rest), in order, none lost, and only what the old leader delivered flagged
redelivered."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from polymq import Client, Message

from .harness import Cluster, Node, eventually, running_cluster

pytestmark = pytest.mark.timeout(400)

WINDOW = 200  # messages a queue keeps in memory
BODY = 1024
HALF = 15_000  # messages of each half of the first test's backlog: 75 windows
WARMUP = 10_000  # messages published, then drained, before it
BATCH = 250  # messages per awaited publish
INFLIGHT = 4  # publishes in flight at once
TAKEOVER_BACKLOG = 6_000
TAKEN_BEFORE = 1_000  # messages consumed (and acked) before the leader is killed
TRANSIENT_TAIL = 2  # transient messages published behind the takeover's backlog (paged)
PREFETCH = 500  # what a consumer here may hold unacked
# what a node holds of the log's entries before SQLite, whatever the backlog (replicatedstore
# _HOLD_BYTES): its peak while a half is published and applied may add that much; once the
# log is quiet it hands the freed heap back (malloc_trim), so what stays is measured cleanly
HOLD_BYTES = 16 * 1024 * 1024
STILL = 2.0  # seconds: past the second a node holds the entries it tails before it applies them


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    env = {"POLYMQ_QUEUE_WINDOW_MESSAGES": str(WINDOW)}
    with running_cluster(tmp_path_factory.mktemp("paging"), env=env) as c:
        yield c


def body(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"x" * (BODY - 8)


def index(data: bytes) -> int:
    return int.from_bytes(data[:8], "big")


def rss(node: Node) -> int:
    """The resident memory of the node's polymq process (not its nats-server)."""
    return int(psutil.Process(node.pids[0]).memory_info().rss)


class Peaks:
    """Samples each node's polymq RSS every 0.1 s from a thread: the highest seen."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.peak = {n.id: rss(n) for n in nodes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for n in self.nodes:
                try:
                    self.peak[n.id] = max(self.peak[n.id], rss(n))
                except psutil.NoSuchProcess:
                    pass

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def publish(client: Client, dest: str, first: int, count: int) -> None:
    """Persistent messages ``first`` .. ``first + count - 1``, each publish awaited (its
    receipt: committed to the log), ``INFLIGHT`` at a time."""
    nxt = first
    end = first + count

    async def one() -> None:
        nonlocal nxt
        while nxt < end:
            lo = nxt
            hi = nxt = min(end, lo + BATCH)
            batch = [Message(body(i), persistent=True) for i in range(lo, hi)]
            r = await client.publish(dest, batch)
            assert r.count == hi - lo

    await asyncio.gather(*(one() for _ in range(INFLIGHT)))


async def consume(client: Client, dest: str, count: int) -> list[tuple[int, bool]]:
    """``count`` deliveries, each acked: (index, redelivered) in the order they came. The
    last ack is awaited until written (committed to the log), the others before it too."""
    sub = await client.subscribe(dest, ack_mode="client-individual", prefetch=PREFETCH)
    got: list[tuple[int, bool]] = []
    try:
        while len(got) < count:
            d = await sub.get(timeout=60)
            got.append((index(d.message.body), d.message.redelivered))
            if len(got) < count:
                d.ack()
            else:
                assert await sub.ack_many([d.tag]) == 1
    finally:
        await sub.unsubscribe()
    return got


def settled(cluster: Cluster, shard: int) -> dict[str, int]:
    """Once every node has applied the shard's log to the same entry and none has moved for
    ``STILL`` seconds (nothing held for later, nothing queued to SQLite): each node's
    polymq RSS. (Equal alone is not enough: right after a publish every node may still
    hold all of its entries, their ``applied`` all the entry before them.)"""
    seen: list[tuple[int, float]] = []  # the entry all had applied, since when

    def still() -> bool:
        applied = [n.applied() for n in cluster.nodes]
        values = {a[shard] for a in applied if a is not None}
        now = time.monotonic()
        if None in applied or len(values) != 1:
            seen.clear()
            return False
        (value,) = values
        if not seen or seen[0][0] != value:
            seen[:] = [(value, now)]
            return False
        return now - seen[0][1] >= STILL

    eventually(still, 60, f"every node applying shard {shard}'s log to the same entry, still")
    return {n.id: rss(n) for n in cluster.nodes}


def test_a_backlog_past_the_window_keeps_every_node_small_and_comes_back_in_order(
    cluster: Cluster,
) -> None:
    """A queue whose window is 200 gets 15,000 x 1 KB persistent messages, then 15,000 more
    (15 MB of bodies): with each half published and applied everywhere, no node's polymq
    grew with the second half by half its bytes, nor by all of them and the 16 MiB of log
    entries a node holds a moment at its peak while it was published and everything
    drained; the consumer gets each message once, in order. (What grows a node once,
    whatever the backlog, is paid by then: a warm-up and the first half.) Fails on
    the code before paging in the cluster: the leader grew by ~1.6 KB per queued message."""
    leaders = cluster.wait_formed(timeout=60)
    leader = leaders[0]
    dest = f"queue/{cluster.queue_in_shard(0, 'paged')}"
    via = cluster.others(leader)[0]  # consumed through another node (forwarded)
    half_bytes = HALF * BODY

    async def run() -> None:
        pub = await Client.connect("127.0.0.1", leader.ports["core"])
        sub = await Client.connect("127.0.0.1", via.ports["core"])
        try:
            await pub.declare(dest, durable=True)
            await publish(pub, dest, 0, WARMUP)  # buffers, caches, the allocator warmed up
            await consume(sub, dest, WARMUP)
            await publish(pub, dest, 0, HALF)
            base = await asyncio.to_thread(settled, cluster, 0)
            with Peaks(cluster.nodes) as peaks:
                await publish(pub, dest, HALF, HALF)
                full = await asyncio.to_thread(settled, cluster, 0)
                stats = await pub.stats(dest)
                got = await consume(sub, dest, 2 * HALF)
            left = await pub.stats(dest)
        finally:
            await pub.close()
            await sub.close()
        grew = {nid: full[nid] - base[nid] for nid in base}
        peak = {nid: peaks.peak[nid] - base[nid] for nid in base}
        print(f"RSS growth by node (leader {leader.id}): second half {grew}, peak {peak}")
        assert all(g < half_bytes // 2 for g in grew.values()), (
            f"RSS growth with the second half {grew} (leader {leader.id}), bound {half_bytes // 2}"
        )
        assert all(g < half_bytes + HOLD_BYTES for g in peak.values()), (
            f"RSS peak growth {peak} (leader {leader.id}), bound {half_bytes + HOLD_BYTES}"
        )
        assert [i for i, _ in got] == list(range(2 * HALF)), "not every message once, in order"
        assert left.messages == 0, left  # type: ignore[union-attr]
        assert stats.paged > HALF, stats  # type: ignore[union-attr]

    asyncio.run(run())


def test_a_new_leader_serves_a_paged_backlog_at_once_in_order(cluster: Cluster) -> None:
    """6,000 messages in a queue whose window is 200, 1,000 consumed and acked, then its
    shard's leader is killed: the new leader answers with the rest counted as paged (it
    loaded one window), and a consumer through a survivor gets the other 5,000, in order,
    none lost, none twice, and none that was never delivered flagged redelivered; the two
    transient messages published behind the backlog (paged, so in the log) come last,
    still transient (before 2026-11-30 they came out flagged persistent). Fails on the code
    before paging in a cluster: the new leader loaded the whole backlog (paged 0)."""
    leaders = cluster.wait_formed(timeout=60)
    leader = leaders[1]
    dest = f"queue/{cluster.queue_in_shard(1, 'takeover')}"
    survivor = cluster.others(leader)[0]

    async def fill() -> list[tuple[int, bool]]:
        client = await Client.connect("127.0.0.1", survivor.ports["core"])
        try:
            await client.declare(dest, durable=True)
            await publish(client, dest, 0, TAKEOVER_BACKLOG)
            # two transient ones, paged: in the log like the others, and still transient
            tail = [Message(body(TAKEOVER_BACKLOG + i)) for i in range(TRANSIENT_TAIL)]
            assert (await client.publish(dest, tail)).count == TRANSIENT_TAIL
            return await consume(client, dest, TAKEN_BEFORE)
        finally:
            await client.close()

    first = asyncio.run(fill())
    assert [i for i, _ in first] == list(range(TAKEN_BEFORE))
    cluster.kill(leader)
    killed = time.monotonic()

    async def stats() -> tuple[int, int] | None:
        try:
            client = await Client.connect("127.0.0.1", survivor.ports["core"])
        except Exception:
            return None
        try:
            s = await client.stats(dest)
            return int(s.messages), int(s.paged)  # type: ignore[union-attr]
        except Exception:
            return None
        finally:
            await client.close()

    counts = eventually(lambda: asyncio.run(stats()), 60, f"stats of {dest} after the kill")
    served = time.monotonic() - killed
    print(f"the new leader answered {served:.1f} s after the kill: {counts} (messages, paged)")
    left = TAKEOVER_BACKLOG - TAKEN_BEFORE
    assert counts[0] == left + TRANSIENT_TAIL, counts
    assert counts[1] >= left - 2 * WINDOW, f"the new leader loaded more than a window: {counts}"

    async def rest() -> list[tuple[int, bool]]:
        client = await Client.connect("127.0.0.1", survivor.ports["core"])
        try:
            return await consume(client, dest, left)
        finally:
            await client.close()

    got = asyncio.run(rest())
    assert [i for i, _ in got] == list(range(TAKEN_BEFORE, TAKEOVER_BACKLOG)), (
        "not every message once, in order"
    )

    async def transient_tail() -> list[tuple[int, bool]]:
        client = await Client.connect("127.0.0.1", survivor.ports["core"])
        try:
            sub = await client.subscribe(dest, ack_mode="client-individual", prefetch=10)
            ds = [await sub.get(timeout=60) for _ in range(TRANSIENT_TAIL)]
            assert await sub.ack_many([d.tag for d in ds]) == TRANSIENT_TAIL
            assert (await client.stats(dest)).messages == 0  # type: ignore[union-attr]
            return [(index(d.message.body), d.message.persistent) for d in ds]
        finally:
            await client.close()

    assert asyncio.run(transient_tail()) == [
        (TAKEOVER_BACKLOG + i, False) for i in range(TRANSIENT_TAIL)
    ], "the paged transient messages, from the new leader's store: not as published"
    # only what went out before the kill may say so (delivery marks in the log, issue 28.5):
    # the first consumer's prefetch (500) past the 1,000 it acked; never the rest
    never_sent = [i for i, redelivered in got if i >= TAKEN_BEFORE + PREFETCH and redelivered]
    assert not never_sent, f"never delivered, yet flagged redelivered: {never_sent[:10]}"
    assert served < 60
