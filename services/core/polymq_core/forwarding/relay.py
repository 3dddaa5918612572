"""Forwarding: in a cluster, a session's requests for a shard led by another node go to that
node, over the core wire protocol (QMQ's rule: a peer is just another client).

Per client session and per node it needs, one :class:`~polymq_core.forwarding.peerlink.PeerLink`: a
client connection to that node's core, logged in with the cluster secret. The origin node
parses and authorizes each request as it would serve it, which finds its shard (the
request's route, ``Broker.shard_key``: :mod:`polymq_core.handlers.routes`; the link's
principal may do anything); the leader serves it.
Requests keep the session's own ids (``rid``, ``sid``), so answers and deliveries come back
unchanged; acks and unsubscribes follow their subscription to its node.

When a subscription's shard moves (its leader died, stepped down or was deposed), the relay
subscribes it again through the new leader, with the same ``sid``, and **claims** what the
client holds unacked: the relay keeps, per subscription that acks, the message id of each
delivery it passed on and has not seen settled (an ack the client wants no answer to goes
with a request id of the relay's own: settled once its node answers it done, sent again
after the move if it did not), and sends them with the subscribe (its
``claim`` option, which only a peer may give: ``{"top", "tags": [[tag, id], ...]}``). The
new leader checks those messages out to the subscription again under the same tags, instead
of delivering them again, and hands out new tags after ``top`` (the highest so far); its
answer names the tags it took (``claimed``). So the client's acks of those deliveries work
after the move, and nothing is delivered twice. A claimed message the new leader no longer
has ready (acked meanwhile, or already given to another consumer) is not taken, and an ack
of such a tag is ignored. Acks sent while the subscription is being moved wait for it,
until the new leader has answered the subscribe (sent to it before, they could reach a node
that then refuses the subscribe, ``not-leader``, and be refused there: lost, and no longer
claimed either).
A new leader may answer that subscribe late (it holds it while it takes its shard over):
the relay waits ``HOLD_FOR`` plus 5 s for the answer; one that comes later still (the
leader took it, and refuses the next "subscription id ... is already in use") is left
there (unsubscribed on that node) and the subscribe is sent again, its tags after the
highest the client had: the subscription moves, it is not cancelled ``unavailable``.
A stream subscription moves on from where it was: the relay keeps the seq after the last
delivery it passed on (before any, the seq the leader's answer named; never backwards) and
subscribes again at that seq (its ``offset``), not at the offset it was made with; one that
this node's session served reads on from the seq the session names (:meth:`Relay.relocate`).

A request that reached this node through a peer link is never forwarded again: if this node
no longer leads its shard, it is refused ``not-leader`` (no loops between nodes that
disagree for a moment about who leads), a code only peers see.

**Handover.** A request whose shard has no leader at the moment (an election, a leader
stepping down or leaving) is *held*, not refused: it waits, in order with the session's
other requests for that shard, until a node leads the shard, then is served here or
forwarded there (at most :data:`~polymq_core.forwarding.holding.HOLD_FOR` seconds from its arrival;
after that it is refused ``unavailable`` as before: :mod:`polymq_core.forwarding.holding`). A
forwarded request that the peer refuses ``not-leader`` was not done there, and neither was
one never written to its link (the node's listener refused it): such a request is held
again and sent a moment later to whoever leads then.
Only a request whose outcome is unknown (its link dropped after it was written, or its node
stopped answering) is answered ``unavailable``: retrying it could do it twice. (A request
sent again goes behind those held after it, but may land after a later one of the same
session that went straight through: order across a handover is kept for what is held.)
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from polymq.errors import BadRequest, RequestError, Unavailable
from polymq.events import (
    Ack,
    Cancelled,
    CursorClose,
    CursorPoll,
    Deliver,
    Event,
    Fail,
    Nack,
    Ok,
    Publish,
    Subscribe,
    Unsubscribe,
)

from ..handlers.caller import Caller
from ..handlers.consumers import CLAIM
from ..handlers.cursors import SEP
from ..identities import PEER_CLIENT
from .holding import HOLD_FOR, Held, HoldingHost, HoldingSession, LeaderView, RequestHolding
from .peerlink import PeerLink

if TYPE_CHECKING:
    from ..config import CoreSettings
    from ..destinations.shard import Shard
    from ..destinations.subscription import Subscription
    from ..handlers.sids import SidTable

log = logging.getLogger(__name__)

_RELOCATE_FOR = 30.0  # seconds a moved subscription waits for a new leader before it is cancelled
_RETRY = 0.5
# seconds a new leader may take to answer a moved subscription's subscribe: it holds one
# while it is still taking its shard over (up to HOLD_FOR), then serves it; one answered
# later still is left there and asked again (_relocating)
_ASK_FOR = HOLD_FOR + 5.0
_IN_USE = "is already in use"  # (the refusal of a subscription id a connection has taken)
_INTERNAL = 1 << 62  # request ids the relay uses for itself (the wire takes unsigned ids)
_ANSWER_WITHIN = 15.0  # seconds a forwarded request may go unanswered (plus its own wait)
_REFUSED_PAUSE = 0.05  # seconds before a request a node did not do is sent again
# seconds a forwarded request waits for the answer of a node that no longer leads its shard
_MOVED_GRACE = 2.0


class NotLeader(Unavailable):
    """A peer's answer to a forwarded request for a shard it does not lead: not done, so
    the origin may send it elsewhere. Never sent to a client."""

    code = "not-leader"


class _Pending(NamedTuple):
    node: str
    deadline: float  # answered "unavailable" if not answered by then
    shard: int
    event: Event  # to hold it again if the node answers not-leader
    raw: bytes | None
    held_until: float  # its deadline as a held request


class Leaders(LeaderView, Protocol):
    """What the relay needs of the cluster: this node's id and who leads a shard (what
    holding uses), the cluster's secret and TLS, and where a node listens."""

    secret: str
    peer_ssl: ssl.SSLContext | None  # cluster TLS: links to peers use it

    def address_of(self, node: str) -> tuple[str, int] | None: ...


