"""A node's relay moving a subscription to its shard's new leader (``Relay._relocate``), with
a peer that answers too late: the new leader takes the first subscribe only after the relay
stopped waiting for it, so the next one is refused "subscription id ... is already in use".
The relay leaves that late subscription there and asks again, and the subscription moves;
it is not cancelled ``unavailable`` (which sent a client failing over once more).

A stream subscription moved reads on at the new leader from the seq after the last delivery
the relay passed on (or from where its leader said it started), not from its first offset;
one that this node's session served reads on from the seq the session names, and one taken
back by this node's session reads on here from where it was.

Acks the client sends while the new leader has not yet answered the moved subscribe wait
for its answer: sent at once, they reached a node that did not have the subscription yet
(one still taking its shard over answers ``not-leader``), which refused them, and the
relay no longer claimed what they named (delivered again), or a leader took the claim
without them (checked out to the client for good). An ack the client wants no answer to is
held until its node answers it done: one that the old leader refused (the subscription had
just left it) is claimed with the rest and sent again to the new leader."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from polymq.events import Ack, Cancelled, Deliver, Event, Fail, Ok, Publish, Subscribe, Unsubscribe
from polymq.types import Message
from polymq_core.forwarding import relay as relay_module
from polymq_core.forwarding.relay import Relay, _RemoteSub

SID = 5


class LatePeer:
    """The link to node n2, the shard's new leader, still taking its shard over: it takes
    the first subscribe only after the relay's Unsubscribe (so it answers that one "nothing
    to leave"), and refuses a subscribe of a sid it holds, as a core session does."""

    node = "n2"
    closed = False

    def __init__(self) -> None:
        self.relay: Relay | None = None
        self.subs: set[int] = set()
        self.late: Subscribe | None = None
        self.sent: list[Event] = []

    def close(self) -> None:
        self.closed = True

    def answer(self, ev: Event) -> None:
        assert self.relay is not None
        asyncio.get_running_loop().call_soon(self.relay.from_peer, self, ev)  # type: ignore[arg-type]

    def send(self, ev: Event) -> None:
        self.sent.append(ev)
        if isinstance(ev, Unsubscribe):
            self.subs.discard(ev.sid)
            self.answer(Ok(ev.rid, None))
            if self.late is not None:  # the first subscribe, taken after all
                self.subs.add(self.late.sid)
                self.late = None
        elif isinstance(ev, Subscribe):
            if not [e for e in self.sent if isinstance(e, Subscribe)][:-1]:
                self.late = ev  # (no answer in time)
            elif ev.sid in self.subs:
                why = f"subscription id {ev.sid} is already in use on this connection"
                self.answer(Fail(ev.rid, "bad-request", why))
            else:
                self.subs.add(ev.sid)
                self.answer(Ok(ev.rid, {"claimed": []}))


async def test_a_subscribe_answered_too_late_does_not_cancel_the_move(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay_module, "_ASK_FOR", 0.2, raising=False)
    monkeypatch.setattr(relay_module, "_RELOCATE_FOR", 5.0)
    replies: list[Event] = []
    session: Any = SimpleNamespace(reply=lambda ev, raw=None: replies.append(ev))
    shard = SimpleNamespace(leading=False, index=0)
    broker: Any = SimpleNamespace(shard_for=lambda key: shard, shard_key=lambda s, ev: "queue/q")
    cluster: Any = SimpleNamespace(secret="s", node_id="n1", leader_of=lambda i: "n2")
    relay = Relay(session, broker, cluster)
    peer = LatePeer()
    peer.relay = relay
    relay.links["n2"] = peer  # type: ignore[assignment]
    relay._watching = True  # (no watcher task: the peer never goes)
    request = Subscribe(7, SID, "queue/q", {"ack_mode": "client-individual"})
    relay.requests[SID] = request
    await asyncio.wait_for(relay._relocate(SID, request, 3), 10.0)
    assert not [r for r in replies if isinstance(r, Cancelled)], replies
    assert relay.subs[SID].node == "n2", relay.subs
    kinds = [type(e).__name__ for e in peer.sent]
    # the late one, left; refused "in use", left; taken
    assert kinds == [
        "Subscribe",
        "Unsubscribe",
        "Subscribe",
        "Unsubscribe",
        "Subscribe",
    ], kinds
    assert peer.subs == {SID}
    relay.close()


