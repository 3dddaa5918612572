"""The client's typed answers against a real core: what ``to_json`` gives back is the map the
core sent, key for key and in its order (the HTTP frontend's JSON for declare and stats is
made so), for each kind of destination, and a publish's answer keeps what the core said."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polymq import Client, Message, Published
from polymq.answers import Declared, stats_from_wire
from polymq.events import Declare, Stats

from ...procs import PolymqProcess
from .helpers import uid


@pytest.fixture(scope="module")
def core(module_core: PolymqProcess) -> PolymqProcess:
    """One core for the module's tests: each uses destinations of its own, none stops it."""
    return module_core


async def _raw_stats(client: Client, destination: str) -> dict[str, Any]:
    """The core's answer to ``Stats`` as the wire carries it."""
    answer: dict[str, Any] = await client._call(Stats(client._rid(), destination))
    return answer


async def test_stats_of_every_kind_give_back_the_cores_map(client: Client) -> None:
    q, s, t, ch = (f"{kind}/{uid()}" for kind in ("queue", "stream", "topic", "channel"))
    await client.declare(q, durable=True, max_length=10, idle_ttl=30)
    await client.publish(q, [Message(b"a"), Message(b"b", persistent=True)])
    await client.declare(s, durable=False, message_ttl=60)  # empty: first_seq is null
    await client.subscribe(f"{t}.#")
    await client.publish(ch, "question", role="client")  # the server's inbox only
    for dest in (q, s, f"{t}.#", t, ch):
        raw = await _raw_stats(client, dest)
        assert json.dumps(stats_from_wire(raw).to_json()) == json.dumps(raw), dest
    await client.publish(s, "entry")
    raw = await _raw_stats(client, s)
    assert raw["last_seq"] == 1
    assert json.dumps(stats_from_wire(raw).to_json()) == json.dumps(raw)


async def test_declare_gives_back_the_cores_map(client: Client) -> None:
    for dest, options in (
        (f"queue/{uid()}", {"max_length": 3, "overflow": "drop-oldest", "ack_timeout": 5}),
        (f"stream/{uid()}", {"durable": False}),
        (f"topic/{uid()}", {}),
    ):
        raw = await client._call(Declare(client._rid(), dest, options))
        typed = await client.declare(dest, **options)
        assert isinstance(typed, Declared)
        assert json.dumps(typed.to_json()) == json.dumps(raw), dest


async def test_publish_answers_what_the_core_said(client: Client) -> None:
    q, t = f"queue/{uid()}", f"topic/{uid()}"
    sub = await client.subscribe(t)
    queued = await client.publish(q, [Message(b"1"), Message(b"2")])
    assert queued.count == 2 and len(set(queued.ids)) == 2 and queued.seqs == [1, 2]
    assert not queued.to_topic
    fanned = await client.publish(t, "hi", batch_id="once")
    assert fanned == Published(1, subscribers=1, queues=0, refused=[], duplicate=False)
    again = await client.publish(t, "hi", batch_id="once")
    assert again.duplicate and again.subscribers == 1
    await sub.unsubscribe()
