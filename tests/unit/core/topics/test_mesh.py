"""Tests for polymq_core.topics.mesh without sockets: the subject mapping (with hypothesis: a
polymq match is always covered by the pattern's NATS subjects) and the mesh's bookkeeping
against a fake NATS client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from polymq.errors import Unavailable
from polymq.types import Message
from polymq_core.topics import mesh as mesh_module
from polymq_core.topics.mesh import (
    Routed,
    TopicMesh,
    escape,
    name_for,
    subject_for,
    subjects_for,
    unescape,
)
from polymq_core.topics.trie import matches


def nats_covers(sub: str, subject: str) -> bool:
    """NATS' own rule: ``*`` one token, ``>`` (last) one or more."""
    want, have = sub.split("."), subject.split(".")
    for i, tok in enumerate(want):
        if tok == ">":
            return len(have) > i
        if i >= len(have) or (tok != "*" and tok != have[i]):
            return False
    return len(want) == len(have)


def test_nats_covers() -> None:
    assert nats_covers("a.>", "a.b.c")
    assert not nats_covers("a.>", "a")
    assert nats_covers("a.*", "a.b")
    assert not nats_covers("a.*", "a.b.c")
    assert nats_covers("a", "a")
    assert not nats_covers("a", "a.b")


@pytest.mark.parametrize(
    ("pattern", "subjects"),
    [
        ("a", ("a",)),
        ("a.b.c", ("a.b.c",)),
        ("a.*.c", ("a.*.c",)),
        ("*", ("*",)),
        ("a.#", ("a.>", "a")),
        ("a.*.#", ("a.*.>", "a.*")),
        ("a.#.#", ("a.>", "a")),
        ("a.#.c", ("a.>",)),
        ("a.#.*", ("a.>",)),
        ("#", (">",)),
        ("#.a", (">",)),
        ("#.#", (">",)),
        ("abc*", (">",)),
        ("a.bc*", ("a.>",)),
        ("a:1.b-2.c_*", ("a:1.b-2.>",)),
    ],
)
def test_subjects_for(pattern: str, subjects: tuple[str, ...]) -> None:
    assert subjects_for(pattern) == tuple("polymq.topic." + s for s in subjects)


def test_subjects_for_rejects_invalid_patterns() -> None:
    for bad in ("", "a..b", "a.b#", "a*.b", "a.*b*"):
        with pytest.raises(ValueError):
            subjects_for(bad)


@pytest.mark.parametrize(
    ("segment", "token"),
    [
        ("news", "news"),
        ("x:1-y_2", "x:1-y_2"),
        ("", "%"),
        ("a b", "a%20b"),
        ("a\tb", "a%09b"),
        ("a.b", "a%2Eb"),
        ("*", "%2A"),
        (">", "%3E"),
        ("50%", "50%25"),
        ("%", "%25"),
        ("é", "%C3%A9"),
    ],
)
def test_escape(segment: str, token: str) -> None:
    assert escape(segment) == token
    assert unescape(token) == segment


def test_unescape_rejects_what_escape_never_makes() -> None:
    assert unescape("%") == ""  # the empty segment
    for bad in ("%%", "%4", "%zz", "a%2eb", "%C3"):
        with pytest.raises((ValueError, UnicodeDecodeError)):
            unescape(bad)
    assert name_for("other.subject") is None
    assert name_for("polymq.topic.a.%zz") is None


@given(st.text())
def test_escape_makes_one_plain_token(segment: str) -> None:
    token = escape(segment)
    assert token
    assert all("!" <= c <= "~" for c in token)
    assert not set(token) & set(".*>")
    assert unescape(token) == segment


@given(st.text())
def test_names_round_trip(name: str) -> None:
    subject = subject_for(name)
    assert subject.startswith("polymq.topic.")
    assert len(subject.split(".")) == 2 + len(name.split("."))
    assert name_for(subject) == name


SEG = st.text(alphabet="ab:-_", min_size=1, max_size=3)
TOPIC = st.lists(SEG, min_size=1, max_size=5).map(".".join)
PATTERN = st.one_of(
    st.lists(st.one_of(SEG, st.sampled_from(["*", "#"])), min_size=1, max_size=5).map(".".join),
    TOPIC.map(lambda t: t + "*"),
)


def covered(pattern: str, topic: str) -> bool:
    return any(nats_covers(s, subject_for(topic)) for s in subjects_for(pattern))


@settings(max_examples=500)
@given(PATTERN, TOPIC)
def test_a_match_is_covered(pattern: str, topic: str) -> None:
    if matches(pattern, topic):
        assert covered(pattern, topic)


