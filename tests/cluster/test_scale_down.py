"""Scaling three nodes down to two under load: the node that leads the publishers' shard is
stopped gracefully (SIGTERM, as a pod's termination), while publishers with confirms (AMQP
on one survivor, STOMP receipts on the other) and a STOMP publisher connected to the leaving
node itself (which moves to a survivor when its connection ends) keep publishing persistent
messages, each retried until confirmed. Nothing confirmed is lost, publishing resumes, and
the two nodes left serve everything.

Scaled down for good (``POST /api/cluster/leave`` first, as a preStop hook would): the
clients connected to the leaving node through STOMP and AMQP are told to go elsewhere (an
ERROR frame, a 320 CONNECTION_FORCED) and reconnect once, to a survivor; the survivors keep
committing; and every shard's stream then has the two survivors as its replicas."""

from __future__ import annotations

import collections
from typing import Any

import aio_pika
import pytest
import requests

from .harness import Cluster, Node, StompConn, amqp_url, eventually, running_cluster
from .test_failover import (
    AmqpPublisher,
    Publisher,
    StompPublisher,
    assert_nothing_confirmed_lost,
    declare_durable,
    publish_through,
)

pytestmark = pytest.mark.timeout(240)

WARMUP = 20
AFTER = 20


class MovingStompPublisher(StompPublisher):
    """A STOMP publisher that starts on one node and, whenever its connection ends, goes on
    on the next node of ``nodes`` (as a client behind a load balancer would)."""

    def __init__(self, name: str, nodes: list[Node], queue: str) -> None:
        super().__init__(name, nodes[0], queue)
        self.nodes = nodes
        self.connections = 0
        self.farewells: list[str] = []  # the ERROR frames' messages its connections ended on

    def publish_once(self, body: str) -> str:
        if self.client is None:
            self.connections += 1
            if self.connections > 1:  # the connection ended: another node
                self.node = self.nodes[min(self.connections - 1, len(self.nodes) - 1)]
            try:
                self.client = StompConn(self.node).connect(5.0)
            except Exception as exc:
                return f"stomp connect {type(exc).__name__}: {exc}"
        return super().publish_once(body)

    def close(self) -> None:
        if self.client is not None:
            self.farewells += [
                f"{f.headers.get('message', '')}: {f.body}" for f in self.client.errors
            ]
        super().close()


class MovingAmqpPublisher(AmqpPublisher):
    """An AMQP publisher that starts on one node and, whenever its connection is closed,
    goes on on the next node of ``nodes``; keeps why each connection was closed."""

    def __init__(self, name: str, nodes: list[Node], queue: str) -> None:
        super().__init__(name, nodes[0], queue)
        self.nodes = nodes
        self.connections = 0
        self.farewells: list[str] = []

    async def _publish(self, body: str) -> str:
        if self.conn is None or self.conn.is_closed:
            await self._close()
            self.connections += 1
            self.node = self.nodes[min(self.connections - 1, len(self.nodes) - 1)]
            try:
                self.conn = await aio_pika.connect(amqp_url(self.node), timeout=5)
            except Exception as exc:
                return f"amqp connect {type(exc).__name__}: {exc}"[:200]
            self.conn.close_callbacks.add(self._closed)
            self.channel = await self.conn.channel(publisher_confirms=True)
        return await super()._publish(body)

    def _closed(self, _conn: Any, exc: BaseException | None) -> None:
        if exc is not None:
            self.farewells.append(str(exc))


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


