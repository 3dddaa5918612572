"""Partitions by SIGSTOP (a hung machine: its sockets stay open, nothing answers).

- Two of three frozen: the node left is a minority and confirms no persistent publish, on any
  protocol, whether it led the queue's shard or forwarded to a frozen leader; once the two
  are thawed, publishing works again everywhere within 30 s.
- The leader of a shard frozen: the others elect a new one and publishing through them
  works; thawed, the old leader steps down, and nothing it confirms after the thaw is false.
"""

from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aio_pika
import pytest
from pamqp.commands import Basic

from .harness import (
    Cluster,
    Node,
    StompConn,
    amqp_url,
    drain,
    eventually,
    http_publish,
    http_publish_ok,
    pika_connection,
    stomp_conn,
    unique,
)

pytestmark = pytest.mark.timeout(240)

STOMP_ERROR_WITHIN = 15.0  # seconds: the ERROR for an uncommittable SEND (+ margin below)
REFUSAL_WITHIN = 30.0  # seconds for an AMQP nack and an HTTP 503
RECOVERY_WITHIN = 30.0  # seconds from the thaw until every node publishes again


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


# ---- one publish each way, and what came back ---------------------------------------------
def stomp_refused(client: StompConn, queue: str) -> str:
    """'' if the SEND was refused with an ERROR in time; else what went wrong."""
    started = time.monotonic()
    receipt = client.send(f"/queue/{queue}", unique("minority-stomp-"), persistent="true")
    got = client.outcome(receipt, STOMP_ERROR_WITHIN + 15)
    took = time.monotonic() - started
    print(
        f"STOMP SEND to {queue} on a minority: {got} after {took:.1f}s "
        f"{client.errors[0].headers.get('message') if client.errors else ''}"
    )
    if got == "receipt":
        return f"STOMP {queue}: RECEIPT on a minority"
    if got != "error":
        return f"STOMP {queue}: {got} instead of an ERROR"
    if took > STOMP_ERROR_WITHIN + 5:
        return f"STOMP {queue}: the ERROR took {took:.1f}s"
    return ""


