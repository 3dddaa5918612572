"""Tests for polymq.answers: the core's answers (as the core builds them, see
``polymq_core.handlers.publisher``, ``.catalog``, ``.queue`` and ``.stream``) made typed, and given
back
as the same JSON by ``to_json`` (same keys, same order, same values) where frontends show them.
``tests/integration/core/test_answers.py`` holds them to a running core's answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polymq import (
    Bound,
    ChannelStats,
    Client,
    CursorOpened,
    CursorPage,
    Declared,
    DeclareOptions,
    Message,
    Overflow,
    Published,
    QueueStats,
    StreamStats,
    TopicStats,
    Unbound,
)
from polymq.answers import stats_from_wire
from polymq.events import CursorPoll, Polled

from .helpers import ConnectionPair

QUEUE_OPTIONS = {"durable": True, "overflow": "drop-oldest", "max_length": 5, "idle_ttl": 2.5}
QUEUE = {
    "destination": "queue/orders",
    "messages": 7,
    "bytes": 70,
    "paged": 2,
    "in_flight": 1,
    "subscribers": 3,
    "published": 9,
    "delivered": 2,
    "acked": 1,
    "redelivered": 0,
    "bindings": 4,
    "options": QUEUE_OPTIONS,
}
STREAM = {
    "destination": "stream/clicks",
    "messages": 0,
    "bytes": 0,
    "first_seq": None,
    "last_seq": None,
    "subscribers": 0,
    "published": 12,
    "options": {"durable": False, "overflow": "reject", "message_ttl": 60.0},
}
TOPIC = {"destination": "topic/news.#", "subscribers": 2}
CHANNEL = {
    "destination": "channel/rpc",
    "server": {**QUEUE, "destination": "channel/rpc>server"},
    "client": {"destination": "channel/rpc>client", "messages": 0},  # not made yet
}


def test_a_queue_publish_answers_its_ids_and_seqs() -> None:
    p = Published.from_wire({"count": 2, "ids": ["a", "b"], "seqs": [4, 5]})
    assert p == Published(2, ["a", "b"], [4, 5])
    assert not p.to_topic and p.subscribers is None and p.duplicate is False


def test_a_topic_publish_answers_whom_it_reached() -> None:
    wire = {"count": 1, "subscribers": 0, "queues": 2, "refused": ["queue/full"]}
    p = Published.from_wire({**wire, "duplicate": True})
    assert p.to_topic and (p.subscribers, p.queues, p.refused) == (0, 2, ["queue/full"])
    assert p.duplicate is True and p.ids == [] and p.seqs == []


def test_an_empty_publish_answers_a_count_only() -> None:
    assert Published.from_wire({"count": 0}) == Published(0)


@pytest.mark.parametrize(
    ("wire", "options"),
    [
        (
            {"destination": "queue/q", "options": QUEUE_OPTIONS},
            DeclareOptions(max_length=5, overflow=Overflow.DROP_OLDEST, idle_ttl=2.5),
        ),
        ({"destination": "topic/t"}, None),  # a topic keeps nothing
    ],
)
def test_declared_gives_back_the_cores_json(
    wire: dict[str, Any], options: DeclareOptions | None
) -> None:
    declared = Declared.from_wire(wire)
    assert declared.options == options
    assert json.dumps(declared.to_json()) == json.dumps(wire)


@pytest.mark.parametrize("wire", [QUEUE, STREAM, TOPIC, CHANNEL], ids=lambda w: w["destination"])
def test_stats_give_back_the_cores_json_key_for_key(wire: dict[str, Any]) -> None:
    assert json.dumps(stats_from_wire(wire).to_json()) == json.dumps(wire)


def test_stats_are_of_the_destinations_kind() -> None:
    queue = stats_from_wire(QUEUE)
    assert isinstance(queue, QueueStats)
    assert (queue.messages, queue.paged, queue.bindings) == (7, 2, 4)
    assert queue.options == DeclareOptions(
        max_length=5, overflow=Overflow.DROP_OLDEST, idle_ttl=2.5
    )
    stream = stats_from_wire(STREAM)
    assert isinstance(stream, StreamStats) and stream.last_seq is None
    assert stats_from_wire(TOPIC) == TopicStats("topic/news.#", 2)
    channel = stats_from_wire(CHANNEL)
    assert isinstance(channel, ChannelStats) and channel.client is None
    assert channel.server is not None and channel.server.destination == "channel/rpc>server"


def test_stats_leave_out_what_a_newer_core_adds() -> None:
    newer = stats_from_wire({**QUEUE, "shard": 3})
    assert newer.to_json() == QUEUE


def test_bindings_and_cursors() -> None:
    assert Bound.from_wire({"added": 1}) == Bound(added=True)
    assert Bound.from_wire({"added": 0}) == Bound(added=False)
    assert Unbound.from_wire({"removed": 0}) == Unbound(removed=False)
    assert CursorOpened.from_wire({"id": "x.1", "cursor": 0}) == CursorOpened("x.1", 0)


def test_a_cursor_page_names_the_leases_to_settle() -> None:
    first, second = Message(b"a"), Message(b"b")
    leased = CursorPage(0, [first, second], ['queue/q|1|"1', 'queue/q|2|"1'])
    assert leased.leased == ['queue/q|1|"1', 'queue/q|2|"1']
    assert CursorPage(7, [first, second], ["", ""]).leased == []  # a topic's or a stream's
    assert CursorPage(None, [], []).leased == []


async def test_the_client_answers_a_poll_with_a_page_as_it_reads_the_cores_answer() -> None:
    pair = ConnectionPair()
    pair.handshake()
    client = Client()
    client.conn = pair.client  # (no transport: nothing is written, the answer is fed in)
    page = client.cursor_poll("sub-1", 3, max=2)
    poll = client._out[-1]
    assert isinstance(poll, CursorPoll) and (poll.id, poll.cursor, poll.max) == ("sub-1", 3, 2)
    messages = [Message(b"a", id="m-1", seq=4), Message(b"b", id="m-2", seq=5)]
    client._data(pair.server.send(Polled(poll.rid, 5, ["", ""], messages)))
    assert page.done() and page.result() == CursorPage(5, messages, ["", ""])
    await client.close()
