"""The last two nodes of three (the third killed: no JetStream majority once one of them
stops) stopped at the same moment, as a test's teardown or a whole StatefulSet's deletion
does: each exits 0 in a bounded time (a CI run saw one stuck in its stop until killed: a
shard follower had swallowed the stop's cancel)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import pytest

from .harness import Node, running_cluster

pytestmark = pytest.mark.timeout(240)

STOP_WITHIN = 15.0  # seconds each may take (the harness allows 20)


def test_the_last_two_nodes_stop_together_without_a_majority(tmp_path: Any) -> None:
    with running_cluster(tmp_path) as cluster:
        leaders = cluster.wait_formed(timeout=60)
        by_leader = collections.Counter(n.id for n in leaders.values())
        victim = cluster.node_by_id(by_leader.most_common(1)[0][0])
        cluster.kill(victim)
        survivors = cluster.others(victim)
        cluster.wait_formed(timeout=60, nodes=survivors)
        took: dict[str, float] = {}
        problems: dict[str, list[str]] = {}

        def stop(node: Node) -> None:
            started = time.monotonic()
            problems[node.id] = node.stop(timeout=STOP_WITHIN)
            took[node.id] = time.monotonic() - started

        threads = [threading.Thread(target=stop, args=(n,)) for n in survivors]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        print(f"stopped in {took}")
        for node in survivors:
            assert problems.get(node.id) == [], (problems, node.log_tail())
