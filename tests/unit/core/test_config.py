"""The core's settings from ``POLYMQ_*``: the replicated log's purge settings reach the
cluster node, and bad values are start-up errors that name their variable."""

from __future__ import annotations

import pytest

from polymq.config import ConfigError, from_env
from polymq_core import snapshot
from polymq_core.config import CoreSettings
from polymq_core.service import CoreService

CLUSTER = {
    "POLYMQ_NODE_ID": "a",
    "POLYMQ_PEERS": "127.0.0.1:17422,127.0.0.1:27422",
    "POLYMQ_CLUSTER_SECRET": "s" * 32,
}


def test_the_log_settings_default_to_the_purge_defaults() -> None:
    s = from_env(CoreSettings, env=CLUSTER)
    assert s.log_purge_every == snapshot.PURGE_EVERY
    assert s.log_keep_entries == snapshot.KEEP_ENTRIES
    assert s.log_max_entries == snapshot.MAX_ENTRIES


@pytest.mark.parametrize(("max_entries", "most"), [("50000", 50_000), ("0", None)])
async def test_the_log_settings_reach_the_cluster_node(max_entries: str, most: int | None) -> None:
    env = {
        **CLUSTER,
        "POLYMQ_LOG_PURGE_EVERY": "5",
        "POLYMQ_LOG_KEEP_ENTRIES": "100",
        "POLYMQ_LOG_MAX_ENTRIES": max_entries,
    }
    service = CoreService(from_env(CoreSettings, env=env))
    node = service.cluster
    assert node is not None
    assert (node.purge_every, node.keep_entries, node.max_entries) == (5.0, 100, most)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("POLYMQ_LOG_PURGE_EVERY", "0"),
        ("POLYMQ_LOG_PURGE_EVERY", "-1"),
        ("POLYMQ_LOG_PURGE_EVERY", "100000"),
        ("POLYMQ_LOG_KEEP_ENTRIES", "-5"),
        ("POLYMQ_LOG_MAX_ENTRIES", "9999"),  # fewer than the 10,000 always kept
    ],
)
def test_bad_log_settings_are_start_up_errors(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var):
        from_env(CoreSettings, env={**CLUSTER, var: value})
