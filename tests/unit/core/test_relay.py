"""A node's relay moving a subscription to its shard's new leader (``Relay._relocate``), with
a peer that answers too late: the new leader takes the first subscribe only after the relay
stopped waiting for it, so the next one is refused "subscription id ... is already in use".
The relay leaves that late subscription there and asks again, and the subscription moves;
it is not cancelled ``unavailable`` (which sent a client failing over once more).

A stream subscription moved reads on at the new leader from the seq after the last delivery
the relay passed on (or from where its leader said it started), not from its first offset."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from polymq.events import Cancelled, Deliver, Event, Fail, Ok, Subscribe, Unsubscribe
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
    monkeypatch.setattr(relay_module, "shard_key_of", lambda b, s, ev: "queue/q")
    replies: list[Event] = []
    session: Any = SimpleNamespace(reply=lambda ev, raw=None: replies.append(ev))
    shard = SimpleNamespace(leading=False, index=0)
    broker: Any = SimpleNamespace(shard_for=lambda key: shard)
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


async def test_a_moved_stream_subscription_reads_on_after_what_it_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay_module, "shard_key_of", lambda b, s, ev: "stream/s")
    replies: list[Event] = []
    session: Any = SimpleNamespace(reply=lambda ev, raw=None: replies.append(ev), protocol="n")
    shard = SimpleNamespace(leading=False, index=0)
    leader = {"now": "n2"}
    broker: Any = SimpleNamespace(shard_for=lambda key: shard)
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
