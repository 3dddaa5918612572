"""NATS run apart from the core, as the chart's sidecar runs it: each node's nats-server is a
``polymq nats`` process of its own (configured from the core's settings, logins derived from
the cluster secret) and each ``polymq run`` is given ``--nats``. The three form one cluster
and a persistent message published on one node is consumed on another."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .harness import (
    http_ack,
    http_publish_ok,
    http_pull,
    running_cluster,
    unique,
)

pytestmark = pytest.mark.timeout(240)


def _nats_info(port: int) -> str:
    """The INFO line a NATS client port greets with."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        return s.recv(4096).decode(errors="replace")


def test_three_nodes_with_nats_run_apart_form_one_cluster(tmp_path: Path) -> None:
    with running_cluster(tmp_path, nats_apart=True) as cluster:
        first, _, last = cluster.nodes
        for node in cluster.nodes:
            assert node.nats_proc is not None and node.nats_proc.poll() is None, node.id
            # polymq started no nats-server of its own: its ports file names polymq alone
            assert node.proc is not None and len(node.proc.pids) == 1, node.proc.pids
            info = _nats_info(node.nats_port)
            assert info.startswith("INFO ") and '"auth_required":true' in info, info
            assert f'"server_name":"{node.id}"' in info, info
            assert "Authorization Violation" not in node.nats_log(), node.nats_log()
        queue = unique("apart")
        http_publish_ok(first, queue, "kept apart", persistent=True)
        [message] = http_pull(last, queue, 10, wait=5.0)
        assert message["body"] == "kept apart" and message["persistent"] is True
        assert http_ack(last, [message["receipt"]])["settled"] == 1