class StreamPeer:
    """The link to a node that leads the stream's shard once it is asked: it answers a
    subscribe with the seq it starts at (its offset) after first delivering ``early``
    entries from there (deliveries may come before the answer)."""

    closed = False

    def __init__(self, node: str, relay: Relay, early: int) -> None:
        self.node = node
        self.relay = relay
        self.early = early
        self.asked: list[Subscribe] = []

    def close(self) -> None:
        self.closed = True

    def send(self, ev: Event) -> None:
        assert isinstance(ev, Subscribe), ev
        self.asked.append(ev)
        start = ev.options["offset"]
        start = 1 if start == "first" else start
        seqs = range(start, start + self.early)
        loop = asyncio.get_running_loop()
        loop.call_soon(self.relay.from_peer, self, _entries(ev.sid, seqs))  # type: ignore[arg-type]
        loop.call_soon(self.relay.from_peer, self, Ok(ev.rid, {"sid": ev.sid, "seq": start}))  # type: ignore[arg-type]


def _entries(sid: int, seqs: range) -> Deliver:
    return Deliver(sid, list(range(1, len(seqs) + 1)), [Message(b"x", seq=s) for s in seqs])


async def test_a_moved_stream_subscription_reads_on_after_what_it_had() -> None:
    replies: list[Event] = []
    session: Any = SimpleNamespace(reply=lambda ev, raw=None: replies.append(ev), protocol="n")
    shard = SimpleNamespace(leading=False, index=0)
    leader = {"now": "n2"}
    broker: Any = SimpleNamespace(shard_for=lambda key: shard, shard_key=lambda s, ev: "stream/s")
    cluster: Any = SimpleNamespace(secret="s", node_id="n1", leader_of=lambda i: leader["now"])
    relay = Relay(session, broker, cluster)
    relay._watching = True  # (no watcher task)
    n2, n3 = StreamPeer("n2", relay, early=0), StreamPeer("n3", relay, early=2)
    relay.links.update(n2=n2, n3=n3)  # type: ignore[arg-type]
    request = Subscribe(7, SID, "stream/s", {"offset": "first"})
    relay.requests[SID] = request
    relay.subs[SID] = _RemoteSub("n2", request, 0, 0)
    relay.from_peer(n2, _entries(SID, range(1, 4)))  # type: ignore[arg-type]
    leader["now"] = "n3"
    relay.relocate(SID, relay.subs[SID].top)
    await asyncio.wait_for(relay._tasks.pop(), 10.0)
    # n3 delivered 4 and 5 before its answer (it starts at 4): that is not a step back
    assert [a.options["offset"] for a in n3.asked] == [4]
    leader["now"] = "n2"
    relay.relocate(SID, relay.subs[SID].top)
    await asyncio.wait_for(relay._tasks.pop(), 10.0)
    assert [a.options["offset"] for a in n2.asked] == [6]
    seqs = [m.seq for r in replies if isinstance(r, Deliver) for m in r.messages]
    assert seqs == [1, 2, 3, 4, 5], replies
    relay.close()


async def test_a_stream_subscription_served_here_reads_on_where_the_session_was() -> None:
    """Served by this node's session (the relay passed none of its deliveries), moved away:
    it reads on at the new leader from the seq the session names; taken back here, it reads
    on from after what the new leader gave it; moved away again, from the session's seq."""
    replies: list[Event] = []
    here: list[Subscribe] = []

    def resubscribe_here(request: Subscribe, top: int, held: dict[int, str]) -> list[int]:
        here.append(request)
        return []

    session: Any = SimpleNamespace(
        reply=lambda ev, raw=None: replies.append(ev),
        protocol="n",
        resubscribe_here=resubscribe_here,
    )
    shard = SimpleNamespace(leading=False, index=0)
    broker: Any = SimpleNamespace(shard_for=lambda key: shard, shard_key=lambda s, ev: "stream/s")
    cluster: Any = SimpleNamespace(secret="s", node_id="n1", leader_of=lambda i: "n2")
    relay = Relay(session, broker, cluster)
    relay._watching = True  # (no watcher task)
    n2 = StreamPeer("n2", relay, early=2)
    relay.links["n2"] = n2  # type: ignore[assignment]
    request = Subscribe(7, SID, "stream/s", {"offset": "first"})
    relay.requests[SID] = request  # (as take() keeps it, then leaves it to the session)
    relay.relocate(SID, 3, {}, 4)  # the session had delivered 1-3
    await asyncio.wait_for(relay._tasks.pop(), 10.0)
    assert [a.options["offset"] for a in n2.asked] == [4]  # n2 gave 4 and 5
    shard.leading = True
    relay.relocate(SID, relay.subs[SID].top)
    await asyncio.wait_for(relay._tasks.pop(), 10.0)
    assert [r.options["offset"] for r in here] == [6]
    assert SID not in relay.subs and SID not in relay.next_seq
    shard.leading = False
    relay.relocate(SID, 9, {}, 10)  # here it delivered 6-9
    await asyncio.wait_for(relay._tasks.pop(), 10.0)
    assert [a.options["offset"] for a in n2.asked] == [4, 10]
    seqs = [m.seq for r in replies if isinstance(r, Deliver) for m in r.messages]
    assert seqs == [4, 5, 10, 11], replies
    relay.close()


