"""A node that stops gracefully hands what only its memory held to the shards' next leaders:
transient messages in the queues it led (ready ones, and ones delivered but not acknowledged,
which come back flagged redelivered), and its non-durable queues themselves. Persistent
messages of durable queues come back from the log, once (they are not sent again)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from .harness import (
    HTTP_TIMEOUT,
    Cluster,
    drain,
    http_publish_ok,
    http_pull,
    http_stats,
)

pytestmark = pytest.mark.timeout(180)

TRANSIENT = 30
PERSISTENT = 5
PULLED = 5


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


def _bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


def test_a_stopping_leader_hands_its_transient_messages_to_the_next(cluster: Cluster) -> None:
    leaders = cluster.wait_formed(timeout=60)
    shard, leaving = min(leaders.items())
    s1, s2 = cluster.others(leaving)
    durable = cluster.queue_in_shard(shard, "keep")
    loose = cluster.queue_in_shard(shard, "loose")
    r = requests.put(
        f"{s1.url()}/v1/queue/{loose}",
        json={"durable": False, "max_priority": 9},
        timeout=HTTP_TIMEOUT,
    )
    assert r.status_code == 200, r.text

    # through a survivor (forwarded to the leader): transient messages first, then
    # persistent ones, into the durable queue; transient ones of two priorities into the
    # non-durable one
    sent_durable = [f"d{i}" for i in range(TRANSIENT)]
    for body in sent_durable:
        http_publish_ok(s1, durable, body, persistent=False)
    kept = [f"p{i}" for i in range(PERSISTENT)]
    for body in kept:
        http_publish_ok(s1, durable, body, persistent=True)
    sent_loose = [(f"n{i}", 7 if i % 3 == 0 else 2) for i in range(TRANSIENT)]
    for body, priority in sent_loose:
        http_publish_ok(s1, loose, body, persistent=False, priority=priority)

    # delivered, never acknowledged (leases on the leader)
    pulled_durable = _bodies(http_pull(s1, durable, PULLED, visibility=300))
    pulled_loose = _bodies(http_pull(s1, loose, PULLED, visibility=300))
    assert pulled_durable == sent_durable[:PULLED]
    by_priority = [b for b, _ in sorted(sent_loose, key=lambda s: -s[1])]
    assert pulled_loose == by_priority[:PULLED]

    logged = len(leaving.log())  # (the cluster is shared: earlier stops logged too)
    started = time.monotonic()
    cluster.stop(leaving)
    stopped_in = time.monotonic() - started

    got_durable = drain(s2, durable, expect=TRANSIENT + PERSISTENT, timeout=30)
    got_loose = drain(s2, loose, expect=TRANSIENT, timeout=30)
    print(
        f"stopped in {stopped_in:.2f}s; drained {len(got_durable)} + {len(got_loose)}"
        f" messages in {time.monotonic() - started - stopped_in:.2f}s"
    )
    # every message once: nothing lost, nothing sent twice (the persistent ones came back
    # from the log, not from the hand-over)
    bodies = _bodies(got_durable)
    assert sorted(bodies) == sorted(sent_durable + kept), bodies
    assert _bodies(got_loose) == by_priority, _bodies(got_loose)
    # the transient ones in their order (after the persistent ones the log gave back)
    assert [b for b in bodies if b.startswith("d")] == sent_durable

    # the unacknowledged ones come back flagged, the others do not (the persistent ones
    # the log gave back were never delivered: docs/cluster.md, deliveries are marked)
    for m in got_durable + got_loose:
        pulled = m["body"] in pulled_durable + pulled_loose
        assert m["redelivered"] is pulled, m

    # the non-durable queue came along with its options
    options = http_stats(s2, loose)["options"]
    assert options["durable"] is False and options["max_priority"] == 9, options
    # and the leaving node said what it handed
    handed = [line for line in leaving.log()[logged:].splitlines() if "handed to node" in line]
    assert handed and f"{2 * TRANSIENT} of {2 * TRANSIENT} transient" in handed[0], handed
