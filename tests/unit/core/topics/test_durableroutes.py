"""Tests for polymq_core.topics.durableroutes: every shard's durable bindings, as its log's entries
(and a snapshot's load) change them."""

from __future__ import annotations

from polymq_core.destinations.shard import shard_index
from polymq_core.store.schema import WriteKind
from polymq_core.topics.durableroutes import DurableRoutes

SAVE = WriteKind.SAVE_BINDINGS.value
DELETE = WriteKind.DELETE_BINDINGS.value
GONE = WriteKind.DELETE_DESTINATION.value
APPEND = WriteKind.APPEND_MANY.value


def routes() -> DurableRoutes:
    return DurableRoutes(lambda key: shard_index(key, 4))


def test_entries_bind_and_unbind() -> None:
    r = routes()
    q1, q2 = "queue/one", "queue/two"
    s1, s2 = shard_index(q1, 4), shard_index(q2, 4)
    assert r.shards("a.b") == set()
    shard1, shard2 = r.of(s1), r.of(s2)
    shard1.apply([[APPEND, q1, [[1, b"x"]]], [SAVE, q1, ["a.*", "c"]]])
    shard2.apply([[SAVE, q2, ["a.#"]]])
    assert r.shards("a.b") == {s1, s2}
    assert r.shards("c") == {s1}
    assert r.shards("a") == {s2}
    shard1.apply([[DELETE, q1, ["a.*"]]])
    assert r.shards("a.b") == {s2}
    shard2.apply([[GONE, q2]])
    assert r.shards("a.b") == set()
    assert r.size == 1  # q1's "c"


def test_a_load_replaces_what_was_known_of_that_shard_only() -> None:
    r = routes()
    q1, q2 = "queue/one", "queue/two"
    s1, s2 = shard_index(q1, 4), shard_index(q2, 4)
    assert s1 != s2
    r.of(s1).apply([[SAVE, q1, ["x"]]])
    r.of(s2).apply([[SAVE, q2, ["x"]]])
    r.of(s1).load([(q1, "y"), (q1, "bad..pattern")])  # a bad one is skipped
    assert r.shards("x") == {s2}
    assert r.shards("y") == {s1}


def test_malformed_writes_are_skipped() -> None:
    r = routes()
    r.of(0).apply([[], [SAVE], [SAVE, "queue/x", None], [SAVE, "queue/y", ["ok"]]])
    assert r.size == 1
