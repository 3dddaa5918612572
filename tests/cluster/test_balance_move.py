"""A balancer move under load (``polymq_core.cluster.balancer``, handed on by
``ShardLeadership.hand``): the node that hands a shard's lead on lets the shard go, lets the
writes already made reach the log, and only then steps its stream down. A step-down with an
append in flight left it unanswered (its writes failed after the log's timeout, 5 s: the rolling
restart's 5.51 s stall), and one with writes pending failed them; now no publish is refused, and
what was confirmed is there on the new leader. The move comes under steady load (the balancer
hands a lead only to a node caught up with the shard's log, judged so that a node keeping up
under load is: ``Balancer._caught_up``), with publishes of the moved shard confirmed on either
side of it."""

from __future__ import annotations

import asyncio
import collections
import datetime
import re
import time
from typing import Any

import pytest

from polymq import Client, Message

from .harness import Cluster, Node, eventually, running_cluster
from .test_takeover import _stepdown

# (It was out of the default suite twice: the move never came on a fast machine, when the
# balancer judged a target by an announcement up to 2 s old against what the leader had
# applied now; then 1 run of 13 failed publishes forwarded through c to a, answered
# `unavailable` by c's relay as soon as it saw the shard led elsewhere, though a answers
# them a moment later: forwarding/relay.py, Relay._watch now waits _MOVED_GRACE for it.)
pytestmark = [pytest.mark.timeout(300)]

WINDOW = 16  # publishes each client keeps in flight to each queue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_cluster(tmp_path_factory.mktemp("balance-move")) as c:
        yield c


def _moves(node: Node) -> list[tuple[int, str, float]]:
    """The balancer's moves in ``node``'s log: (shard, the node it was handed to, when: the
    log line's local time as a unix time)."""
    found = re.findall(
        r"^(\S+ \S+) INFO \S+ shard (\d+): handing its lead to node (\S+) \(balance\)$",
        node.log(),
        re.MULTILINE,
    )
    return [(int(s), n, _unix(at)) for at, s, n in found]


def _unix(logged: str) -> float:
    """A log line's local time (``2026-11-29 16:06:10,114``) as a unix time."""
    return datetime.datetime.strptime(logged, "%Y-%m-%d %H:%M:%S,%f").timestamp()


async def _load(
    nodes: list[Node],
    queues: list[str],
    stop: asyncio.Event,
    confirmed: dict[bytes, float],
    failures: list[str],
) -> None:
    """Through each of ``nodes`` (one client each, no failover: a refusal is an error
    here), keep WINDOW persistent publishes in flight to each queue until ``stop``; the
    confirmed bodies (with when: unix time) into ``confirmed``, the failures into
    ``failures``."""
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
                confirmed[body] = time.time()

    try:
        for q in queues:
            await clients[0].declare(f"queue/{q}", durable=True)
        await asyncio.gather(*(lane(c, q) for c in clients for q in queues for _ in range(WINDOW)))
    finally:
        for c in clients:
            await c.close()


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
    # a node leading two shards (its share) has them under load; then it is given a third
    # (a step-down through JetStream of a shard not under load yet, then loaded too): it
    # leads more than its share, and its balancer hands one on under load (the quietest of
    # those it has led for balancer._SETTLE seconds: on a cluster just started, the third
    # too, at times)
    a = next(n for n in cluster.nodes if led[n.id] == 2)
    before = sorted(s for s, n in leaders.items() if n is a)
    other = min(s for s, n in leaders.items() if n is not a)
    queue_of = {s: cluster.queue_in_shard(s, "moved") for s in [*before, other]}
    queues = list(queue_of.values())  # (``other``'s last)
    c = next(n for n in cluster.others(a) if n is not leaders[other])
    moves_before = len(_moves(a))
    confirmed: dict[bytes, float] = {}
    failures: list[str] = []

    async def scene() -> None:
        stop = asyncio.Event()
        loads = [asyncio.ensure_future(_load([a, c], queues[:-1], stop, confirmed, failures))]
        loop = asyncio.get_running_loop()
        try:
            deadline = loop.time() + 60
            while len(confirmed) < 2000 and not loads[0].done():  # the load under way
                assert loop.time() < deadline, f"{len(confirmed)} publishes confirmed in 60 s"
                await asyncio.sleep(0.2)
            await asyncio.to_thread(_stepdown, leaders[other], cluster.secret, other, a.id)
            await asyncio.to_thread(
                eventually, lambda: cluster.leaders()[other] is a, 30, f"{a.id} leading {other}"
            )
            loads.append(
                asyncio.ensure_future(_load([a, c], queues[-1:], stop, confirmed, failures))
            )
            deadline = loop.time() + 90
            while len(_moves(a)) == moves_before and not any(load.done() for load in loads):
                if loop.time() > deadline:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(3.0)  # the move done, and publishes to its new leader
        finally:
            stop.set()
            await asyncio.gather(*loads)

    asyncio.run(scene())
    moves = _moves(a)[moves_before:]
    print(f"\n{a.id} led {before} and {other}; moves: {moves}; {len(confirmed)} confirmed")
    assert moves, f"{a.id}'s balancer moved nothing:\n{a.log_tail()}"
    moved, target, when = moves[0]
    # under load: publishes to the moved shard's queue confirmed before the move and after
    ours = [at for body, at in confirmed.items() if body.startswith(f"{queue_of[moved]}:".encode())]
    before_move, after_move = sum(at < when for at in ours), sum(at > when + 0.5 for at in ours)
    print(f"shard {moved}: {before_move} publishes confirmed before the move, {after_move} after")
    assert before_move and after_move, (before_move, after_move)
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
    assert not failures, (f"{len(failures)} publishes failed", failures[:10])
    missing = set(confirmed) - asyncio.run(_drain(c, queues, set(confirmed)))
    assert not missing, f"{len(missing)} confirmed and not consumed: {sorted(missing)[:10]}"
