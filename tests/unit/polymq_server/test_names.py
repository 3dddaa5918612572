"""Tests for polymq_server.names: AMQP (and STOMP vhost) names in the core's alphabet,
reversibly."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polymq.types import Destination
from polymq_server.names import (
    UnmappableName,
    VhostNames,
    escape_key,
    escape_pattern,
    escape_word,
    unescape_key,
    unescape_word,
)

SEGMENT = re.compile(r"[A-Za-z0-9_:\-]+\Z")
text = st.text(max_size=40)


@given(text)
def test_a_word_is_one_segment_and_comes_back(word: str) -> None:
    seg = escape_word(word)
    assert SEGMENT.match(seg)
    assert unescape_word(seg) == word


@given(text)
def test_a_key_keeps_its_words_and_comes_back(key: str) -> None:
    name = escape_key(key)
    segments = name.split(".")
    assert len(segments) == len(key.split("."))
    assert all(SEGMENT.match(s) for s in segments)
    assert unescape_key(name) == key


@given(text, text)
def test_different_words_never_meet(a: str, b: str) -> None:
    if a != b:
        assert escape_word(a) != escape_word(b)
        assert escape_key(a) != escape_key(b)


def test_examples() -> None:
    assert escape_word("orders") == "orders"
    assert escape_word("") == ":"
    assert escape_word("a:b") == "a:3Ab"
    assert escape_word("a.b") == "a:2Eb"
    assert escape_word("é") == ":C3:A9"
    assert escape_key("stock.ibm.nyse") == "stock.ibm.nyse"
    assert escape_key("a..b") == "a.:.b"
    assert escape_key("") == ":"
    assert escape_pattern("stock.*.#") == "stock.*.#"
    assert escape_pattern("a*.b#") == "a:2A.b:23"  # not whole words: literal
    assert unescape_word("plain:zz") == "plain:zz"  # not one of ours: as it is


def test_default_vhost_names_are_the_plain_ones() -> None:
    names = VhostNames("/")
    assert names.queue("orders") == "queue/orders"  # STOMP's /queue/orders, HTTP's too
    assert names.queue("a b") == "queue/a:20b"
    assert names.queue_of("queue/a:20b") == "a b"
    assert names.publish_topic("logs", "app.error") == "topic/amqp.logs.app.error"
    assert names.route_of("topic/amqp.logs.app.error") == ("logs", "app.error")
    assert names.binding_topic("logs", "app.#") == "topic/amqp.logs.app.#"


def test_amq_topic_is_the_shared_topic_namespace() -> None:
    """amq.topic's key K is topic K: STOMP's /topic/K, HTTP's and the native client's."""
    names = VhostNames("/")
    assert names.publish_topic("amq.topic", "news.sport") == "topic/news.sport"
    assert names.publish_topic("amq.topic", "") == "topic/:"
    assert names.publish_topic("amq.topic", "a b") == "topic/a:20b"
    assert names.binding_topic("amq.topic", "news.*.#") == "topic/news.*.#"
    assert names.route_of("topic/news.sport") == ("amq.topic", "news.sport")
    assert names.route_of("topic/a:20b") == ("amq.topic", "a b")
    assert names.exchange_base("amq.topic") == ""
    other = VhostNames("v")  # STOMP's /topic/K in vhost v: the vhost's prefix, then K
    assert other.publish_topic("amq.topic", "k") == "topic/amqp:vv.k"
    assert other.binding_topic("amq.topic", "#") == "topic/amqp:vv.#"
    assert names.route_of("topic/amqp:vv.k") is None


def test_other_vhosts_never_meet_the_default_one() -> None:
    default, other = VhostNames("/"), VhostNames("v")
    assert other.queue("q") == "queue/amqp:vv.q"
    assert default.queue_of(other.queue("q")) is None
    assert other.queue_of(default.queue("q")) is None
    assert other.queue_of(other.queue("q")) == "q"
    assert default.queue("amqp:vv.q") != other.queue("q")
    assert other.publish_topic("x", "k") == "topic/amqp:vv.x.k"
    assert default.route_of(other.publish_topic("x", "k") or "") is None


@given(st.text(min_size=1, max_size=30), text, text)
def test_core_accepts_every_name(vhost: str, name: str, key: str) -> None:
    names = VhostNames(vhost)
    try:
        Destination.parse(names.queue(name or "q"))
    except UnmappableName:
        pass
    topic = names.publish_topic(name, key)
    if topic is not None and name != "amq.topic":  # (its topics are the vhost's plain ones)
        Destination.parse(topic)
        assert names.route_of(topic) == (name, key)


def test_too_long_names() -> None:
    names = VhostNames("/")
    with pytest.raises(UnmappableName):
        names.queue("é" * 100)
    assert names.publish_topic("x", "é" * 100) is None


def test_prefix_starts_a_vhosts_queue_names() -> None:
    """What the STOMP frontend puts before its destinations' names in a vhost."""
    assert VhostNames("/").prefix == ""
    other = VhostNames("other")
    assert other.prefix == "amqp:vother."
    assert other.queue("orders") == f"queue/{other.prefix}orders"