def test_a_leader_stopped_gracefully_under_load_loses_nothing(cluster: Cluster) -> None:
    leaders = cluster.wait_formed(timeout=30)
    leaving = next(iter(leaders.values()))
    shard = min(s for s, n in leaders.items() if n is leaving)
    s1, s2 = cluster.others(leaving)
    q = cluster.queue_in_shard(shard, "down")
    declare_durable(s1, q)
    publishers: list[Publisher] = [
        AmqpPublisher("amqp", s1, q),
        StompPublisher("stomp", s2, q),
        MovingStompPublisher("moving", [leaving, s1], q),
    ]
    t_stop, t_gone = publish_through(publishers, lambda: cluster.stop(leaving), "the stop")

    first_after = {
        p.tag: round(min(a.ended for a in p.confirmed(t_gone)) - t_gone, 3) for p in publishers
    }
    failures = collections.Counter(
        a.outcome.split(":")[0] for p in publishers for a in p.snapshot() if not a.confirmed
    )
    moving = publishers[2]
    assert isinstance(moving, MovingStompPublisher)
    print(
        f"\nstopped {leaving.id} (leading shard {shard}) in {t_gone - t_stop:.2f}s; first "
        f"confirmed publish begun after it was gone: {first_after}; failed attempts: "
        f"{dict(failures)}; the moving STOMP client connected {moving.connections} times"
    )
    assert moving.connections >= 2 and moving.node is s1  # its node went: it moved
    new_leader = cluster.leaders(timeout=30, nodes=[s1, s2])[shard]
    assert new_leader in (s1, s2)

    assert_nothing_confirmed_lost(publishers, s2, q)


def test_scaled_down_for_good_clients_move_once_and_streams_drop_the_node(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with running_cluster(tmp_path_factory.mktemp("scale-down-for-good")) as cluster:
        leaders = cluster.wait_formed(timeout=60)
        leaving = next(iter(leaders.values()))
        shard = min(s for s, n in leaders.items() if n is leaving)
        s1, s2 = cluster.others(leaving)
        q = cluster.queue_in_shard(shard, "gone")
        declare_durable(s1, q)
        stomp_mover = MovingStompPublisher("stomp-moving", [leaving, s1], q)
        amqp_mover = MovingAmqpPublisher("amqp-moving", [leaving, s2], q)
        publishers: list[Publisher] = [
            AmqpPublisher("amqp", s1, q),
            StompPublisher("stomp", s2, q),
            stomp_mover,
            amqp_mover,
        ]

        def scale_down() -> None:
            # the preStop hook: this pod is not coming back
            r = requests.post(
                f"{leaving.admin}/api/cluster/leave",
                headers={"Authorization": f"Bearer {cluster.secret}"},
                timeout=10,
            )
            assert r.status_code == 200, r.text
            assert r.json() == {"node_id": leaving.id, "leave": "remove"}
            cluster.stop(leaving)

        t_stop, t_gone = publish_through(publishers, scale_down, "the scale-down")
        print(
            f"\nscaled down {leaving.id} (leading shard {shard}) in {t_gone - t_stop:.2f}s; "
            f"STOMP client told {stomp_mover.farewells}, AMQP client told "
            f"{amqp_mover.farewells}"
        )
        # told to go elsewhere, and each reconnected once, to a survivor
        assert stomp_mover.connections == 2 and stomp_mover.node is s1
        assert amqp_mover.connections == 2 and amqp_mover.node is s2
        assert any("node shutting down" in m for m in stomp_mover.farewells)
        assert any("320" in m and "node shutting down" in m for m in amqp_mover.farewells)
        # the survivors kept committing: each publisher confirmed AFTER since the stop
        for p in publishers:
            assert len(p.confirmed(t_gone)) >= AFTER, p.tag
        assert_nothing_confirmed_lost(publishers, s2, q)

        # the streams go on with the two survivors as their replicas
        expected = sorted([s1.id, s2.id])

        def replicas() -> bool:
            info = s1.cluster_info()
            return info is not None and all(s["peers"] == expected for s in info["shards"])

        eventually(replicas, 30, f"every shard's stream has {expected} as its replicas")
        new_leader = cluster.leaders(timeout=30, nodes=[s1, s2])[shard]
        assert new_leader in (s1, s2)
        print(f"replicas {expected} on every stream")

        # scaled up again (the StatefulSet's pod comes back with its volume): the streams
        # grow back onto it, and it may lead again
        cluster.restart(leaving)
        expected = sorted(n.id for n in cluster.nodes)
        eventually(replicas, 60, f"every shard's stream has {expected} as its replicas")
        cluster.wait_formed(timeout=60)
        print(f"scaled up: replicas {expected} on every stream")
