"""polymq_core.cluster without NATS: which of the ``--peers`` a node takes for itself."""

from __future__ import annotations

import pytest

from polymq_core import cluster as cluster_mod


def test_a_node_skips_itself_in_the_peers_by_address_or_by_its_pod_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_mod.socket, "gethostname", lambda: "polymq-core-1")
    peers = (
        ("polymq-core-0.polymq-core-headless", 7422),
        ("polymq-core-1.polymq-core-headless", 7422),  # this pod: its name may not resolve yet
        ("127.0.0.1", 7422),  # this machine
        ("127.0.0.1", 7423),  # another node on this machine
    )
    assert cluster_mod._others(peers, 7422) == (
        ("polymq-core-0.polymq-core-headless", 7422),
        ("127.0.0.1", 7423),
    )