@settings(max_examples=500)
@given(st.data())
def test_instances_of_a_pattern_are_covered(data: st.DataObject) -> None:
    # the random pairs above rarely match: build topics that do, from the pattern
    pattern = data.draw(PATTERN)
    if pattern.endswith("*") and len(pattern) > 1 and pattern[-2] != ".":
        topic = pattern[:-1] + data.draw(st.text(alphabet="ab.", max_size=4))
        topic = topic.strip(".").replace("..", ".a.") or "a"
        if not topic.startswith(pattern[:-1]):
            return
    else:
        segs: list[str] = []
        for seg in pattern.split("."):
            if seg == "*":
                segs.append(data.draw(SEG))
            elif seg == "#":
                segs.extend(data.draw(st.lists(SEG, max_size=2)))
            else:
                segs.append(seg)
        if not segs:
            return
        topic = ".".join(segs)
    assert matches(pattern, topic)
    assert covered(pattern, topic)


# ---- the mesh against a fake NATS client ------------------------------------------------------

NO_CLIENT: Any = None  # a Msg that arrives through a fake needs no client


class FakeSub:
    """Like nats-py's: without a callback, messages go on ``_pending_queue``."""

    def __init__(self, nc: FakeNats, subject: str, cb: Any) -> None:
        self.nc, self.subject, self.cb = nc, subject, cb
        if not nc.old_style:
            self._pending_queue: asyncio.Queue[Msg] = asyncio.Queue()

    def feed(self, msg: Msg) -> None:
        """What nats-py's reader does with a message for this subscription."""
        if self.cb is not None:
            asyncio.get_running_loop().create_task(self.cb(msg))
        else:
            self._pending_queue.put_nowait(msg)

    async def unsubscribe(self) -> None:
        self.nc.calls.append(("unsub", self.subject))


