"""Tests for polymq_amqp.e2e: matching exchange-to-exchange bindings by the source's type,
and the exchanges a publish reaches (chains, cycles, what is not cached)."""

from __future__ import annotations

from typing import Any

import pytest

from polymq_amqp.e2e import ExchangeBinding, Missing, matches, reached, topic_matches
from polymq_amqp.exchanges import ExchangeType
from polymq_amqp.topology import ExchangeRecord


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
