"""Tests for polymq_amqp.e2e: matching exchange-to-exchange bindings by the source's type,
and the exchanges a publish reaches (chains, cycles, what is not cached)."""

from __future__ import annotations

from typing import Any

import pytest

from polymq_amqp.topology import BindingRecord, ExchangeRecord
from polymq_server.exchanges.kinds import ExchangeType
from polymq_server.exchanges.records import ExchangeBinding
from polymq_server.exchanges.resolution import (
    Missing,
    destinations,
    matches,
    reached,
    topic_matches,
)


@pytest.mark.parametrize(
    ("pattern", "key", "match"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "", True),
        ("#.c", "a.b.c", True),
        ("*.b.#", "a.b", True),
        ("*", "", True),  # one (empty) word
        ("a.*.c", "a..c", True),
        ("a.b", "a.c", False),
    ],
)
def test_topic_matching(pattern: str, key: str, match: bool) -> None:
    assert topic_matches(pattern, key) is match


def test_matching_by_the_source_type() -> None:
    assert matches(ExchangeType.FANOUT, "x", {}, "anything", None)
    assert matches(ExchangeType.DIRECT, "k", {}, "k", None)
    assert not matches(ExchangeType.DIRECT, "k.#", {}, "k.a", None)  # literal
    assert matches(ExchangeType.TOPIC, "k.#", {}, "k.a", None)
    assert matches(ExchangeType.HEADERS, "", {"x-match": "any", "h": "1"}, "", {"h": "1"})
    assert not matches(ExchangeType.HEADERS, "", {"h": "1"}, "", {"h": "2"})


def _reach(
    exchanges: dict[str, ExchangeRecord],
    bindings: dict[str, list[ExchangeBinding]],
    source: str,
    key: str,
) -> list[str]:
    def plain(args: dict[str, Any]) -> dict[str, Any]:
        return args

    got = reached(exchanges[source], key, None, exchanges.get, bindings.get, plain)
    return [x.name for x in got]


def test_chains_and_cycles_reach_each_exchange_once() -> None:
    ex = {n: ExchangeRecord(n, t) for n, t in (("a", "direct"), ("b", "topic"), ("c", "fanout"))}
    bind = {
        "a": [ExchangeBinding("a", "b", "k", {})],
        "b": [ExchangeBinding("b", "c", "k.#", {}), ExchangeBinding("b", "a", "#", {})],
        "c": [ExchangeBinding("c", "a", "", {}), ExchangeBinding("c", "b", "", {})],
    }
    assert _reach(ex, bind, "a", "k") == ["a", "b", "c"]
    assert _reach(ex, bind, "a", "other") == ["a"]
    assert _reach(ex, bind, "c", "z") == ["c", "a", "b"]
    with pytest.raises(Missing) as info:
        _reach(ex, {"a": bind["a"]}, "a", "k")  # b's bindings are not cached
    assert (info.value.what, info.value.name) == ("sources", "b")


def test_destinations_reach_each_queue_once() -> None:
    a, b, h = (
        ExchangeRecord("a", "topic"),
        ExchangeRecord("b", "fanout"),
        ExchangeRecord("h", "headers"),
    )
    records = {
        "a": [BindingRecord("a", "q1", "k.*", {}, "p"), BindingRecord("a", "q9", "z", {}, "p")],
        "b": [BindingRecord("b", "q1", "", {}, "p"), BindingRecord("b", "q2", "", {}, "p")],
        "h": [BindingRecord("h", "q3", "", {"x": "1"}, None)],
    }

    def route(reached: list[ExchangeRecord], headers: dict[str, Any] | None = None) -> list[str]:
        return destinations(
            reached,
            "k.x",
            headers,
            records.get,
            lambda name: f"topic/amqp.{name}.k.x",
            lambda name: f"queue/{name}",
            lambda args: args,
        )

    assert route([a]) == ["topic/amqp.a.k.x"]  # one exchange: its topic, no records read
    assert route([b]) == ["topic/amqp.b.k.x"]
    # b's q1 is a's too: b sends to its other queue instead of its topic
    assert route([a, b]) == ["topic/amqp.a.k.x", "queue/q2"]
    assert route([b, a]) == ["topic/amqp.b.k.x"]  # a's only match, q1, has it already
    # a headers exchange: its matching queues, and its topic for subscribers (STOMP)
    assert route([a, h], {"x": "1"}) == ["topic/amqp.a.k.x", "topic/amqp.h.k.x", "queue/q3"]
    assert route([h], {"x": "2"}) == ["topic/amqp.h.k.x"]
    with pytest.raises(Missing):
        route([a, ExchangeRecord("c", "direct")])  # c's records are not cached