class FakeNats:
    def __init__(self, max_payload: int = 1 << 20, *, old_style: bool = False) -> None:
        self.max_payload = max_payload
        self.old_style = old_style  # a nats-py whose subscriptions have no _pending_queue
        self.subs: list[FakeSub] = []
        self.calls: list[tuple[str, str]] = []
        self.published: list[tuple[str, bytes, dict[str, str]]] = []
        self.replies: list[str] = []  # the reply subject of each publish ("": none)
        self.queues: set[str] = set()

    async def subscribe(
        self, subject: str, queue: str = "", cb: Any = None, pending_bytes_limit: int = 1 << 20
    ) -> FakeSub:
        await asyncio.sleep(0)  # a real subscribe may yield
        self.calls.append(("sub", subject))
        self.queues.add(queue)
        sub = FakeSub(self, subject, cb)
        self.subs.append(sub)
        return sub

    async def publish(
        self, subject: str, payload: bytes, reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        await asyncio.sleep(0)
        self.published.append((subject, payload, headers or {}))
        self.replies.append(reply)


async def settle() -> None:
    """Let the mesh's task run what is queued."""
    for _ in range(50):
        await asyncio.sleep(0)


def delivered_to(
    got: list[tuple[str, list[Message]]],
) -> Callable[[str, list[Message], bool], None]:
    return lambda name, msgs, answer: got.append((name, msgs))


async def test_interest_is_refcounted_and_ordered() -> None:
    nc = FakeNats()
    mesh = TopicMesh(nc, "n1", delivered_to([]))
    mesh.interest("a.#", 1)  # queued before start: sent when it starts
    await mesh.start()
    mesh.interest("a.#", 1)
    mesh.interest("a.bc*", 1)  # shares polymq.topic.a.>
    mesh.interest("x.y", 1)
    mesh.interest("x.y", -1)
    mesh.interest("x.y", 1)
    await settle()
    assert nc.calls == [
        ("sub", "polymq.topic.a.>"),
        ("sub", "polymq.topic.a"),
        ("sub", "polymq.topic.x.y"),
        ("unsub", "polymq.topic.x.y"),
        ("sub", "polymq.topic.x.y"),
    ]
    assert nc.queues == {"polymq-n1"}  # one queue group: one copy per node
    nc.calls.clear()
    mesh.interest("a.#", -1)
    await settle()
    assert nc.calls == []  # one local subscription left
    mesh.interest("a.#", -1)
    await settle()
    assert nc.calls == [("unsub", "polymq.topic.a")]  # a.bc* still needs a.>
    mesh.interest("a.#", -1)  # one too many: logged, nothing else happens
    mesh.interest("a.#", 1)
    await settle()
    assert nc.calls == [("unsub", "polymq.topic.a"), ("sub", "polymq.topic.a")]
    mesh.interest("a.#", -1)
    await settle()
    nc.calls.clear()
    with pytest.raises(ValueError):
        mesh.interest("a.b#", 1)
    nc.calls.clear()
    await mesh.stop()
    assert sorted(nc.calls) == [("unsub", "polymq.topic.a.>"), ("unsub", "polymq.topic.x.y")]
    await mesh.stop()  # idempotent


def wire(*bodies: bytes) -> bytes:
    return bytes(msgpack.packb([Message(body=b).to_wire() for b in bodies], use_bin_type=True))


@pytest.mark.parametrize("old_style", [False, True])
async def test_publish_and_receive(old_style: bool) -> None:
    nc = FakeNats(old_style=old_style)
    got: list[tuple[str, list[Message]]] = []
    mesh = TopicMesh(nc, "n1", delivered_to(got))
    await mesh.start()
    mesh.publish("a.b", [Message(body=b"1"), Message(body=b"2", headers={"k": "v"})])
    mesh.publish("a.c", [Message(body=b"3")])
    mesh.publish("a.c", [])  # nothing to send
    await settle()
    assert [(s, h) for s, _, h in nc.published] == [
        ("polymq.topic.a.b", {"Polymq-Node": "n1"}),
        ("polymq.topic.a.c", {"Polymq-Node": "n1"}),
    ]
    sent = [Message.from_wire(f) for f in msgpack.unpackb(nc.published[0][1], raw=False)]
    assert [m.body for m in sent] == [b"1", b"2"]
    assert sent[1].headers == {"k": "v"}

    mesh.interest("a.bc*", 1)  # NATS subject polymq.topic.a.>: broader than the pattern
    await settle()
    sub = nc.subs[-1]
    assert sub.subject == "polymq.topic.a.>"
    assert (sub.cb is not None) == old_style

    async def arrive(subject: str, data: bytes, node: str | None = "n2") -> None:
        headers = {"Polymq-Node": node} if node else None
        sub.feed(Msg(_client=NO_CLIENT, subject=subject, data=data, headers=headers))
        await settle()

    await arrive("polymq.topic.a.bcd", wire(b"x", b"y"))
    await arrive("polymq.topic.a.bc.e", wire(b"z"), node=None)
    await arrive("polymq.topic.a.xyz", wire(b"filtered"))  # a.> covers it, a.bc* does not
    await arrive("polymq.topic.a.bcd", wire(b"own"), node="n1")  # our own: ignored
    await arrive("polymq.topic.a.bcd", b"\xc1garbage")  # malformed: ignored
    await arrive("polymq.topic.a.bcd", msgpack.packb([[1, 2]]))  # not messages: ignored
    await arrive("polymq.topic.a.bcd", wire(b"after"))
    assert [(n, [m.body for m in ms]) for n, ms in got] == [
        ("a.bcd", [b"x", b"y"]),
        ("a.bc.e", [b"z"]),
        ("a.bcd", [b"after"]),
    ]
    await mesh.stop()
    mesh.publish("a.b", [Message(body=b"late")])  # after stop: dropped
    assert len(nc.published) == 2


async def test_a_batch_over_max_payload_is_split() -> None:
    nc = FakeNats(max_payload=4096)
    mesh = TopicMesh(nc, "n1", delivered_to([]))
    await mesh.start()
    batch = [Message(body=bytes([i]) * 1000) for i in range(10)]
    mesh.publish("t", batch)
    mesh.publish("t", [Message(body=b"x" * 5000)])  # alone too large: not sent
    await mesh.stop()
    parts = [msgpack.unpackb(p, raw=False) for _, p, _ in nc.published]
    assert len(parts) > 1
    assert all(len(p) <= 4096 for _, p, _ in nc.published)
    assert [Message.from_wire(f).body for part in parts for f in part] == [m.body for m in batch]


async def test_one_inbox_keeps_the_order_across_subscriptions() -> None:
    nc = FakeNats()
    got: list[tuple[str, list[Message]]] = []
    mesh = TopicMesh(nc, "n1", delivered_to(got))
    await mesh.start()
    mesh.interest("a.*", 1)
    mesh.interest("b.*", 1)
    await settle()
    sub_a, sub_b = nc.subs
    # nats-py's reader hands messages to their subscriptions without yielding
    for i in range(20):
        sub = sub_a if i % 3 else sub_b
        name = "a.x" if i % 3 else "b.x"
        sub.feed(Msg(_client=NO_CLIENT, subject=f"polymq.topic.{name}", data=wire(b"%d" % i)))
    await settle()
    assert [m.body for _, ms in got for m in ms] == [b"%d" % i for i in range(20)]
    await mesh.stop()


# ---- confirmed publishes: the leaders of durable queues elsewhere answer ---------------------


def persistent(body: bytes) -> Message:
    return Message(body=body, persistent=True)


async def confirming_mesh(nc: FakeNats, shards: set[int]) -> TopicMesh:
    mesh = TopicMesh(nc, "n1", delivered_to([]), lambda name: set(shards))
    await mesh.start()
    return mesh


async def answer(nc: FakeNats, reply: str, routed: Routed, part: int = 0) -> None:
    """A node answers on ``reply`` (what the origin's routed subscription gets)."""
    sub = next(s for s in nc.subs if s.subject == "polymq.routed.n1.*")
    sub.feed(Msg(_client=NO_CLIENT, subject=reply, data=routed.to_wire(part)))
    await settle()


async def test_a_persistent_publish_waits_for_each_leader_it_reaches() -> None:
    nc = FakeNats()
    mesh = await confirming_mesh(nc, {1, 2})
    assert mesh.publish("a.b", [Message(body=b"transient")]) is None  # fire and forget
    fut = mesh.publish("a.b", [persistent(b"p")])
    assert fut is not None
    await settle()
    assert nc.replies[0] == ""
    reply = nc.replies[1]
    assert reply.startswith("polymq.routed.n1.")
    assert nc.published[1][2] == {"Polymq-Node": "n1", "Polymq-Part": "0"}
    await answer(nc, reply, Routed([0], [], 0, []))  # leads neither shard: not enough
    await answer(nc, reply, Routed([1], [], 1, []))
    assert not fut.done()
    await answer(nc, reply, Routed([2, 3], [], 1, ["queue/full"]))
    assert fut.done()
    assert fut.result() == Routed([], [], 2, ["queue/full"])
    await mesh.stop()


async def test_a_copy_that_failed_is_not_committed() -> None:
    nc = FakeNats()
    mesh = await confirming_mesh(nc, {1})
    fut = mesh.publish("a.b", [persistent(b"p")])
    assert fut is not None
    await settle()
    await answer(nc, nc.replies[0], Routed([1], [(1, "not committed: deposed")], 0, []))
    with pytest.raises(Unavailable, match="shard 1 failed: not committed: deposed \\(publish"):
        await fut
    await mesh.stop()


async def test_no_answer_in_time_may_not_have_been_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mesh_module, "CONFIRM_WITHIN", 0.05)
    nc = FakeNats()
    mesh = await confirming_mesh(nc, {1})
    fut = mesh.publish("a.b", [persistent(b"p")])
    assert fut is not None
    with pytest.raises(Unavailable, match="may not have been committed there"):
        await asyncio.wait_for(fut, 5)
    pending = mesh.publish("a.b", [persistent(b"q")])
    await mesh.stop()  # what still waits is answered: the node stops
    assert pending is not None
    with pytest.raises(Unavailable, match="stopping; may not have been committed"):
        await pending


