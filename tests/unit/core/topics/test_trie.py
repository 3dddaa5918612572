"""Tests for polymq_core.topics.trie: pattern rules, the router, and the reference oracle."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymq_core.topics.trie import TopicRouter, matches, validate_pattern, validate_topic

# (pattern, topic, does it match?)
CASES: list[tuple[str, str, bool]] = [
    # system topics: only patterns that name "system" reach them (MQTT's $SYS rule)
    ("#", "system.peers", False),
    ("#", "system", False),
    ("*", "system", False),
    ("*.peers", "system.peers", False),
    ("#.peers", "system.peers", False),
    ("sys*", "system.peers", False),
    ("s*", "system", False),
    ("system.#", "system.peers", True),
    ("system.*", "system.peers", True),
    ("system", "system", True),
    ("system*", "system.config", True),
    ("system.p*", "system.peers", True),
    ("#", "systemx.a", True),
    ("s*", "systemx", True),
    ("*.system", "a.system", True),
    # AMQP's direct reply-to channels likewise: no one's "#" hears anyone's replies
    ("#", "amqp-reply.tok3n", False),
    ("*.*", "amqp-reply.tok3n", False),
    ("amqp*", "amqp-reply.tok3n", False),
    ("amqp-reply.*", "amqp-reply.tok3n", True),
    ("amqp-reply.tok3n", "amqp-reply.tok3n", True),
    ("#", "amqp-replyx.a", True),
    # exact names: whole name only, no partial segments, case-sensitive
    ("news", "news", True),
    ("news", "news.sport", False),
    ("news.sport", "news", False),
    ("news.sp", "news.sport", False),
    ("news.sport", "news.sp", False),
    ("a.b", "a.b", True),
    ("a", "A", False),
    ("x:1-y_2", "x:1-y_2", True),
    # '*' as a segment: exactly one segment
    ("news.*", "news.sport", True),
    ("news.*", "news", False),
    ("news.*", "news.sport.x", False),
    ("news.*", "newsx.sport", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("*.*", "a.b.c", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("*.b", "a.b", True),
    ("*.b", "b", False),
    # '#' as a segment: zero or more segments
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#.#", "a", True),
    ("#.#", "a.b.c", True),
    ("news.#", "news", True),
    ("news.#", "news.a", True),
    ("news.#", "news.a.b", True),
    ("news.#", "newsx", False),
    ("news.#", "x.news", False),
    ("a.#.z", "a.z", True),
    ("a.#.z", "a.b.z", True),
    ("a.#.z", "a.b.c.z", True),
    ("a.#.z", "a.b", False),
    ("a.#.z", "z", False),
    ("a.#.z", "a.z.b", False),
    ("a.#.#.b", "a.b", True),
    ("a.#.#.b", "a.x.b", True),
    ("a.#.#.b", "a.x.y.z.b", True),
    ("a.#.#.b", "a.b.c", False),
    ("#.z", "z", True),
    ("#.z", "a.b.z", True),
    ("#.z", "a.zz", False),
    ("*.#", "a", True),
    ("*.#", "a.b", True),
    ("#.*", "a", True),
    ("#.*.#", "a.b.c", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.#.*", "a", False),
    # trailing '*' glued to a segment: prefix of the full name, across segments
    ("news.sp*", "news.sport", True),
    ("news.sp*", "news.spain.x", True),
    ("news.sp*", "news.sp", True),
    ("news.sp*", "news.s", False),
    ("news.sp*", "news.xsport", False),
    ("news.sp*", "newsx.sport", False),
    ("news.sport*", "news.sport.x", True),
    ("log*", "log", True),
    ("log*", "logs.x", True),
    ("log*", "lo", False),
    ("log*", "blog", False),
    ("a*", "a.b.c", True),
]

VALID = ["a", "a.b:c-d_e", "*", "#", "#.#", "*.*", "a.#.#.b", "a.*.#", "a*", "a.b*", "a.b-*", "9*"]

INVALID = [
    "",
    ".",
    "..",
    "a..b",
    ".a",
    "a.",
    ".*",
    "#.",
    "a*b",
    "*a",
    "a*.b",
    "a#",
    "a.#b",
    "**",
    "#*",
    "a*b*",
    "a.*.b*",
    "a.#.b*",
    "*.a*",
    "a b",
    "a/b",
    "caf\u00e9",
    "a.b\n",
]


@pytest.mark.parametrize(("pattern", "topic", "expected"), CASES)
def test_reference_matches(pattern: str, topic: str, expected: bool) -> None:
    assert matches(pattern, topic) is expected


@pytest.mark.parametrize(("pattern", "topic", "expected"), CASES)
def test_router_matches(pattern: str, topic: str, expected: bool) -> None:
    router: TopicRouter[str] = TopicRouter()
    router.add(pattern, "sub")
    router.add("unrelated.other", "other")
    assert router.match(topic) == ({"sub"} if expected else set())


def test_all_cases_in_one_router() -> None:
    router: TopicRouter[str] = TopicRouter()
    for pattern, _, _ in CASES:
        router.add(pattern, pattern)
    for _, topic, _ in CASES:
        assert router.match(topic) == {p for p, _, _ in CASES if matches(p, topic)}


@pytest.mark.parametrize("pattern", VALID)
def test_valid_patterns(pattern: str) -> None:
    validate_pattern(pattern)
    TopicRouter[int]().add(pattern, 1)


@pytest.mark.parametrize("pattern", INVALID)
def test_invalid_patterns_raise(pattern: str) -> None:
    router: TopicRouter[int] = TopicRouter()
    with pytest.raises(ValueError, match="invalid pattern"):
        validate_pattern(pattern)
    with pytest.raises(ValueError):
        router.add(pattern, 1)
    with pytest.raises(ValueError):
        router.remove(pattern, 1)
    with pytest.raises(ValueError):
        router.count(pattern)
    assert len(router) == 0


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("a..b", "empty segment"),
        ("a*b", "whole segments"),
        ("a.#b", "whole segments"),
        ("a.*.b*", "prefix pattern"),
        ("a/b", "characters other than"),
    ],
)
def test_error_messages_say_why(pattern: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        validate_pattern(pattern)


def test_non_string_pattern_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        validate_pattern(None)  # type: ignore[arg-type]


def test_validate_topic() -> None:
    validate_topic("a.b:c-d_e")
    for bad in ["", "a.*", "#", "a*", "a..b", "a b"]:
        with pytest.raises(ValueError, match="invalid topic"):
            validate_topic(bad)


def test_subscriber_once_even_if_several_patterns_match() -> None:
    router: TopicRouter[str] = TopicRouter()
    for pattern in ["news.sport", "news.*", "news.#", "#", "news.sp*", "n*"]:
        router.add(pattern, "s1")
    router.add("news.#", "s2")
    assert len(router) == 7
    assert router.match("news.sport") == {"s1", "s2"}


def test_count_len_and_idempotent_add() -> None:
    router: TopicRouter[str] = TopicRouter()
    for pattern in ["a.b", "a.*", "a*"]:
        router.add(pattern, "x")
        router.add(pattern, "x")
        router.add(pattern, "y")
    router.add("a.#", "x")
    assert len(router) == 7
    assert [router.count(p) for p in ["a.b", "a.*", "a*", "a.#", "a", "a.c", "b*"]] == [
        2,
        2,
        2,
        1,
        0,
        0,
        0,
    ]
    assert router.match("a.b") == {"x", "y"}


def test_remove() -> None:
    router: TopicRouter[str] = TopicRouter()
    router.add("a.*", "x")
    router.add("a.*", "y")
    router.add("a*", "x")
    router.remove("a.*", "x")
    router.remove("a.*", "nobody")  # absent pair: no-op
    router.remove("b.*", "x")  # absent pattern: no-op
    router.remove("b*", "x")
    router.remove("b", "x")
    assert len(router) == 2
    assert router.count("a.*") == 1
    assert router.match("a.b") == {"x", "y"}  # x still via the prefix 'a*'
    router.remove("a*", "x")
    assert router.match("a.b") == {"y"}
    router.remove("a.*", "y")
    assert router.match("a.b") == set()
    assert len(router) == 0


@pytest.mark.parametrize("sub", [None, 0, "", (), frozenset({1, 2}), False])
def test_falsy_and_odd_subscribers(sub: Any) -> None:
    router: TopicRouter[Any] = TopicRouter()
    for pattern in ["a.b", "a.*", "a.b*"]:
        router.add(pattern, sub)
        assert router.count(pattern) == 1
    assert router.match("a.b") == {sub}
    for pattern in ["a.b", "a.*", "a.b*"]:
        router.remove(pattern, sub)
    assert router.match("a.b") == set()
    assert len(router) == 0


def assert_empty(router: TopicRouter[Any]) -> None:
    assert len(router) == 0
    assert router._exact == {}
    assert router._wild == {}
    assert router._prefix == {}
    assert router._prefix_lens == {}
    root = router._root
    assert (root.children, root.star, root.hash, root.pattern) == (None, None, None, None)


def test_remove_prunes_everything() -> None:
    router: TopicRouter[int] = TopicRouter()
    pairs = [(p, i) for p, _, _ in CASES for i in range(3)]
    for pattern, sub in pairs:
        router.add(pattern, sub)
    assert len(router) == len({(p, s) for p, s in pairs})
    assert router._root.children is not None
    for pattern, sub in reversed(pairs):
        router.remove(pattern, sub)
    assert_empty(router)


def test_remove_prunes_only_the_dead_branch() -> None:
    router: TopicRouter[int] = TopicRouter()
    router.add("a.b.*.#", 1)
    router.add("a.c", 2)
    router.add("a.*", 3)
    router.remove("a.b.*.#", 1)
    a = router._root.children["a"]  # type: ignore[index]
    assert a.children is None  # 'b' subtree gone
    assert a.star is not None and a.star.pattern == "a.*"
    assert router.match("a.c") == {2, 3}


def test_stacked_hashes_do_not_blow_up() -> None:
    router: TopicRouter[int] = TopicRouter()
    router.add(".".join(["#"] * 12 + ["z"]), 1)
    router.add(".".join(["#"] * 12), 2)
    topic = ".".join(["a"] * 40)
    start = time.perf_counter()
    assert router.match(topic) == {2}
    assert router.match(topic + ".z") == {1, 2}
    assert time.perf_counter() - start < 1.0


# --- property tests against the reference ``matches`` ---------------------------------

SEGMENTS = ["a", "ab", "b", "x:1", "system", "systemx"]
topics = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=5).map(".".join)
pattern_segments = st.sampled_from([*SEGMENTS, "*", "#"])
segment_patterns = st.lists(pattern_segments, min_size=1, max_size=5).map(".".join)


@st.composite
def prefix_patterns(draw: st.DrawFn) -> str:
    name = draw(topics)
    cut = draw(st.integers(1, len(name)))
    return name[:cut] + "*"  # cut after a '.' yields a '*' segment: also valid


patterns = st.one_of(topics, segment_patterns, prefix_patterns())
subs = st.integers(0, 5)


def expected(model: set[tuple[str, int]], topic: str) -> set[int]:
    return {sub for pattern, sub in model if matches(pattern, topic)}


@settings(max_examples=300, deadline=None)
@given(
    adds=st.lists(st.tuples(patterns, subs), max_size=40),
    probe=st.lists(topics, min_size=1, max_size=8),
    data=st.data(),
)
def test_router_agrees_with_reference(
    adds: list[tuple[str, int]], probe: list[str], data: st.DataObject
) -> None:
    router: TopicRouter[int] = TopicRouter()
    model: set[tuple[str, int]] = set()
    for pattern, sub in adds:
        router.add(pattern, sub)
        model.add((pattern, sub))
    assert len(router) == len(model)
    for topic in probe + [p for p, _ in adds if "*" not in p and "#" not in p]:
        assert router.match(topic) == expected(model, topic)

    added = sorted(model)
    removes = data.draw(st.lists(st.sampled_from(added), unique=True) if added else st.just([]))
    strays = data.draw(st.lists(st.tuples(patterns, subs), max_size=5))
    for pattern, sub in removes + strays:
        router.remove(pattern, sub)
        model.discard((pattern, sub))
    assert len(router) == len(model)
    for pattern in {p for p, _ in adds}:
        assert router.count(pattern) == sum(1 for p, _ in model if p == pattern)
    for topic in probe:
        assert router.match(topic) == expected(model, topic)

    for pattern, sub in sorted(model):
        router.remove(pattern, sub)
    assert_empty(router)


@given(patterns)
def test_generated_patterns_are_valid(pattern: str) -> None:
    validate_pattern(pattern)


@pytest.mark.parametrize("pattern", ["a", "a.*", "a*"])
def test_unhashable_subscriber_is_refused_at_once(pattern: str) -> None:
    router: TopicRouter[Any] = TopicRouter()
    with pytest.raises(TypeError):
        router.add(pattern, [])
    assert len(router) == 0
    assert router.match("a.b") == set()