class RelayHost(HoldingHost, Protocol):
    """What the relay uses of the broker (a protocol, so that this module need not import
    ``broker.py``): the frame size, what holding uses (its sensors, the shards), the shard
    of a key, and the key of the shard that serves a request (its route's: parsed and
    authorized here before it goes)."""

    settings: CoreSettings

    def shard_for(self, key: str) -> Shard: ...
    def shard_key(self, session: Caller, event: Event) -> str | None: ...


class RelaySession(Caller, HoldingSession, Protocol):
    """What the relay uses of the client session it forwards for (a protocol, so that this
    module need not import ``session.py``, which imports it): who it is (a peer's requests
    are never forwarded again), the sids in use, and the way back: an answer or a delivery
    to send, a held request to serve after all (what holding uses), a moved subscription to
    take back here."""

    protocol: str
    subs: SidTable[Subscription]

    def resubscribe_here(self, request: Subscribe, top: int, held: dict[int, str]) -> list[int]: ...


@dataclasses.dataclass
class _RemoteSub:
    node: str  # "" while it is being moved
    request: Subscribe
    offset: int  # tags from this generation's node are shifted by this much
    top: int  # the highest (shifted) tag handed to the client so far
    shard: int = 0
    # acks and nacks that came while it was being moved: sent once it is subscribed again
    waiting: list[Ack | Nack] = dataclasses.field(default_factory=list)
    # ``node`` is asked to take it (its deliveries pass already) and has not answered yet:
    # acks still wait (sent before it took the subscription, they would be lost there)
    asking: bool = False


def _is_stream(request: Subscribe | None) -> bool:
    return request is not None and request.destination.startswith("stream/")


def _acks(request: Subscribe) -> tuple[bool, bool]:
    """(does the subscription ack, is an ack cumulative) by its options (ack mode
    ``client`` settles every tag up to the one named)."""
    options = request.options
    mode = options.get("ack_mode", "auto") if isinstance(options, dict) else "auto"
    return mode != "auto", mode == "client"