async def test_each_part_of_a_split_publish_is_answered() -> None:
    nc = FakeNats(max_payload=4096)
    mesh = await confirming_mesh(nc, {1})
    fut = mesh.publish("t", [persistent(bytes([i]) * 1000) for i in range(10)])
    assert fut is not None
    await settle()
    parts = {h["Polymq-Part"] for _, _, h in nc.published}
    assert len(parts) > 1
    for part in sorted(parts)[:-1]:
        await answer(nc, nc.replies[0], Routed([1], [], 1, []), int(part))
    assert not fut.done()
    await answer(nc, nc.replies[0], Routed([1], [], 1, []), int(max(parts)))
    assert fut.done() and fut.result().queues == len(parts)
    await mesh.stop()


async def test_a_node_answers_about_its_copies_once_they_are_done() -> None:
    nc = FakeNats()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    asked: list[bool] = []

    async def copies() -> Routed:
        await done
        return Routed([2], [], 1, [])

    def deliver(name: str, msgs: list[Message], answer: bool) -> Any:
        asked.append(answer)
        return copies() if answer else None

    mesh = TopicMesh(nc, "n2", deliver)
    await mesh.start()
    mesh.interest("a.b", 1)
    await settle()
    sub = nc.subs[-1]
    headers = {"Polymq-Node": "n1", "Polymq-Part": "3"}
    sub.feed(
        Msg(
            _client=NO_CLIENT,
            subject="polymq.topic.a.b",
            data=wire(b"x"),
            reply="polymq.routed.n1.7",
            headers=headers,
        )
    )
    await settle()
    assert asked == [True] and nc.published == []
    done.set_result(None)
    await settle()
    assert nc.published[0][0] == "polymq.routed.n1.7"
    assert Routed.from_wire(nc.published[0][1]) == (3, Routed([2], [], 1, []))
    await mesh.stop()
