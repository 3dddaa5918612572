"""Tests for polymq_amqp.publisher without sockets: publishes to a queue that cannot refuse
go to the core as one request per queue and read, each confirmed from the batch's answer;
publishes that may be refused stay one request each, after the batches read before them."""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands

from polymq.answers import Published
from polymq.errors import QueueFull
from polymq.types import Message
from polymq_amqp.channel import Channel
from polymq_amqp.publisher import Outbox
from polymq_amqp.topology import QueueRecord, tagged_args
from polymq_amqp.wire.events import Content

from .test_channel import FakeSession


class _Client:
    def __init__(self) -> None:
        self.requests: list[tuple[str, list[Message], asyncio.Future[Published]]] = []

    def publish_soon(self, dest: str, messages: list[Message]) -> asyncio.Future[Published]:
        fut: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
        self.requests.append((dest, list(messages), fut))
        return fut


class _Topology:
    def __init__(self, records: dict[str, QueueRecord]) -> None:
        self.records = records

    def cached_queue(self, names: Any, name: str) -> QueueRecord | None:
        return self.records.get(name)

    def known_queue(self, names: Any, name: str) -> bool | None:
        return True if name in self.records else None


class _Session(FakeSession):
    def __init__(self, records: dict[str, QueueRecord]) -> None:
        super().__init__()
        self.hub.refusing = set()  # type: ignore[attr-defined]
        self.topology = _Topology(records)  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        self.core = _Client()
        self.outbox = Outbox(self)  # type: ignore[arg-type]
        self.principal = None
        self.inflight = 0
        self.inflight_bytes = 0
        self.closing = False
        self.reads = 0
        self.failed: list[BaseException] = []

    def client(self) -> _Client:
        return self.core

    def authorize(self, permission: Any, dest: str) -> None:
        pass

    def update_reading(self) -> None:
        pass

    def fail(self, exc: BaseException, channel: int, method: Any = None) -> None:
        self.failed.append(exc)

    def confirms_due(self, channel: Channel) -> None:
        self.due = channel  # the session's tick sends them: see _tick below


async def _tick(ch: Channel) -> None:
    await asyncio.sleep(0)  # the core's answers are handled
    ch.flush_confirms()  # then the session's tick sends the confirms


def _record(name: str, **args: Any) -> QueueRecord:
    return QueueRecord(name, f"queue/{name}", False, False, False, tagged_args(args))


def _publish(ch: Channel, key: str, body: bytes) -> None:
    ch.publisher.publish(
        Content(
            ch.number,
            commands.Basic.Publish(routing_key=key),
            commands.Basic.Properties(delivery_mode=1),
            body,
        )
    )


def _setup(**records: QueueRecord) -> tuple[Channel, _Session]:
    session = _Session(records)
    ch = Channel(session, 1)  # type: ignore[arg-type]
    ch.confirming = True
    return ch, session


async def test_one_request_per_queue_and_read_each_message_confirmed() -> None:
    ch, session = _setup(a=_record("a"), b=_record("b"))
    for i in range(5):
        _publish(ch, "a" if i % 2 == 0 else "b", b"%d" % i)
    assert session.core.requests == []  # nothing until the read is handled
    assert session.inflight == 5
    session.outbox.flush()
    got = [(dest, [m.body for m in msgs]) for dest, msgs, _ in session.core.requests]
    assert got == [("queue/a", [b"0", b"2", b"4"]), ("queue/b", [b"1", b"3"])]
    session.core.requests[1][2].set_result(Published(2))  # b answers first
    await _tick(ch)
    assert [(m.delivery_tag, m.multiple) for m in session.sent] == [(2, False), (4, False)]
    session.core.requests[0][2].set_result(Published(3))
    await _tick(ch)
    assert [(m.delivery_tag, m.multiple) for m in session.sent[2:]] == [(5, True)]
    assert all(isinstance(m, commands.Basic.Ack) for m in session.sent)
    assert session.inflight == 0 and session.inflight_bytes == 0


async def test_a_queue_that_may_refuse_gets_one_request_a_message_after_the_batches() -> None:
    bounded = _record("r", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    ch, session = _setup(a=_record("a"), r=bounded)
    _publish(ch, "a", b"1")
    _publish(ch, "r", b"2")
    _publish(ch, "r", b"3")
    reqs = session.core.requests
    # the batch of "a" went first (the order of the channel), then "r" one by one
    assert [(d, [m.body for m in ms]) for d, ms, _ in reqs] == [
        ("queue/a", [b"1"]),
        ("queue/r", [b"2"]),
        ("queue/r", [b"3"]),
    ]
    reqs[0][2].set_result(Published(1))
    reqs[1][2].set_result(Published(1))
    reqs[2][2].set_exception(QueueFull("queue/r is full"))
    await _tick(ch)
    answers = [(type(m).__name__, m.delivery_tag, m.multiple) for m in session.sent]
    assert sorted(answers) == [("Ack", 2, True), ("Nack", 3, False)]


async def test_a_batch_refused_after_all_nacks_its_messages_and_stops_batching() -> None:
    ch, session = _setup(a=_record("a"))  # (bounded by another protocol, say)
    _publish(ch, "a", b"1")
    _publish(ch, "a", b"2")
    session.outbox.flush()
    [(_, _, fut)] = session.core.requests
    fut.set_exception(QueueFull("queue/a is full"))
    await _tick(ch)
    assert [(type(m).__name__, m.delivery_tag) for m in session.sent] == [
        ("Nack", 1),
        ("Nack", 2),
    ]
    assert session.hub.refusing == {"queue/a"}  # type: ignore[attr-defined]
    _publish(ch, "a", b"3")
    assert len(session.core.requests) == 2  # at once, on its own


async def test_drop_head_and_unbounded_queues_batch() -> None:
    from polymq_amqp.publisher import _cannot_refuse

    ch, _ = _setup()
    pub = ch.publisher
    assert _cannot_refuse(_record("q"), "queue/q", pub)
    assert _cannot_refuse(_record("q", **{"x-max-length": 5}), "queue/q", pub)
    assert _cannot_refuse(_record("q", **{"x-overflow": "reject-publish"}), "queue/q", pub)
    assert _cannot_refuse(
        _record("q", **{"x-max-length": 5, "x-overflow": "drop-head"}), "queue/q", pub
    )
    for overflow in ("reject-publish", "reject-publish-dlx"):
        for bound in ("x-max-length", "x-max-length-bytes"):
            rec = _record("q", **{bound: 5, "x-overflow": overflow})
            assert not _cannot_refuse(rec, "queue/q", pub)
    assert not _cannot_refuse(None, "queue/q", pub)
