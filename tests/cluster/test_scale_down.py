"""Scaling three nodes down to two under load: the node that leads the publishers' shard is
stopped gracefully (SIGTERM, as a pod's termination), while publishers with confirms (AMQP
on one survivor, STOMP receipts on the other) and a STOMP publisher connected to the leaving
node itself (which moves to a survivor when its connection ends) keep publishing persistent
messages, each retried until confirmed. Nothing confirmed is lost, publishing resumes, and
the two nodes left serve everything."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from .harness import Cluster, Node, StompConn, running_cluster
from .test_failover import (
    AmqpPublisher,
    Publisher,
    StompPublisher,
    assert_nothing_confirmed_lost,
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_cluster(tmp_path_factory.mktemp("scale-down")) as c:
        yield c


def test_a_leader_stopped_gracefully_under_load_loses_nothing(cluster: Cluster) -> None:
    leaders = cluster.wait_formed(timeout=30)
    leaving = next(iter(leaders.values()))
    shard = min(s for s, n in leaders.items() if n is leaving)
    s1, s2 = cluster.others(leaving)
    q = cluster.queue_in_shard(shard, "down")
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