class AskedPeer:
    """The link to a node the relay forwards to: it answers only when the test says (a
    subscribe with ``not-leader``, still taking its shard over, or taking the claim; an
    ack done, or refused as by a node the subscription has left)."""

    closed = False

    def __init__(self, node: str, relay: Relay) -> None:
        self.node = node
        self.relay = relay
        self.sent: list[Event] = []
        self.arrived = asyncio.Event()  # (something came)

    def close(self) -> None:
        self.closed = True

    def send(self, ev: Event, raw: bytes | None = None) -> None:
        self.sent.append(ev)
        self.arrived.set()

    def subscribes(self) -> list[Subscribe]:
        return [e for e in self.sent if isinstance(e, Subscribe)]

    def acks(self) -> list[Ack]:
        return [e for e in self.sent if isinstance(e, Ack)]

    async def came(self, kind: type[Event], n: int) -> None:
        while len([e for e in self.sent if isinstance(e, kind)]) < n:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5.0)

    def answer_subscribe(self, ok: bool) -> None:
        ev = self.subscribes()[-1]
        if ok:
            taken = [tag for tag, _ in ev.options["claim"]["tags"]]
            answer: Event = Ok(ev.rid, {"sid": ev.sid, "claimed": taken})
        else:
            answer = Fail(ev.rid, "not-leader", "this node no longer leads shard 0; retry")
        self.relay.from_peer(self, answer)  # type: ignore[arg-type]

    def answer_acks(self, ok: bool) -> None:
        for ev in self.acks():
            assert ev.rid >= relay_module._INTERNAL, ev  # (the client asked no answer)
            if ok:
                answer: Event = Ok(ev.rid, {"acked": len(ev.tags)})
            else:
                answer = Fail(ev.rid, "not-found", f"no subscription {ev.sid} on this connection")
            self.relay.from_peer(self, answer)  # type: ignore[arg-type]


def _acking_relay(monkeypatch: pytest.MonkeyPatch, leader: dict[str, str]) -> Relay:
    """A relay whose session's requests come back to it, for queue/q of shard 0, led by
    ``leader["now"]``."""
    monkeypatch.setattr(relay_module, "_RETRY", 0.01)
    session: Any = SimpleNamespace(reply=lambda ev, raw=None: None, protocol="n")
    shard = SimpleNamespace(leading=False, index=0)
    sensors = SimpleNamespace(on_forward=lambda: None)
    broker: Any = SimpleNamespace(
        shard_for=lambda key: shard, shard_key=lambda s, ev: "queue/q", sensors=sensors
    )
    cluster: Any = SimpleNamespace(secret="s", node_id="n1", leader_of=lambda i: leader["now"])
    relay = Relay(session, broker, cluster)
    session.request = lambda ev, raw: relay.take(ev, raw)
    relay._watching = True  # (no watcher task)
    relay.requests[SID] = Subscribe(7, SID, "queue/q", {"ack_mode": "client-individual"})
    return relay


def _led_by_n2(monkeypatch: pytest.MonkeyPatch) -> tuple[Relay, AskedPeer]:
    """An :func:`_acking_relay` whose shard n2 leads, and its link to n2."""
    relay = _acking_relay(monkeypatch, {"now": "n2"})
    n2 = AskedPeer("n2", relay)
    relay.links["n2"] = n2  # type: ignore[assignment]
    return relay, n2


async def test_acks_sent_while_the_move_is_asked_wait_for_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    relay, n2 = _led_by_n2(monkeypatch)
    # the client holds tags 1-3 of the node that led the shard (this one: Session.moved)
    relay.relocate(SID, 3, {1: "m1", 2: "m2", 3: "m3"})
    task = relay._tasks.copy().pop()
    await n2.came(Subscribe, 1)
    assert relay.take(Ack(0, SID, [1], False))  # before n2 answers: it waits
    n2.answer_subscribe(ok=False)  # not-leader: asked again
    await n2.came(Subscribe, 2)
    assert relay.take(Ack(0, SID, [2], False))
    claim = n2.subscribes()[-1].options["claim"]
    assert claim == {"top": 3, "tags": [[1, "m1"], [2, "m2"], [3, "m3"]]}, claim
    assert not n2.acks(), n2.sent
    n2.answer_subscribe(ok=True)
    await asyncio.wait_for(task, 5.0)
    assert [a.tags for a in n2.acks()] == [[1], [2]], n2.sent
    assert relay.held[SID] == {1: "m1", 2: "m2", 3: "m3"}  # (until n2 says they are done)
    n2.answer_acks(ok=True)
    assert relay.held[SID] == {3: "m3"}
    relay.close()


