"""Tests for polymq_core.topics.bindings: the index of every binding (pattern -> queue)."""

from __future__ import annotations

import gc
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymq_core.topics.bindings import BindingTable
from polymq_core.topics.trie import matches

from .test_trie import patterns, topics

Q1, Q2 = "queue/audit", "queue/billing"


def test_add_is_idempotent_and_counts() -> None:
    table = BindingTable()
    assert table.add("orders.#", Q1)
    assert not table.add("orders.#", Q1)
    assert table.add("orders.*.eu", Q1)
    assert table.add("orders.#", Q2)
    assert (len(table), table.queues(), table.count(Q1), table.count(Q2)) == (3, 2, 2, 1)
    assert table.of(Q1) == ["orders.#", "orders.*.eu"]
    assert table.of("queue/none") == []
    assert table.has("orders.#", Q2) and not table.has("orders.*.eu", Q2)


def test_match_gives_each_queue_once() -> None:
    table = BindingTable()
    table.add("orders.#", Q1)
    table.add("orders.*.eu", Q1)
    table.add("orders.new.eu", Q1)
    table.add("ord*", Q2)
    assert table.match("orders.new.eu") == {Q1, Q2}
    assert table.match("orders") == {Q1, Q2}
    assert table.match("ordinal") == {Q2}
    assert table.match("refunds.eu") == set()


def test_remove_and_drop_queue() -> None:
    table = BindingTable()
    table.add("a.#", Q1)
    table.add("a.b", Q1)
    table.add("a.b", Q2)
    assert not table.remove("a.b", "queue/none")
    assert not table.remove("x.y", Q1)
    assert table.remove("a.b", Q1)
    assert table.of(Q1) == ["a.#"]
    assert table.match("a.b") == {Q1, Q2}
    assert table.drop_queue(Q1) == ["a.#"]
    assert table.drop_queue(Q1) == []
    assert table.match("a.b") == {Q2}
    assert table.remove("a.b", Q2)
    assert (len(table), table.queues(), table.match("a.b")) == (0, 0, set())


@pytest.mark.parametrize("pattern", ["a..b", "a.b*c", "a.*.b*", ""])
def test_a_bad_pattern_is_refused_and_leaves_nothing(pattern: str) -> None:
    table = BindingTable()
    with pytest.raises(ValueError):
        table.add(pattern, Q1)
    assert (len(table), table.queues(), table.of(Q1)) == (0, 0, [])


def test_a_queue_key_is_one_object_for_all_its_patterns() -> None:
    table = BindingTable()
    for i in range(3):
        table.add(f"t{i}", "".join(["queue/", "shared"]))  # three equal, distinct strings
    (a,), (b,), (c,) = table.match("t0"), table.match("t1"), table.match("t2")
    assert a is b is c


queues = st.sampled_from([Q1, Q2, "queue/c"])


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(["add", "remove", "drop"]), patterns, queues)),
    probe=st.lists(topics, min_size=1, max_size=6),
)
def test_table_agrees_with_a_model(ops: list[tuple[str, str, str]], probe: list[str]) -> None:
    table = BindingTable()
    model: set[tuple[str, str]] = set()
    for op, pattern, queue in ops:
        if op == "add":
            assert table.add(pattern, queue) == ((pattern, queue) not in model)
            model.add((pattern, queue))
        elif op == "remove":
            assert table.remove(pattern, queue) == ((pattern, queue) in model)
            model.discard((pattern, queue))
        else:
            gone = sorted(p for p, q in model if q == queue)
            assert table.drop_queue(queue) == gone
            model -= {(p, queue) for p in gone}
    assert len(table) == len(model)
    for queue in (Q1, Q2, "queue/c"):
        assert table.of(queue) == sorted(p for p, q in model if q == queue)
    for topic in probe:
        assert table.match(topic) == {q for p, q in model if matches(p, topic)}


def _footprint(n: int) -> tuple[int, BindingTable]:
    """Bytes allocated by ``n`` bindings of AMQP shape, each queue bound by one routing key
    and every tenth by a wildcard too (strings made as a request would make them)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    table = BindingTable()
    for i in range(n):
        queue = f"queue/amqp.default.q-{i // 2:08d}"
        if i % 10 == 9:
            table.add(f"amqp.default.events.{i % 997}.*", queue)
        else:
            table.add(f"amqp.default.events.key-{i:08d}", queue)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return size, table


def test_100k_bindings_fit_in_a_few_hundred_bytes_each() -> None:
    n = 100_000
    size, table = _footprint(n)
    assert len(table) == n
    per_binding = size / n
    print(f"\n{n} bindings: {size / 2**20:.1f} MiB, {per_binding:.0f} bytes per binding")
    assert per_binding < 400, per_binding
    # routing stays a matter of matches, not of bindings
    t0 = time.perf_counter()
    for _ in range(10_000):
        table.match("amqp.default.events.key-00000042")
    assert "queue/amqp.default.q-00000024" in table.match("amqp.default.events.49.x")
    assert time.perf_counter() - t0 < 1.0


def test_a_queue_with_many_patterns_moves_from_tuple_to_set_and_back() -> None:
    table = BindingTable()
    names = [f"k{i}" for i in range(20)]
    for name in names:
        assert table.add(name, Q1)
        assert not table.add(name, Q1)
    assert table.of(Q1) == sorted(names)
    for name in names[:-1]:
        assert table.remove(name, Q1)
        assert not table.remove(name, Q1)
        assert table.has(names[-1], Q1) and not table.has(name, Q1)
    assert table.of(Q1) == [names[-1]]
    assert table.match(names[-1]) == {Q1}
