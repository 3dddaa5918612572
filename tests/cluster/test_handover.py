"""Handover (MailerQ): a message published to a node for a destination it does not lead is
handed to the leader, and while the leadership moves (a planned stop of the leader) it waits
for the new leader instead of being refused. Publishers with confirms (AMQP) and receipts
(STOMP) on the two other nodes see no failed publish at all across the move, and nothing
confirmed is lost."""

from __future__ import annotations

import pytest

from .harness import Cluster
from .test_failover import (
    AmqpPublisher,
    Publisher,
    StompPublisher,
    assert_nothing_confirmed_lost,
    declare_durable,
    publish_through,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


def test_publishes_during_a_planned_leader_move_are_handed_over_not_refused(
    cluster: Cluster,
) -> None:
    leaders = cluster.wait_formed(timeout=30)
    leaving = next(iter(leaders.values()))
    shard = min(s for s, n in leaders.items() if n is leaving)
    s1, s2 = cluster.others(leaving)
    q = cluster.queue_in_shard(shard, "handover")
    declare_durable(s1, q)
    publishers: list[Publisher] = [AmqpPublisher("amqp", s1, q), StompPublisher("stomp", s2, q)]
    t_stop, t_gone = publish_through(publishers, lambda: cluster.stop(leaving), "the stop")
    refused = [(p.tag, a.outcome) for p in publishers for a in p.snapshot() if not a.confirmed]
    confirmed = {p.tag: len(p.confirmed()) for p in publishers}
    print(
        f"\nstopped {leaving.id} (leading shard {shard}) in {t_gone - t_stop:.2f}s; "
        f"confirmed {confirmed}; refused {refused}"
    )
    assert not refused, refused
    assert cluster.leaders(timeout=30, nodes=[s1, s2])[shard] in (s1, s2)
    assert_nothing_confirmed_lost(publishers, s2, q)