async def test_an_ack_the_old_leader_refused_is_sent_to_the_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leader = {"now": "n2"}
    relay = _acking_relay(monkeypatch, leader)
    n2, n3 = AskedPeer("n2", relay), AskedPeer("n3", relay)
    relay.links.update(n2=n2, n3=n3)  # type: ignore[arg-type]
    relay.subs[SID] = _RemoteSub("n2", relay.requests[SID], 0, 2, 0)
    relay.held[SID] = {1: "m1", 2: "m2"}
    assert relay.take(Ack(0, SID, [1], False))  # sent to n2, which has just let it go
    n2.answer_acks(ok=False)
    assert relay.held[SID] == {1: "m1", 2: "m2"}  # not done: still held
    leader["now"] = "n3"
    relay.relocate(SID, 2)
    task = relay._tasks.copy().pop()
    await n3.came(Subscribe, 1)
    claim = n3.subscribes()[-1].options["claim"]
    assert claim == {"top": 2, "tags": [[1, "m1"], [2, "m2"]]}, claim
    n3.answer_subscribe(ok=True)
    await asyncio.wait_for(task, 5.0)
    assert [a.tags for a in n3.acks()] == [[1]], n3.sent  # sent again, to n3
    n3.answer_acks(ok=True)
    assert relay.held[SID] == {2: "m2"}
    relay.close()


async def test_a_subscription_that_ends_keeps_none_of_its_unanswered_acks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    relay, n2 = _led_by_n2(monkeypatch)
    relay.subs[SID] = _RemoteSub("n2", relay.requests[SID], 0, 2, 0)
    relay.held[SID] = {1: "m1", 2: "m2"}
    assert relay.take(Ack(0, SID, [1], False))  # no answer yet
    assert len(relay._settling) == 1
    relay.from_peer(n2, Cancelled(SID, "deleted", "the queue was deleted"))  # type: ignore[arg-type]
    assert SID not in relay.subs and not relay.held and not relay._settling
    n2.answer_acks(ok=True)  # the late answer finds nothing to settle
    assert not relay._settling and not relay.held
    relay.close()


class AnsweringPeer:
    """The link to node ``node``: it answers each request ``after`` seconds, with Ok."""

    closed = False

    def __init__(self, node: str, relay: Relay, after: float) -> None:
        self.node = node
        self.relay = relay
        self.after = after
        self.sent: list[Event] = []

    def close(self) -> None:
        self.closed = True

    def send(self, ev: Event, raw: bytes | None = None) -> None:
        self.sent.append(ev)
        loop = asyncio.get_running_loop()
        loop.call_later(self.after, self.relay.from_peer, self, Ok(ev.rid, {"count": 1}))  # type: ignore[arg-type]


@pytest.mark.parametrize(("answers_after", "answered"), [(0.8, "ok"), (None, "unavailable")])
async def test_a_request_whose_node_lets_its_shard_go_waits_a_moment_for_its_answer(
    monkeypatch: pytest.MonkeyPatch, answers_after: float | None, answered: str
) -> None:
    """The shard's lead moved from n2 to n3 after a publish was forwarded to n2: n2's
    answer, coming within the grace, is the client's (not "unavailable" at once, when the
    move was seen); a node that says nothing is answered for after the grace."""
    monkeypatch.setattr(relay_module, "_RETRY", 0.05)
    monkeypatch.setattr(relay_module, "_MOVED_GRACE", 0.5 if answers_after is None else 2.0)
    replies: list[Event] = []
    replied = asyncio.Event()

    def reply(ev: Event, raw: bytes | None = None) -> None:
        replies.append(ev)
        replied.set()

    session: Any = SimpleNamespace(reply=reply)
    sensors = SimpleNamespace(on_forward=lambda: None)
    broker: Any = SimpleNamespace(sensors=sensors)
    leaders = {0: "n2"}
    cluster: Any = SimpleNamespace(secret="s", node_id="n1", leader_of=leaders.get)
    relay = Relay(session, broker, cluster)
    peer = AnsweringPeer("n2", relay, answers_after if answers_after is not None else 3600.0)
    relay.links["n2"] = peer  # type: ignore[assignment]
    publish = Publish(9, "queue/q", [Message(b"x")])
    relay._forward("n2", publish, 0)
    leaders[0] = "n3"  # (the move, seen by the relay's watch at its next look)
    await asyncio.wait_for(replied.wait(), 5.0)
    await asyncio.sleep(0.2)  # (nothing else comes)
    assert len(replies) == 1, replies
    if answered == "ok":
        assert isinstance(replies[0], Ok) and replies[0].rid == 9, replies
    else:
        assert isinstance(replies[0], Fail) and replies[0].code == "unavailable", replies
        assert "may or may not" in replies[0].message
    assert relay.pending == {}
    relay.close()