def amqp_refused(node: Node, queue: str) -> str:
    """'' if a confirmed-mode publish got basic.nack (or its channel closed) in time."""

    async def attempt() -> str:
        conn = await aio_pika.connect(amqp_url(node), timeout=10)
        try:
            ch = await conn.channel(publisher_confirms=True)
            started = time.monotonic()
            try:
                result = await ch.default_exchange.publish(
                    aio_pika.Message(
                        unique("minority-amqp-").encode(),
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=queue,
                    timeout=REFUSAL_WITHIN,
                )
            except aio_pika.exceptions.DeliveryError:
                print(
                    f"AMQP publish to {queue} on a minority: nack after "
                    f"{time.monotonic() - started:.1f}s"
                )
                return ""
            except TimeoutError:
                return f"AMQP {queue}: neither ack nor nack within {REFUSAL_WITHIN:g}s"
            except (aio_pika.exceptions.ChannelClosed, aio_pika.exceptions.ConnectionClosed) as e:
                print(f"AMQP publish to {queue} on a minority: channel closed {e!r}")
                return ""
            if isinstance(result, Basic.Ack):
                return f"AMQP {queue}: basic.ack on a minority"
            return f"AMQP {queue}: {result!r}"
        finally:
            try:
                await asyncio.wait_for(conn.close(), 5)
            except Exception:
                pass

    return asyncio.run(attempt())


def http_refused(node: Node, queue: str) -> str:
    """'' if a persistent POST got 503 with Retry-After in time."""
    started = time.monotonic()
    r = http_publish(node, queue, unique("minority-http-"), timeout=REFUSAL_WITHIN + 10)
    took = time.monotonic() - started
    print(
        f"HTTP POST to {queue} on a minority: {r.status_code} after {took:.1f}s "
        f"Retry-After={r.headers.get('Retry-After')} {r.text[:200]}"
    )
    if r.status_code != 503:
        return f"HTTP {queue}: {r.status_code} {r.text[:200]}"
    if "Retry-After" not in r.headers:
        return f"HTTP {queue}: 503 without Retry-After"
    if took > REFUSAL_WITHIN:
        return f"HTTP {queue}: the 503 took {took:.1f}s"
    return ""


def publish_until_ok(node: Node, proto: str, queue: str, body: str, deadline: float) -> int:
    """Publish ``body`` through ``node`` over ``proto`` until confirmed (AssertionError at
    ``deadline``); how many attempts failed first."""
    failed = 0
    while True:
        try:
            if proto == "http":
                r = http_publish(node, queue, body, timeout=max(1.0, deadline - time.monotonic()))
                if r.status_code == 200:
                    return failed
                why = f"{r.status_code} {r.text[:200]}"
            elif proto == "stomp":
                with stomp_conn(node) as client:
                    receipt = client.send(f"/queue/{queue}", body, persistent="true")
                    why = client.outcome(receipt, max(1.0, deadline - time.monotonic()))
                    if why == "receipt":
                        return failed
                    why += f" {client.errors[0].headers if client.errors else ''}"
            else:
                conn = pika_connection(node)
                try:
                    ch = conn.channel()
                    ch.queue_declare(queue, durable=True)
                    ch.confirm_delivery()
                    ch.basic_publish("", queue, body.encode(), _persistent())
                    return failed
                finally:
                    if conn.is_open:
                        conn.close()
        except Exception as exc:
            why = repr(exc)
        failed += 1
        assert time.monotonic() < deadline, f"{proto} via {node.id} to {queue}: {why}"
        time.sleep(0.5)


def _persistent() -> Any:
    import pika

    return pika.BasicProperties(delivery_mode=2)


# ---- the tests ---------------------------------------------------------------------------------
def test_minority_confirms_nothing_then_recovers(cluster: Cluster) -> None:
    leaders = cluster.wait_formed(timeout=30)
    by_leader = collections.Counter(n.id for n in leaders.values())
    # the node left alone is one that leads a shard: it must not commit alone what it leads
    lone = cluster.node_by_id(by_leader.most_common(1)[0][0])
    frozen = cluster.others(lone)
    queues: dict[str, str] = {}
    own = [s for s, n in leaders.items() if n is lone]
    queues["led-by-the-lone-node"] = cluster.queue_in_shard(own[0], "own")
    elsewhere = [s for s, n in leaders.items() if n is not lone]
    if elsewhere:  # forwarded to a frozen leader
        queues["led-by-a-frozen-node"] = cluster.queue_in_shard(elsewhere[0], "fwd")
    print(f"\nleaving {lone.id} alone; queues {queues}")
    conn = pika_connection(lone)
    ch = conn.channel()
    for q in queues.values():
        ch.queue_declare(q, durable=True)
        http_publish_ok(lone, q, "before")  # works while the cluster is whole
    conn.close()
    clients = {q: StompConn(lone).connect() for q in queues.values()}

    for node in frozen:
        cluster.freeze(node)
    t_freeze = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = []
            for q in queues.values():
                futures.append(pool.submit(stomp_refused, clients[q], q))
                futures.append(pool.submit(amqp_refused, lone, q))
                futures.append(pool.submit(http_refused, lone, q))
            problems: list[str] = [p for f in futures if (p := f.result())]
        print(f"refusals done {time.monotonic() - t_freeze:.1f}s after the freeze")
        eventually(lambda: lone.readyz() == 503, 20, f"{lone.id}'s /readyz 503 in a minority")
    finally:
        for c in clients.values():
            c.close()
        for node in frozen:
            cluster.thaw(node)
    t_thaw = time.monotonic()
    try:
        publish_everywhere_again(cluster, t_thaw)
    except AssertionError as exc:
        problems.append(f"after the thaw: {exc}")
    assert not problems, problems


def publish_everywhere_again(cluster: Cluster, t_thaw: float) -> None:
    """Every node, every protocol, every shard: confirmed within 30 s of the thaw, and then
    consumed."""
    deadline = t_thaw + RECOVERY_WITHIN
    cluster.wait_formed(timeout=RECOVERY_WITHIN)
    print(f"formed again {time.monotonic() - t_thaw:.1f}s after the thaw")
    sent: dict[str, list[str]] = collections.defaultdict(list)
    retries = 0
    for node in cluster.nodes:
        for shard in range(cluster.shards):
            q = cluster.queue_in_shard(shard, "again")
            for proto in ("stomp", "amqp", "http"):
                body = f"{node.id}-{proto}-{shard}"
                retries += publish_until_ok(node, proto, q, body, deadline)
                sent[q].append(body)
    took = time.monotonic() - t_thaw
    print(
        f"published on every node over every protocol to every shard {took:.1f}s after "
        f"the thaw ({retries} failed attempts first)"
    )
    for q, bodies in sent.items():
        got = drain(cluster.nodes[0], q, expect=len(bodies), timeout=30)
        assert sorted(m["body"] for m in got) == sorted(bodies), q


def test_hung_leader_is_replaced_and_steps_down(cluster: Cluster) -> None:
    leaders = cluster.wait_formed(timeout=60)
    shard, old = min(leaders.items())
    survivors = cluster.others(old)
    q = cluster.queue_in_shard(shard, "hung")
    before = [f"before-{i}" for i in range(5)]
    for body in before:
        http_publish_ok(survivors[0], q, body)

    during: list[str] = []
    retried: set[str] = set()
    cluster.freeze(old)
    t_freeze = time.monotonic()
    try:

        def replaced() -> Node | None:
            infos = [n.cluster_info() for n in survivors]
            if any(i is None for i in infos):
                return None
            named = {i["shards"][shard]["leader"] for i in infos if i is not None}
            if len(named) != 1 or None in named or old.id in named:
                return None
            new = cluster.node_by_id(named.pop())
            return new if shard in (new.leads() or set()) else None

        new = eventually(replaced, 30, f"a new leader of shard {shard} while {old.id} hangs")
        t_elected = time.monotonic()
        print(f"\n{old.id} frozen; {new.id} leads shard {shard} after {t_elected - t_freeze:.1f}s")
        for node in survivors:
            for i in range(3):
                body = f"during-{node.id}-{i}"
                if publish_until_ok(node, "http", q, body, time.monotonic() + 30):
                    retried.add(body)
                during.append(body)
        print(f"published through both survivors; retried: {sorted(retried)}")
    finally:
        cluster.thaw(old)
    t_thaw = time.monotonic()

    # the old leader, thawed, still believes it leads for a moment: publish through it at once
    outcomes: list[tuple[str, int]] = []
    n = 0
    while time.monotonic() < t_thaw + 8:
        body = f"after-{n}"
        try:
            status = http_publish(old, q, body, timeout=20).status_code
        except Exception:
            status = -1
        outcomes.append((body, status))
        n += 1
    confirmed_after = [b for b, s in outcomes if s == 200]
    print(
        f"through the thawed {old.id}: {collections.Counter(s for _, s in outcomes)} "
        "(200: confirmed, so it must be there; anything else: refused)"
    )

    def stepped_down() -> bool:
        info = old.cluster_info()
        if info is None:
            return False
        mine = info["shards"][shard]
        return not mine["leading"] and mine["leader"] not in (None, old.id)

    eventually(stepped_down, 30, f"{old.id} steps down from shard {shard} after the thaw")
    print(f"{old.id} stepped down {time.monotonic() - t_thaw:.1f}s after the thaw")
    cluster.wait_formed(timeout=60)

    # nothing confirmed is missing: not before, not during, not what the old node confirmed
    want = before + during + confirmed_after
    got = drain(survivors[1], q, expect=len(want), timeout=60)
    bodies = collections.Counter(m["body"] for m in got)
    missing = [b for b in want if b not in bodies]
    assert not missing, f"confirmed and gone: {missing}"
    strangers = [b for b in bodies if not b.startswith(("before-", "during-", "after-"))]
    assert not strangers, strangers
    dups = {b: c for b, c in bodies.items() if c > 1 and b not in retried}
    assert not dups, f"published once, there twice: {dups}"
