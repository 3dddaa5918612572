"""Tests of ``polymq_core.replication.jetstream`` without NATS (the stream itself is in
tests/integration/core/test_replog.py)."""

from __future__ import annotations

from polymq_core.replication.jetstream import ShardLog


def test_a_shard_log_names_its_stream_and_subject() -> None:
    shard_log = ShardLog(None, 7, "a", replicas=3)  # type: ignore[arg-type]
    assert (shard_log.stream, shard_log.subject) == ("POLYMQ_SHARD_7", "polymq.shard.7")
    assert ShardLog(None, 0, "a", replicas=1, prefix="T").stream == "T_0"  # type: ignore[arg-type]
