"""Resuming from a cursor: a client that reconnects gets exactly what it has not seen, for
topics and streams, whether it long-polls, loses answers, resumes mid-answer or streams
Server-Sent Events and reconnects with ``Last-Event-ID``."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from .conftest import Event, Longpoll, assert_problem, bodies, metric, unique

RATE = 200  # messages per second while the consumer reconnects
RECONNECTS = 100


class Publisher(threading.Thread):
    """Publishes "0", "1", ... to ``destination`` at a steady rate until stopped."""

    def __init__(self, lp: Longpoll, destination: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.lp = lp.fresh()
        self.destination = destination
        self.interval = 1.0 / rate
        self.count = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self.halt.is_set():
                self.lp.publish(self.destination, str(self.count))
                self.count += 1
                next_at += self.interval
                time.sleep(max(next_at - time.monotonic(), 0))
        except BaseException as exc:  # reported by the test
            self.error = exc

    def stop(self) -> int:
        self.halt.set()
        self.join(10)
        assert self.error is None, f"the publisher failed: {self.error!r}"
        return self.count


class Consumer:
    """Reads one subscription through ever new connections, keeping what it received."""

    def __init__(self, lp: Longpoll, sub: dict[str, Any]) -> None:
        self.lp = lp
        self.sub = sub["id"]
        self.cursor: str = sub["cursor"]
        self.received: list[str] = []
        self.modes: dict[str, int] = {}

    def take(self, messages: list[dict[str, Any]]) -> None:
        self.received += bodies(messages)
        if messages:
            self.cursor = messages[-1]["cursor"]

    def poll(self, rng: random.Random) -> None:
        """A long poll on a fresh connection, resuming from the cursor."""
        answer = self.lp.fresh().poll(self.sub, self.cursor, wait=1, max=rng.randint(1, 40))
        self.take(answer["messages"])
        assert answer["cursor"] == self.cursor

    def lost_answer(self, rng: random.Random) -> None:
        """The answer never reaches the client; it asks again with Last-Event-ID."""
        self.lp.fresh().poll(self.sub, self.cursor, wait=1, max=rng.randint(1, 40))
        r = self.lp.fresh().get(
            f"/v1/subscriptions/{self.sub}/poll",
            params={"wait": 1, "max": rng.randint(1, 40)},
            headers={"Last-Event-ID": self.cursor},
        )
        assert r.status_code == 200, r.text
        self.take(r.json()["messages"])

    def mid_answer(self, rng: random.Random) -> None:
        """The client handles only the first few messages of an answer, then resumes from
        the cursor of the last one it handled."""
        messages = self.lp.fresh().poll(self.sub, self.cursor, wait=1, max=40)["messages"]
        self.take(messages[: rng.randint(0, len(messages))])

    def sse(self, rng: random.Random) -> None:
        """An event stream from the cursor, cut after a few events while more are on their
        way: what the server wrote in the last moments never reaches the client."""
        with self.lp.events(self.sub, last_event_id=self.cursor) as stream:
            events = stream.read(rng.randint(1, 15), timeout=5)
            time.sleep(rng.uniform(0, 0.05))  # events keep coming, unread, until the cut
        assert all(e.event == "message" and e.id == e.data["cursor"] for e in events)
        self.take([e.data for e in events])

    def step(self, i: int, rng: random.Random) -> None:
        mode = (self.poll, self.lost_answer, self.mid_answer, self.sse)[i % 4]
        self.modes[mode.__name__] = self.modes.get(mode.__name__, 0) + 1
        mode(rng)

    def drain(self, until: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.received) < until and time.monotonic() < deadline:
            self.take(self.lp.poll(self.sub, self.cursor, wait=1, max=500)["messages"])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["topic", "stream"])
def test_100_reconnects_under_a_steady_rate_lose_and_repeat_nothing(
    lp: Longpoll, kind: str
) -> None:
    name = unique("resume")
    if kind == "topic":
        sub = lp.open(f"topic/{name}.*")  # a pattern, published to as topic/<name>.x
        dest = f"topic/{name}.x"
    else:
        sub = lp.open(f"stream/{name}", offset="next")
        dest = f"stream/{name}"
    consumer = Consumer(lp, sub)
    publisher = Publisher(lp, dest, RATE)
    publisher.start()
    rng = random.Random(4)
    try:
        for i in range(RECONNECTS):
            consumer.step(i, rng)
    finally:
        published = publisher.stop()
    consumer.drain(published)
    assert consumer.modes == {"poll": 25, "lost_answer": 25, "mid_answer": 25, "sse": 25}
    assert published > 200, f"only {published} published: not a steady rate"
    received = consumer.received
    assert len(received) == len(set(received)), "a message came twice"
    assert received == [str(i) for i in range(published)], (
        f"{published} published, {len(received)} received; first difference at "
        f"{next((i for i, (a, b) in enumerate(zip(received, map(str, range(published)), strict=False)) if a != b), min(len(received), published))}"  # noqa: E501
    )
    # nothing more comes
    assert lp.poll(sub["id"], consumer.cursor, wait=0.5)["messages"] == []


def _stream_of(lp: Longpoll, kind: str, n: int) -> tuple[dict[str, Any], str]:
    dest = f"{kind}/{unique('sse')}"
    sub = lp.open(dest, **({"offset": "first"} if kind == "stream" else {}))
    for i in range(n):
        lp.publish(dest, f"e{i}")
    return sub, dest


@pytest.mark.parametrize("kind", ["topic", "stream"])
def test_sse_resumes_exactly_from_last_event_id(lp: Longpoll, kind: str) -> None:
    sub, dest = _stream_of(lp, kind, 10)
    with lp.events(sub["id"]) as stream:
        events = stream.read(10)
        assert stream.retry == 1000
    assert [e.data["body"] for e in events] == [f"e{i}" for i in range(10)]
    assert [e.id for e in events] == [e.data["cursor"] for e in events]
    assert len({e.id for e in events}) == 10
    for i in range(10, 20):  # published while the client is away
        lp.publish(dest, f"e{i}")
    with lp.events(sub["id"], last_event_id=events[-1].id) as stream:
        stream.read(10)
        more = stream.read_for(0.5)  # and nothing else: no repeat, no extra
    assert [e.data["body"] for e in more] == [f"e{i}" for i in range(10, 20)]


def test_sse_resumes_from_any_event_of_a_stream(lp: Longpoll) -> None:
    """A stream keeps its log: a client may resume from any event it has seen."""
    sub, _ = _stream_of(lp, "stream", 12)
    with lp.events(sub["id"]) as stream:
        events = stream.read(12)
    with lp.events(sub["id"], last_event_id=events[4].id) as stream:
        again = stream.read_for(0.5)
    assert [e.data["body"] for e in again] == [f"e{i}" for i in range(5, 12)]
    # ?cursor= is the same, for clients that cannot set the header; the header wins
    with lp.events(sub["id"], cursor=events[8].id) as stream:
        assert [e.data["body"] for e in stream.read_for(0.5)] == ["e9", "e10", "e11"]
    with lp.events(sub["id"], last_event_id=events[10].id, cursor=events[0].id) as stream:
        assert [e.data["body"] for e in stream.read_for(0.5)] == ["e11"]


def test_a_topic_cursor_behind_what_a_client_received_is_gone(lp: Longpoll) -> None:
    """A topic keeps only what its subscriber has not confirmed: once an event stream has
    seen the client hold events a while, resuming from before them is a 410, never a
    silent gap."""
    sub, _ = _stream_of(lp, "topic", 6)
    with lp.events(sub["id"]) as stream:
        events = stream.read(6)
        stream.read_for(1.5)  # the stream confirms what the client got, then waits
    r = lp.get(f"/v1/subscriptions/{sub['id']}/events", headers={"Last-Event-ID": events[1].id})
    assert_problem(r, 410)
    r = lp.get(f"/v1/subscriptions/{sub['id']}/poll", params={"cursor": events[1].id})
    assert_problem(r, 410)
    # from the last one received all is well
    with lp.events(sub["id"], last_event_id=events[-1].id) as stream:
        assert stream.read_for(0.3) == []


def test_sse_sends_keep_alives_and_new_messages_as_they_come(lp: Longpoll) -> None:
    dest = f"topic/{unique('sse')}"
    sub = lp.open(dest)
    with lp.events(sub["id"]) as stream:
        stream.read_for(2.5)
        assert stream.comments >= 2, "no keep-alive comments (every second in these tests)"
        start = time.monotonic()
        lp.publish(dest, "now")
        got: list[Event] = stream.read(1, timeout=5)
        assert [e.data["body"] for e in got] == ["now"]
        assert time.monotonic() - start < 1.0


def test_sse_over_a_queue_keeps_a_prefetch_window(lp: Longpoll) -> None:
    dest = f"queue/{unique('sse')}"
    sub = lp.open(dest, prefetch=2, visibility=30)
    for i in range(5):
        lp.publish(dest, f"q{i}")
    with lp.events(sub["id"]) as stream:
        first = stream.read_for(1.0)
        assert [e.data["body"] for e in first] == ["q0", "q1"], "the window is 2 leases"
        assert all(e.id is None and e.data["receipt"] for e in first)
        lp.fresh().settle("ack", first[0].data["receipt"])  # any connection
        more = stream.read(3, timeout=5)
        assert [e.data["body"] for e in more] == ["q0", "q1", "q2"]
        lp.fresh().settle("ack", *(e.data["receipt"] for e in more[1:]))
        rest = stream.read(5, timeout=5)
    assert [e.data["body"] for e in rest] == [f"q{i}" for i in range(5)]


def test_reconnects_with_a_cursor_are_counted(lp: Longpoll) -> None:
    before = lp.get("/metrics").text
    sub, _ = _stream_of(lp, "stream", 2)
    with lp.events(sub["id"]) as stream:  # a first connection: no cursor, not a reconnect
        events = stream.read(2)
    with lp.events(sub["id"], last_event_id=events[0].id) as stream:
        stream.read(1)
    r = lp.get(f"/v1/subscriptions/{sub['id']}/poll", headers={"Last-Event-ID": events[1].id})
    assert r.status_code == 200
    lp.poll(sub["id"], events[1].id)  # an ordinary poll carries a cursor: not a reconnect
    after = lp.get("/metrics").text
    name = "polymq_longpoll_reconnects_total"
    assert metric(after, name, transport="sse") - metric(before, name, transport="sse") == 1
    assert metric(after, name, transport="poll") - metric(before, name, transport="poll") == 1
