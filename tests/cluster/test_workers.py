"""A replicated core whose nodes each run ``polymq run --workers 2`` (docs/workers.md): STOMP
publishes taken by either process of node 1 reach queues led by every node, and are consumed
over AMQP by either process of node 3; a node killed with ``kill -9`` takes its worker with
it, and comes back on its data with its worker."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil
import pytest

from ..procs import node_processes, spread_over
from .harness import Node, pika_connection, running_cluster, stomp_conn

pytestmark = pytest.mark.timeout(300)

CONNECTIONS = 8


def _family(node: Node) -> list[int]:
    assert node.proc is not None
    return [p.pid for p in node_processes(node.proc)]


def test_workers_serve_every_leader_and_die_with_their_node(tmp_path: Path) -> None:
    with running_cluster(tmp_path, env={"POLYMQ_WORKERS": "2"}) as cluster:
        n1, _, n3 = cluster.nodes
        for node in cluster.nodes:
            assert len(_family(node)) == 2, node.proc.log() if node.proc else node
            assert set(_family(node)) <= set(node.pids)  # the harness kills them all
        leaders = cluster.wait_balanced()
        queues = {s: cluster.queue_in_shard(s, "wk") for s in leaders}
        sent: list[tuple[str, str]] = []
        with contextlib.ExitStack() as stack:
            conns = spread_over(  # (into both processes of node 1: it asserts so)
                lambda: stack.enter_context(stomp_conn(n1)),
                n1.ports["stomp"],
                _family(n1),
                CONNECTIONS,
            )
            for i, conn in enumerate(conns):
                for q in queues.values():
                    body = f"{q}-{i}"
                    conn.send_ok(f"/queue/{q}", body, persistent="true")  # (its receipt)
                    sent.append((q, body))
        got: list[tuple[str, str]] = []
        with contextlib.ExitStack() as stack:
            readers = spread_over(
                lambda: stack.enter_context(pika_connection(n3)),
                n3.ports["amqp"],
                _family(n3),
                CONNECTIONS,
            )
            channels = [r.channel() for r in readers]
            deadline = time.monotonic() + 60
            for k, q in enumerate(queues.values()):
                ch = channels[k % len(channels)]
                while sum(1 for qq, _ in got if qq == q) < len(conns):
                    method, _, body = ch.basic_get(q, auto_ack=True)
                    if method is None:
                        assert time.monotonic() < deadline, f"{q}: {got}"
                        time.sleep(0.05)
                        continue
                    got.append((q, body.decode()))
        assert sorted(got) == sorted(sent), f"{len(got)} of {len(sent)}"

        family = [psutil.Process(pid) for pid in _family(n1)]
        n1.kill()  # SIGKILL to every process of the node (the harness asserts none survive)
        assert not [p for p in family if p.is_running() and p.status() != "zombie"]
        n1.start()
        cluster.wait_formed(timeout=90)
        assert len(_family(n1)) == 2