class Relay(RequestHolding):
    """The forwarding side of one client session (see the module docstring); holding
    requests while their shard has no leader is :class:`RequestHolding`'s part of it."""

    session: RelaySession
    broker: RelayHost
    cluster: Leaders

    def __init__(self, session: RelaySession, broker: RelayHost, cluster: Leaders) -> None:
        self.session = session
        self.broker = broker
        self.cluster = cluster
        self.secret = cluster.secret
        self.links: dict[str, PeerLink] = {}
        self.subs: dict[int, _RemoteSub] = {}  # forwarded subscriptions by sid
        self.requests: dict[int, Subscribe] = {}  # every queue/stream subscription's request
        # what each forwarded subscription that acks holds unsettled: sid -> {tag: message
        # id}, claimed from the new leader when it moves; and the acks forwarded, by rid,
        # whose answer settles them here: rid -> (sid, the ack)
        self.held: dict[int, dict[int, str]] = {}
        self._acking: dict[int, tuple[int, Ack | Nack]] = {}
        # the client's acks and nacks without a request id, forwarded with one of ours, so
        # that what they settle stays held (claimed on a move) until their node answers:
        # our rid -> (node, sid, the client's ack)
        self._settling: dict[int, tuple[str, int, Ack | Nack]] = {}
        # per stream subscription forwarded: the seq after the last delivery passed on (or,
        # before one, the seq its leader said it starts at): where a move reads on from
        self.next_seq: dict[int, int] = {}
        self._moving: set[int] = set()  # sids being subscribed again (one move at a time)
        # forwarded rid -> (node, deadline): a node that stops answering (frozen, cut off)
        # must not leave the client waiting forever
        self.pending: dict[int, _Pending] = {}
        self._held: collections.deque[Held] = collections.deque()  # in arrival order
        self._held_shards: collections.Counter[int] = collections.Counter()
        self._releasing = False
        self._watching = False
        self.sub_rids: dict[int, int] = {}  # forwarded Subscribe rid -> sid
        # our own requests (resubscribing a moved subscription), with request ids from
        # _INTERNAL up, far above any a client counts to: rid -> (node, answer)
        self._internal: dict[int, tuple[str, asyncio.Future[Event]]] = {}
        self._rids = itertools.count(_INTERNAL + 1)  # (ours: acks without one, too)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._paused = False

    # ---- from the client ------------------------------------------------------------------
    def take(self, event: Event, raw: bytes | None = None, held: Held | None = None) -> bool:
        """Forward ``event`` if another node must serve it, or hold it until its shard has a
        leader (True), or leave it to this one (False). Raises RequestError (answered as
        Fail) for what cannot be served anywhere now. ``raw``: the event's op as the client
        encoded it, if it carries messages; ``held``: it was held, and is taken again."""
        if isinstance(event, Ack | Nack | Unsubscribe):
            return self._by_sid(event)
        if isinstance(event, CursorPoll | CursorClose):
            return self._by_cursor(event)
        key = self.broker.shard_key(self.session, event)
        if key is None:
            return False
        shard = self.broker.shard_for(key)
        if isinstance(event, Subscribe):
            self.requests[event.sid] = event
            self.next_seq.pop(event.sid, None)
        if held is None and self._held_shards[shard.index]:
            self._hold(event, raw, shard.index)  # behind those held before it
            return True
        if shard.leading:
            return False
        node = self._leader(shard)
        if node is None:
            self._hold(event, raw, shard.index, held)
            return True
        if isinstance(event, Subscribe):
            if event.sid in self.subs or event.sid in self.session.subs:
                return False  # the local handler says it is in use
            self.subs[event.sid] = _RemoteSub(node, event, 0, 0, shard.index)
            if not self._watching:
                self._watching = True
                self._spawn(self._watch())
            self.sub_rids[event.rid] = event.sid
        self._forward(
            node,
            event,
            shard.index,
            raw if isinstance(event, Publish) else None,
            held.deadline if held is not None else None,
        )
        return True

    def _leader(self, shard: Shard) -> str | None:
        """The node to forward to; None while the shard has no leader elsewhere (hold it)."""
        if self.session.protocol == PEER_CLIENT:
            raise NotLeader(f"this node no longer leads shard {shard.index}; retry")
        node = self.cluster.leader_of(shard.index)
        if node is None or node == self.cluster.node_id:
            return None
        return node

    def _forward(
        self,
        node: str,
        event: Event,
        shard: int = -1,
        raw: bytes | None = None,
        held_until: float | None = None,
    ) -> None:
        rid: int = getattr(event, "rid", 0)
        if rid >= _INTERNAL:
            raise BadRequest(f"in a cluster, request ids must be below {_INTERNAL}")
        link = self._link(node)
        self.broker.sensors.on_forward()
        if rid:
            wait = getattr(event, "wait", 0.0)
            patience = _ANSWER_WITHIN + (wait if isinstance(wait, int | float) else 0.0)
            now = time.monotonic()
            until = held_until if held_until is not None else now + HOLD_FOR
            self.pending[rid] = _Pending(node, now + patience, shard, event, raw, until)
            if not self._watching:
                self._watching = True
                self._spawn(self._watch())
        link.send(event, raw)

    async def _watch(self) -> None:
        """While anything is forwarded: answer requests a node does not answer in time
        ``unavailable``, and move subscriptions whose shard is now led by another node
        (the old one may be frozen: its link stays open and says nothing). A request whose
        node no longer leads its shard is given ``_MOVED_GRACE`` more to be answered: a
        node that let its shard go (a balancer move, a stop) answers what it had, done or
        ``not-leader`` (then sent to the new leader), which tells the client more than
        ``unavailable`` (it may or may not have been done) at once would."""
        moved_since: dict[int, tuple[_Pending, float]] = {}  # rid -> (its request, when seen)
        try:
            while (self.pending or self.subs) and not self._closed:
                await asyncio.sleep(_RETRY)
                now = time.monotonic()
                for rid, pending in list(self.pending.items()):
                    node, deadline, shard = pending.node, pending.deadline, pending.shard
                    leader = self.cluster.leader_of(shard) if shard >= 0 else None
                    if deadline <= now:
                        self._unanswered(rid, node)
                    elif leader is not None and leader != node:
                        seen = moved_since.get(rid)
                        if seen is None or seen[0] is not pending:
                            moved_since[rid] = seen = (pending, now)
                        if now - seen[1] >= _MOVED_GRACE:
                            self._unanswered(rid, node)
                for rid in [r for r, (p, _) in moved_since.items() if self.pending.get(r) is not p]:
                    del moved_since[rid]
                for sid, rs in list(self.subs.items()):
                    if not rs.node:
                        continue  # being moved
                    leader = self.cluster.leader_of(rs.shard)
                    if leader is not None and leader != rs.node:
                        self.relocate(sid, rs.top)
        finally:
            self._watching = False

    def _unanswered(self, rid: int, node: str) -> None:
        del self.pending[rid]
        self._acking.pop(rid, None)
        sid = self.sub_rids.pop(rid, None)
        if sid is not None:
            self.subs.pop(sid, None)
            self._forget(sid)
        self.session.reply(
            Fail(
                rid,
                "unavailable",
                f"node {node} did not answer in time (or no longer leads); it may or may not "
                "have been done: retry",
            )
        )

    def _link(self, node: str) -> PeerLink:
        link = self.links.get(node)
        if link is not None and not link.closed:
            return link
        address = self.cluster.address_of(node)
        if address is None:
            raise Unavailable(f"node {node} leads this destination but has not announced itself")
        link = PeerLink(
            self,
            node,
            origin=self.cluster.node_id,
            secret=self.secret,
            max_frame=self.broker.settings.max_frame,
        )
        self.links[node] = link

        async def connect() -> None:
            loop = asyncio.get_running_loop()
            try:
                connecting = loop.create_connection(
                    lambda: link, address[0], address[1], ssl=self.cluster.peer_ssl
                )
                await asyncio.wait_for(connecting, 5.0)
            except (OSError, TimeoutError) as exc:
                log.info("cannot reach node %s at %s:%d: %s", node, *address, exc)
                link.closed = True
                self.link_lost(link)
                return
            if self._paused:
                link.pause()

        self._spawn(connect())
        return link

    def _by_sid(self, event: Ack | Nack | Unsubscribe) -> bool:
        rs = self.subs.get(event.sid)
        if rs is None:
            if isinstance(event, Unsubscribe):
                self.requests.pop(event.sid, None)
            return False  # a local subscription (or an unknown one: the local handler says so)
        if isinstance(event, Unsubscribe):
            del self.subs[event.sid]
            self._forget(event.sid)
            if rs.node:
                self._forward(rs.node, event)
            elif event.rid:
                self.session.reply(Ok(event.rid, None))
            return True
        if not rs.node or rs.asking:  # being moved: sent once it is subscribed again
            rs.waiting.append(event)
            return True
        tags = event.tags if isinstance(event.tags, list) else []
        offset = rs.offset
        mine = [t - offset for t in tags if isinstance(t, int) and t > offset]
        if not mine:  # only deliveries of an earlier leader: they come back redelivered
            self._settle_held(event.sid, event)
            if event.rid:
                word = "acked" if isinstance(event, Ack) else "nacked"
                self.session.reply(Ok(event.rid, {word: 0}))
            return True
        if not event.rid:
            self._settle_there(rs.node, event, mine)
            return True
        self._acking[event.rid] = (event.sid, event)
        self._forward(rs.node, dataclasses.replace(event, tags=mine))
        return True

    def _settle_there(self, node: str, event: Ack | Nack, tags: list[int]) -> None:
        """Forward an ack or nack the client wants no answer to (``tags``: the node's) with
        a request id of ours: what it settles stays held until the node answers it done.
        Settled at once, an ack that the node no longer did (its shard had just moved: the
        subscription was gone there) was lost, and its messages, no longer claimed, came
        again from the new leader."""
        rid = next(self._rids)
        self._settling[rid] = (node, event.sid, event)
        self.broker.sensors.on_forward()
        self._link(node).send(dataclasses.replace(event, rid=rid, tags=tags))

    def _settled(self, node: str, sid: int, event: Ack | Nack, answer: Event) -> None:
        """``node`` answered an ack of ours (:meth:`_settle_there`): done, what it settled
        is no longer held; refused (the subscription had left that node: it moves, or
        moved; or its removal was not written), it is sent again to wherever the
        subscription is subscribed next, where what it names is claimed."""
        if isinstance(answer, Ok):
            self._settle_held(sid, event)
            return
        rs = self.subs.get(sid)
        if rs is None:
            return  # it ended (what it held went back at its leader)
        if not rs.node or rs.asking or rs.node == node:
            rs.waiting.append(event)  # (sent once it is subscribed again)
        else:
            self._by_sid(event)  # it moved already: to its new leader

    def _settle_held(self, sid: int, event: Ack | Nack) -> None:
        """The deliveries ``event`` settles are no longer held (nothing to claim)."""
        held = self.held.get(sid)
        if not held:
            return
        tags = [t for t in event.tags if isinstance(t, int)] if isinstance(event.tags, list) else []
        request = self.requests.get(sid)
        if tags and (event.cumulative or (request is not None and _acks(request)[1])):
            top = max(tags)
            for tag in [t for t in held if t <= top]:
                del held[tag]
        else:
            for tag in tags:
                held.pop(tag, None)

    def _by_cursor(self, event: CursorPoll | CursorClose) -> bool:
        """A cursor subscription's id says where it lives (:mod:`polymq_core.handlers.cursors`):
        with the leader of a shard (``~<shard>~<token>``) or on a node (``<node>~<token>``).
        An id that says neither is left to the local handler (it does not know it)."""
        node, sep, rest = str(event.id).partition(SEP)
        if not sep:
            return False
        if not node:
            index, sep, _ = rest.partition(SEP)
            if not (sep and index.isdigit() and int(index) < len(self.broker.shards)):
                return False
            shard = self.broker.shards[int(index)]
            if shard.leading:
                return False
            leader = self._leader(shard)
            if leader is None:  # (a cursor's poll is not held: its client polls again)
                raise Unavailable(f"shard {shard.index} is electing a leader; retry in a moment")
            self._forward(leader, event, shard.index)
            return True
        if node == self.cluster.node_id:
            return False
        self._forward(node, event)
        return True

    # ---- from the peers ---------------------------------------------------------------------
    def from_peer(self, link: PeerLink, event: Event, raw: bytes | None = None) -> None:
        """What node ``link.node`` sends back (``raw``: the op as it came, for deliveries
        passed on unchanged)."""
        if self.links.get(link.node) is not link:
            return  # an old link's late words
        t = type(event)
        if t is Deliver:
            assert isinstance(event, Deliver)
            rs = self.subs.get(event.sid)
            if rs is None or rs.node != link.node:
                return  # unsubscribed, or moved on: the new leader redelivers
            if rs.offset:
                off = rs.offset
                event = Deliver(event.sid, [t + off for t in event.tags], event.messages)
                raw = None
            if event.messages and _is_stream(rs.request):
                self._read_on(event.sid, event.messages[-1].seq + 1)
            if event.tags:
                rs.top = max(rs.top, event.tags[-1])
                if _acks(rs.request)[0]:
                    held = self.held.setdefault(event.sid, {})
                    for tag, message in zip(event.tags, event.messages, strict=False):
                        held[tag] = message.id
            self.session.reply(event, raw)
            return
        if t is Cancelled:
            assert isinstance(event, Cancelled)
            rs = self.subs.get(event.sid)
            if rs is None or rs.node != link.node:
                return
            if event.code == "moved":
                self.relocate(event.sid, rs.top)
                return
            del self.subs[event.sid]
            self._forget(event.sid)
            self.session.reply(event)
            return
        rid: int = getattr(event, "rid", 0)
        if rid >= _INTERNAL:
            settling = self._settling.pop(rid, None)
            if settling is not None:
                self._settled(*settling, event)
                return
            asked = self._internal.pop(rid, None)
            if asked is not None and not asked[1].done():
                asked[1].set_result(event)
            return
        pending = self.pending.pop(rid, None) if rid else None
        if rid and pending is None:
            return  # answered "unavailable" already (too late)
        acking = self._acking.pop(rid, None) if rid else None
        if acking is not None and isinstance(event, Ok):
            self._settle_held(*acking)
        sid = self.sub_rids.pop(rid, None)
        if pending is not None and isinstance(event, Fail) and event.code == NotLeader.code:
            self._again(rid, pending, sid)
            return
        if sid is not None and isinstance(event, Fail):
            self.subs.pop(sid, None)
            self._forget(sid)
        elif sid is not None and isinstance(event, Ok):
            self._started(sid, event)
        self.session.reply(event)

    def _again(self, rid: int, pending: _Pending, sid: int | None) -> None:
        """Hold a forwarded request again that its node did not do (it answered not-leader,
        or the request was never written to it), and take it again a moment later, to
        whichever node leads its shard then (the refusing node's turn may be about to come,
        or this node's view may lag)."""
        if sid is not None:
            self.subs.pop(sid, None)  # (its request stays: it is subscribed again)
        pause = time.monotonic() + _REFUSED_PAUSE
        was = Held(pending.event, pending.raw, pending.shard, pending.held_until, pause)
        try:
            self._hold(pending.event, pending.raw, pending.shard, was)
        except Unavailable as exc:
            self.session.reply(Fail(rid, exc.code, exc.message))

    def link_lost(self, link: PeerLink) -> None:
        if self.links.get(link.node) is link:
            del self.links[link.node]
        if self._closed:
            return
        node = link.node
        # what the node did not do: never written to the link (it never connected, or closed
        # before a flush), or unanswered when the node said goodbye because it stops (a
        # stopping node reads no more requests and answers those it read, then says so:
        # Broker.stop)
        unsent = {getattr(event, "rid", 0) for event in link.queued}
        stopped = link.goodbye == "shutdown"
        for rid, pending in list(self.pending.items()):
            if pending.node == node:
                del self.pending[rid]
                sid = self.sub_rids.pop(rid, None)
                if sid is not None:
                    rs = self.subs.get(sid)
                    if rs is not None and rs.node == node:
                        self.relocate(sid, rs.top)
                        continue  # the subscribe is retried through the new leader
                if stopped or rid in unsent:
                    self._again(rid, pending, sid)
                    continue
                self._acking.pop(rid, None)
                self.session.reply(
                    Fail(rid, "unavailable", f"node {node} went away before answering; retry")
                )
        for asked_node, fut in list(self._internal.values()):
            if asked_node == node and not fut.done():
                fut.set_exception(Unavailable(f"node {node} went away"))
        for sid, rs in list(self.subs.items()):
            if rs.node == node:
                self.relocate(sid, rs.top)

    # ---- moving subscriptions -----------------------------------------------------------------
    def relocate(
        self, sid: int, top: int, held: dict[int, str] | None = None, seq: int | None = None
    ) -> None:
        """Subscribe ``sid`` again through whichever node leads its shard now; its tags go on
        after ``top``, and the deliveries it holds unacked are claimed there (``held``: tag
        -> message id, of a subscription this node led; else what the relay holds). A
        stream's reads on from ``seq`` (the seq after what this node's session gave it, of
        one this node led; else after what the relay passed on).
        Cancelled (told to the client) if no leader takes it in time."""
        request = self.requests.get(sid)
        if held is not None and request is not None:
            self.held[sid] = held
        if seq is not None and request is not None:
            self.next_seq[sid] = seq
        if sid in self._moving:
            return  # one move at a time: the one under way asks whoever leads now
        old = self.subs.pop(sid, None)
        if request is None or self._closed:
            self._forget(sid)
            return
        # a placeholder: acks wait in it for the new leader, with those that the old one has
        # not answered (if it did them, what they name is not claimed and they settle nothing)
        waiting = old.waiting if old else []
        for rid, (_, of, event) in list(self._settling.items()):
            if of == sid:
                del self._settling[rid]
                waiting.append(event)
        self.subs[sid] = _RemoteSub("", request, top, top, waiting=waiting)
        self._spawn(self._relocate(sid, request, top))

    async def _relocate(self, sid: int, request: Subscribe, top: int) -> None:
        self._moving.add(sid)
        try:
            await self._relocating(sid, request, top)
        finally:
            self._moving.discard(sid)

    async def _relocating(self, sid: int, request: Subscribe, top: int) -> None:
        deadline = time.monotonic() + _RELOCATE_FOR
        shard = self.broker.shard_for(self.broker.shard_key(self.session, request) or "")
        why = "no leader"
        claim = True
        while time.monotonic() < deadline and not self._closed:
            if self.requests.get(sid) is not request:
                return  # unsubscribed meanwhile
            try:
                if shard.leading:
                    moving = self.subs.pop(sid, None)
                    here = dataclasses.replace(request, options=self._resume(sid, request))
                    self.next_seq.pop(sid, None)  # (served here: this relay sees no more)
                    self.session.resubscribe_here(here, top, self.held.pop(sid, {}))
                    self._unwait(moving)
                    return
                node = self.cluster.leader_of(shard.index)
                if node is not None and node != self.cluster.node_id:
                    claims = self.held.get(sid, {}) if claim else None
                    answer = await self._ask(node, request, sid, top, shard.index, claims)
                    if isinstance(answer, Ok):
                        if self.requests.get(sid) is request:
                            self._moved(sid, node, request, top, shard.index, answer, claims)
                        return
                    if claim and isinstance(answer, Fail) and CLAIM in answer.message:
                        claim = False  # a node of an older version: without the claim
                        continue
                    if isinstance(answer, Fail) and _IN_USE in answer.message:
                        # it took an earlier ask of ours after we stopped waiting: leave
                        # that one there (its deliveries go back), then ask again at once
                        top = self._top(sid, top)
                        await self._leave(node, sid)
                        continue
                    why = f"{answer}"
            except RequestError as exc:
                why = exc.message
            except Exception as exc:  # a link that failed: try again
                why = str(exc) or type(exc).__name__
            if sid in self.subs and self.requests.get(sid) is request:
                top = self._top(sid, top)
                self.subs[sid] = _RemoteSub("", request, top, top, waiting=self._waiting(sid))
            await asyncio.sleep(_RETRY)
        if self.requests.get(sid) is not None and not self._closed:
            self._forget(sid)
            self._unwait(self.subs.pop(sid, None))
            self.session.reply(
                Cancelled(sid, "unavailable", f"its shard found no new leader in time: {why}")
            )

    def _top(self, sid: int, top: int) -> int:
        """The highest tag the client has had of ``sid`` (an ask answered too late may have
        delivered past ``top``): the next leader's tags go on after it, never reused."""
        rs = self.subs.get(sid)
        return top if rs is None else max(top, rs.top)

    def _waiting(self, sid: int) -> list[Ack | Nack]:
        rs = self.subs.get(sid)
        return rs.waiting if rs is not None else []

    def _moved(
        self,
        sid: int,
        node: str,
        request: Subscribe,
        top: int,
        shard: int,
        answer: Ok,
        held: dict[int, str] | None,
    ) -> None:
        """``node`` took the moved subscription ``sid``: with a claim, its tags are the
        client's (it took the claimed ones that it had, and goes on after ``top``);
        without, they are shifted past ``top``."""
        waiting = self._waiting(sid)
        self._started(sid, answer)
        if held is None:
            self.held.pop(sid, None)
            self.subs[sid] = _RemoteSub(node, request, top, top, shard)
        else:
            result = answer.result if isinstance(answer.result, dict) else {}
            claimed = result.get("claimed")
            taken = set(claimed) if isinstance(claimed, list) else set()
            # (deliveries of the new leader may have come before its answer: kept)
            now = self.held.get(sid, {})
            self.held[sid] = {tag: mid for tag, mid in now.items() if tag > top or tag in taken}
            self.subs[sid] = _RemoteSub(node, request, 0, top, shard)
        if not self._watching:
            self._watching = True
            self._spawn(self._watch())
        for event in waiting:
            self.session.request(event, None)

    def _read_on(self, sid: int, seq: object) -> None:
        """Stream subscription ``sid`` has read what comes before ``seq``: a move reads on
        from there. Never backwards (its first deliveries may come before its answer)."""
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > self.next_seq.get(sid, 0):
            self.next_seq[sid] = seq

    def _started(self, sid: int, answer: Ok) -> None:
        """A leader's answer to a stream subscribe names the seq it reads first."""
        if isinstance(answer.result, dict) and _is_stream(self.requests.get(sid)):
            self._read_on(sid, answer.result.get("seq"))

    def _resume(self, sid: int, request: Subscribe) -> dict[str, Any]:
        """The options to subscribe ``sid`` again with after a move: a stream's reads on
        from the seq after what it had (not from its first offset: no replay, no gap)."""
        seq = self.next_seq.get(sid)
        return request.options if seq is None else {**request.options, "offset": seq}

    def _forget(self, sid: int) -> None:
        """``sid`` ended: nothing of it is kept (its request, what it held, where it read,
        its acks still unanswered: an answer that comes later finds nothing to settle)."""
        self.requests.pop(sid, None)
        self.held.pop(sid, None)
        self.next_seq.pop(sid, None)
        settling = self._settling
        for rid in [rid for rid, (_, of, _) in settling.items() if of == sid]:
            del settling[rid]

    def _unwait(self, moving: _RemoteSub | None) -> None:
        """Acks that waited for a subscription that moved here, or never moved: served now
        (here, or answered as for an unknown subscription)."""
        for event in moving.waiting if moving is not None else []:
            self.session.request(event, None)

    async def _ask(
        self,
        node: str,
        request: Subscribe,
        sid: int,
        top: int,
        shard: int,
        held: dict[int, str] | None,
    ) -> Event:
        rid = next(self._rids)
        fut: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._internal[rid] = (node, fut)
        # the subscription must be known for its node when deliveries start to arrive
        waiting = self._waiting(sid)
        options = self._resume(sid, request)
        if held is None:
            self.subs[sid] = _RemoteSub(node, request, top, top, shard, waiting, asking=True)
        else:
            self.subs[sid] = _RemoteSub(node, request, 0, top, shard, waiting, asking=True)
            tags = [[tag, mid] for tag, mid in sorted(held.items()) if tag <= top]
            options = {**options, CLAIM: {"top": top, "tags": tags}}
        self._link(node).send(Subscribe(rid, request.sid, request.destination, options))
        try:
            return await asyncio.wait_for(fut, _ASK_FOR)
        except TimeoutError:
            # a leader still taking its shard over may take it yet, after we gave up:
            # leave it there, so that the next ask is not refused "already in use"
            await self._leave(node, sid)
            raise
        finally:
            self._internal.pop(rid, None)

    async def _leave(self, node: str, sid: int) -> None:
        """Unsubscribe ``sid`` on ``node`` (an ask of ours it took too late), waiting a
        moment for its answer; whatever the answer, the caller asks again."""
        rid = next(self._rids)
        fut: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._internal[rid] = (node, fut)
        try:
            self._link(node).send(Unsubscribe(rid, sid))
            await asyncio.wait_for(fut, _ASK_FOR / 2)
        except Exception as exc:  # (the next ask says what is wrong, if anything)
            log.debug("relay: leaving subscription %d on node %s: %s", sid, node, exc)
        finally:
            self._internal.pop(rid, None)

    # ---- flow and life cycle -------------------------------------------------------------------
    def pause(self) -> None:
        self._paused = True
        for link in self.links.values():
            link.pause()

    def resume(self) -> None:
        self._paused = False
        for link in self.links.values():
            link.resume()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def drop_links(self) -> None:
        """This node was cut off from its peers: drop every link (what they carried and
        was not answered fails ``unavailable``, its subscriptions move), so that the next
        requests open new ones instead of waiting on connections the cut left hanging."""
        for link in list(self.links.values()):
            link.abort()

    def close(self) -> None:
        """The client session ended: end its links (the leaders requeue what they held)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for link in list(self.links.values()):
            link.close()
        self.links.clear()
        for _, fut in self._internal.values():
            if not fut.done():
                fut.cancel()


__all__ = ["Leaders", "Relay", "RelayHost", "RelaySession"]
