"""A balancer move under load (``polymq_core.cluster.leadership``, ``ShardLeadership._hand``): the
node that hands a shard's lead on lets the shard go, lets the writes already made reach the
log, and only then steps its stream down. A step-down with an append in flight left it
unanswered (its writes failed after the log's timeout, 5 s: the rolling restart's 5.51 s
stall), and one with writes pending failed them; now no publish is refused, and what was
confirmed is there on the new leader."""

from __future__ import annotations

import asyncio
import collections
import re
from typing import Any

import pytest

from polymq import Client, Message

from .harness import Cluster, Node, eventually, running_cluster
from .test_takeover import _stepdown

# Out of the default suite (run it with `-m slow`) until it is redesigned: the balancer hands
# a shard on only to a target whose announced applied entry is within 100 of its own
# (leadership._CAUGHT_UP), which a shard under this load never has once the machine is fast
# enough to apply thousands of entries a second, so the move it waits for may never come
# (it failed twice so, in a clean-clone CI run and beside it; it passed 4 times on a machine
# loaded enough to keep the load slow).
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

WINDOW = 16  # publishes each client keeps in flight to each queue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_cluster(tmp_path_factory.mktemp("balance-move")) as c:
        yield c


def _moves(node: Node) -> list[tuple[int, str]]:
    """The balancer's moves in ``node``'s log: (shard, the node it was handed to)."""
    found = re.findall(r"shard (\d+): handing its lead to node (\S+) \(balance\)", node.log())
    return [(int(s), n) for s, n in found]


async def _load(
    nodes: list[Node], queues: list[str], stop: asyncio.Event
) -> tuple[set[bytes], list[str]]:
    """Through each of ``nodes`` (one client each, no failover: a refusal is an error
    here), keep WINDOW persistent publishes in flight to each queue until ``stop``; the
    confirmed bodies and the failures."""
    confirmed: set[bytes] = set()
    failures: list[str] = []
    clients = [
        await Client.connect("127.0.0.1", n.ports["core"], reconnect_timeout=None) for n in nodes
    ]
    counter = iter(range(10**9))

    async def lane(client: Client, queue: str) -> None:
        while not stop.is_set():
            body = f"{queue}:{next(counter)}".encode()
            try:
                await client.publish(f"queue/{queue}", [Message(body=body, persistent=True)])
            except Exception as exc:
                failures.append(f"{body!r}: {type(exc).__name__}: {exc}")
            else:
                confirmed.add(body)

    try:
        for q in queues:
            await clients[0].declare(f"queue/{q}", durable=True)
        await asyncio.gather(*(lane(c, q) for c in clients for q in queues for _ in range(WINDOW)))
    finally:
        for c in clients:
            await c.close()
    return confirmed, failures


async def _drain(node: Node, queues: list[str], want: set[bytes]) -> set[bytes]:
    """The bodies of ``queues``, consumed through ``node`` until each queue gave what it
    was expected to (``want``) or nothing more came for 15 s."""
    got: set[bytes] = set()
    async with await Client.connect("127.0.0.1", node.ports["core"]) as client:
        for q in queues:
            sub = await client.subscribe(f"queue/{q}", ack_mode="client-individual", prefetch=500)
            mine = {b for b in want if b.startswith(f"{q}:".encode())}
            while not mine <= got:
                try:
                    d = await asyncio.wait_for(sub.__anext__(), 15.0)
                except TimeoutError:
                    break
                got.add(d.message.body)
                d.ack()
    return got


def test_a_balancer_move_under_load_steps_down_only_once_its_writes_are_in_the_log(
    cluster: Cluster,
) -> None:
    leaders = cluster.wait_balanced()
    led = collections.Counter(n.id for n in leaders.values())
    # a node leading two shards is given a third (a step-down through JetStream, before
    # the load): it leads more than its share, and its balancer hands one on (one of the
    # two it led before: the third it has just taken over stays, leadership._SETTLE)
    a = next(n for n in cluster.nodes if led[n.id] == 2)
    before = sorted(s for s, n in leaders.items() if n is a)
    other = min(s for s, n in leaders.items() if n is not a)
    _stepdown(leaders[other], cluster.secret, other, a.id)
    eventually(lambda: cluster.leaders()[other] is a, 30, f"{a.id} leading shard {other}")
    queues = [cluster.queue_in_shard(s, "moved") for s in [*before, other]]
    c = next(n for n in cluster.others(a) if n is not leaders[other])
    moves_before = len(_moves(a))

    async def scene() -> tuple[set[bytes], list[str]]:
        stop = asyncio.Event()
        load = asyncio.ensure_future(_load([a, c], queues, stop))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while len(_moves(a)) == moves_before and not load.done():
            if loop.time() > deadline:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(3.0)  # the move done, and publishes to its new leader
        stop.set()
        return await load

    confirmed, failures = asyncio.run(scene())
    moves = _moves(a)[moves_before:]
    print(f"\n{a.id} led {before} and {other}; moves: {moves}; {len(confirmed)} confirmed")
    assert moves, f"{a.id}'s balancer moved nothing:\n{a.log_tail()}"
    moved, target = moves[0]
    # the order of events in the log of the node that handed it on: the move, the shard
    # let go, its writes in the log, then (and only then) the step-down
    log = a.log()
    events = [
        f"shard {moved}: handing its lead to node {target} (balance)",
        f"shard {moved}: no longer led by this node (handing its lead to node {target})",
        f"shard {moved}: its writes are in the log; stepping down for node {target}",
    ]
    at = [log.find(e) for e in events]
    assert all(i >= 0 for i in at) and at == sorted(at), (at, a.log_tail())
    assert cluster.leaders()[moved].id == target
    assert not failures, failures[:10]
    missing = confirmed - asyncio.run(_drain(c, queues, confirmed))
    assert not missing, f"{len(missing)} confirmed and not consumed: {sorted(missing)[:10]}"
