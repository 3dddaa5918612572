"""Forwarding: in a cluster, a session's requests for a shard led by another node go to that
node, over the core wire protocol (QMQ's rule: a peer is just another client).

Per client session and per node it needs, one :class:`PeerLink`: a client connection to that
node's core, logged in with the cluster secret. The origin node parses and authorizes each
request as it would serve it (the link's principal may do anything); the leader serves it.
Requests keep the session's own ids (``rid``, ``sid``), so answers and deliveries come back
unchanged; acks and unsubscribes follow their subscription to its node.

When a subscription's shard moves (its leader died, stepped down or was deposed), the relay
subscribes it again through the new leader, with the same ``sid``. Delivery tags go on from
where they were (each generation of a subscription is shifted past the tags already handed
out), so an ack for a delivery of the old leader never settles a message of the new one: it
is ignored, and that message comes back from the new leader flagged as redelivered.

A request that reached this node through a peer link is never forwarded again: if this node
no longer leads its shard, it is refused ``unavailable`` (no loops between nodes that
disagree for a moment about who leads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from polymq.auth import Permission
from polymq.codec import NEED_DATA, Connection, Role, weight
from polymq.errors import BadRequest, PolymqError, RequestError, Unavailable
from polymq.events import (
    Ack,
    Bind,
    Bindings,
    Cancelled,
    CursorClose,
    CursorOpen,
    CursorPoll,
    Declare,
    Delete,
    Deliver,
    Event,
    Fail,
    Goodbye,
    Hello,
    KvDelete,
    KvGet,
    KvPut,
    MetaGet,
    MetaSet,
    Nack,
    Ok,
    Publish,
    Pull,
    Purge,
    Settle,
    Stats,
    Subscribe,
    Unbind,
    Unsubscribe,
    Welcome,
)
from polymq.types import Destination, Kind

from .cursors import SEP
from .shard import Shard

if TYPE_CHECKING:
    from .broker import Broker
    from .session import Session

log = logging.getLogger(__name__)

PEER_CLIENT = "peer"  # the Hello.client of a peer link: its requests are never forwarded again
_RELOCATE_FOR = 30.0  # seconds a moved subscription waits for a new leader before it is cancelled
_RETRY = 0.5
_INTERNAL = 1 << 62  # request ids the relay uses for itself (the wire takes unsigned ids)
_ANSWER_WITHIN = 15.0  # seconds a forwarded request may go unanswered (plus its own wait)
_FRAME_BYTES = 1024 * 1024  # message bytes per frame to a peer, roughly (far below max_frame)


class Leaders(Protocol):
    """What the relay needs of the cluster."""

    node_id: str
    secret: str

    def leader_of(self, shard: int) -> str | None: ...
    def address_of(self, node: str) -> tuple[str, int] | None: ...


@dataclasses.dataclass
class _RemoteSub:
    node: str  # "" while it is being moved
    request: Subscribe
    offset: int  # tags from this generation's node are shifted by this much
    top: int  # the highest (shifted) tag handed to the client so far
    shard: int = 0


class PeerLink(asyncio.Protocol):
    """One connection to another node's core on behalf of one session."""

    def __init__(self, relay: Relay, node: str) -> None:
        self.relay = relay
        self.node = node
        self.conn = Connection(
            Role.CLIENT, max_frame=relay.broker.settings.max_frame, keep_raw=True
        )
        self.transport: asyncio.Transport | None = None
        self.queued: list[Event] = []  # to send: written together, once per loop iteration
        self.raws: list[bytes | None] = []  # each queued event's op as the client sent it
        self._flush_scheduled = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        hello = Hello(1, f"{PEER_CLIENT}/{self.relay.cluster.node_id}", token=self.relay.secret)
        self.transport.write(self.conn.send(hello))  # type: ignore[union-attr]
        self._flush()

    def send(self, event: Event, raw: bytes | None = None) -> None:
        """Queue ``event``: what a client frame asks for (a batch of publishes, acks) goes
        out in one frame and one write, not one each. ``raw``: the event's op as the client
        encoded it (passed on as it is)."""
        if self.closed:
            raise Unavailable(f"the link to node {self.node} is closed")
        self.queued.append(event)
        self.raws.append(raw)
        if not self._flush_scheduled and self.transport is not None:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if not self.queued or transport is None or transport.is_closing():
            return
        queued, self.queued = self.queued, []
        raws, self.raws = self.raws, []
        try:
            weights = list(map(weight, queued, raws))
            transport.writelines(self.conn.send_frames(queued, weights, _FRAME_BYTES, raws))
        except PolymqError as exc:  # an event we cannot encode: a bug, not the peer's fault
            log.exception("link to node %s: cannot send: %s", self.node, exc)
            self.close()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.receive_data(data)
        while True:
            try:
                event = conn.next_event()
            except PolymqError as exc:
                log.warning("link to node %s: protocol error: %s", self.node, exc)
                self.close()
                return
            if event is NEED_DATA:
                return
            if isinstance(event, Welcome):
                continue
            if isinstance(event, Goodbye):
                if event.code:
                    log.info("node %s ended a link: %s %s", self.node, event.code, event.message)
                self.close()
                return
            assert isinstance(event, Event)
            self.relay.from_peer(self, event, conn.raw)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.relay.link_lost(self)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        elif self.transport is None:
            self.relay.link_lost(self)

    def pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


class Relay:
    """The forwarding side of one client session (see the module docstring)."""

    def __init__(self, session: Session, broker: Broker, cluster: Leaders) -> None:
        self.session = session
        self.broker = broker
        self.cluster = cluster
        self.secret = cluster.secret
        self.links: dict[str, PeerLink] = {}
        self.subs: dict[int, _RemoteSub] = {}  # forwarded subscriptions by sid
        self.requests: dict[int, Subscribe] = {}  # every queue/stream subscription's request
        # forwarded rid -> (node, deadline): a node that stops answering (frozen, cut off)
        # must not leave the client waiting forever
        self.pending: dict[int, tuple[str, float, int]] = {}  # rid -> (node, deadline, shard)
        self._watching = False
        self.sub_rids: dict[int, int] = {}  # forwarded Subscribe rid -> sid
        # our own requests (resubscribing a moved subscription), with request ids from
        # _INTERNAL up, far above any a client counts to: rid -> (node, answer)
        self._internal: dict[int, tuple[str, asyncio.Future[Event]]] = {}
        self._next_internal = _INTERNAL
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._paused = False

    # ---- from the client ------------------------------------------------------------------
    def take(self, event: Event, raw: bytes | None = None) -> bool:
        """Forward ``event`` if another node must serve it (True), or leave it to this one.
        Raises RequestError (answered as Fail) for what cannot be served anywhere now.
        ``raw``: the event's op as the client encoded it, if it carries messages."""
        if isinstance(event, Ack | Nack | Unsubscribe):
            return self._by_sid(event)
        if isinstance(event, CursorPoll | CursorClose):
            return self._by_cursor(event)
        key = self._key(event)
        if key is None:
            return False
        shard = self.broker.shard_for(key)
        if isinstance(event, Subscribe):
            self.requests[event.sid] = event
        if shard.leading:
            return False
        node = self._leader(shard)
        if isinstance(event, Subscribe):
            if event.sid in self.subs or event.sid in self.session.subs:
                return False  # the local handler says it is in use
            self.subs[event.sid] = _RemoteSub(node, event, 0, 0, shard.index)
            if not self._watching:
                self._watching = True
                self._spawn(self._watch())
            self.sub_rids[event.rid] = event.sid
        self._forward(node, event, shard.index, raw if isinstance(event, Publish) else None)
        return True

    def _leader(self, shard: Shard) -> str:
        if self.session.protocol == PEER_CLIENT:
            raise Unavailable(f"this node no longer leads shard {shard.index}; retry")
        node = self.cluster.leader_of(shard.index)
        if node is None or node == self.cluster.node_id:
            raise Unavailable(f"shard {shard.index} is electing a leader; retry in a moment")
        return node

    def _forward(self, node: str, event: Event, shard: int = -1, raw: bytes | None = None) -> None:
        rid: int = getattr(event, "rid", 0)
        if rid >= _INTERNAL:
            raise BadRequest(f"in a cluster, request ids must be below {_INTERNAL}")
        link = self._link(node)
        self.broker.sensors.on_forward()
        if rid:
            wait = getattr(event, "wait", 0.0)
            patience = _ANSWER_WITHIN + (wait if isinstance(wait, int | float) else 0.0)
            self.pending[rid] = (node, time.monotonic() + patience, shard)
            if not self._watching:
                self._watching = True
                self._spawn(self._watch())
        link.send(event, raw)

    async def _watch(self) -> None:
        """While anything is forwarded: answer requests a node does not answer in time
        ``unavailable``, and move subscriptions whose shard is now led by another node
        (the old one may be frozen: its link stays open and says nothing)."""
        try:
            while (self.pending or self.subs) and not self._closed:
                await asyncio.sleep(_RETRY)
                now = time.monotonic()
                for rid, (node, deadline, shard) in list(self.pending.items()):
                    leader = self.cluster.leader_of(shard) if shard >= 0 else None
                    if deadline <= now or (leader is not None and leader != node):
                        self._unanswered(rid, node)
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
        sid = self.sub_rids.pop(rid, None)
        if sid is not None:
            self.subs.pop(sid, None)
            self.requests.pop(sid, None)
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
        link = PeerLink(self, node)
        self.links[node] = link

        async def connect() -> None:
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(
                    loop.create_connection(lambda: link, address[0], address[1]), 5.0
                )
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
            self.requests.pop(event.sid, None)
            self._forward(rs.node, event)
            return True
        tags = event.tags if isinstance(event.tags, list) else []
        offset = rs.offset
        mine = [t - offset for t in tags if isinstance(t, int) and t > offset]
        if not mine:  # only deliveries of an earlier leader: they come back redelivered
            if event.rid:
                word = "acked" if isinstance(event, Ack) else "nacked"
                self.session.reply(Ok(event.rid, {word: 0}))
            return True
        self._forward(rs.node, dataclasses.replace(event, tags=mine))
        return True

    def _by_cursor(self, event: CursorPoll | CursorClose) -> bool:
        """A cursor subscription's id says where it lives (:mod:`polymq_core.cursors`):
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
            self._forward(self._leader(shard), event, shard.index)
            return True
        if node == self.cluster.node_id:
            return False
        self._forward(node, event)
        return True

    def _key(self, ev: Event) -> str | None:
        """The shard key ``ev`` is served by, or None for what every node serves itself
        (topics, listings, pings). Parses and authorizes as the local handler would."""
        b, s = self.broker, self.session
        t = type(ev)
        if isinstance(ev, Publish):
            dest = b.destination(s, ev.destination, Permission.WRITE)
            if dest.kind is Kind.TOPIC:
                return None
            if dest.kind is Kind.CHANNEL:
                role = ev.role or "client"
                if role not in ("server", "client"):
                    return None  # the local handler refuses it
                return Shard.key_of(dest, "server" if role == "client" else "client")
            return str(dest)
        if isinstance(ev, Subscribe | CursorOpen):
            dest = b.destination(s, ev.destination, Permission.READ, pattern=True)
            if dest.kind is Kind.TOPIC:
                return None
            sub_role: Any = ev.options.get("role") if isinstance(ev.options, dict) else None
            return b.box_key(dest, sub_role if dest.kind is Kind.CHANNEL else None)
        if isinstance(ev, Declare | Delete | Purge | MetaSet):
            return _box_of(b.destination(s, ev.destination, Permission.CONFIGURE))
        if isinstance(ev, Stats | MetaGet):
            return _box_of(b.destination(s, ev.destination, Permission.READ, pattern=t is Stats))
        if isinstance(ev, Pull):
            return str(b.destination(s, ev.destination, Permission.READ))
        if isinstance(ev, Bind | Unbind):
            q = b.destination(s, ev.queue, Permission.CONFIGURE)
            b.destination(s, ev.pattern, Permission.READ, pattern=True)
            return str(q)
        if isinstance(ev, Bindings):
            return str(b.destination(s, ev.queue, Permission.READ))
        if isinstance(ev, KvGet | KvPut | KvDelete):
            key = ev.key
            if not isinstance(key, str) or not key:
                return None  # the local handler refuses it
            if s.principal is not None:
                perm = Permission.READ if t is KvGet else Permission.WRITE
                b.auth.authorize(s.principal, perm, f"kv/{key}")
            return "kv/" + key
        if t is Settle:
            assert isinstance(ev, Settle)
            if not isinstance(ev.leases, list) or not ev.leases:
                return None
            keys = {str(lease).rsplit("|", 2)[0] for lease in ev.leases}
            if s.principal is not None:
                for key in keys:
                    b.auth.authorize(s.principal, Permission.READ, key.partition(">")[0])
            shards = {b.shard_for(k).index for k in keys}
            if len(shards) > 1:
                raise BadRequest("in a cluster, settle the leases of one queue at a time")
            return next(iter(keys))
        return None

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
            if event.tags:
                rs.top = max(rs.top, event.tags[-1])
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
            self.requests.pop(event.sid, None)
            self.session.reply(event)
            return
        rid: int = getattr(event, "rid", 0)
        if rid >= _INTERNAL:
            asked = self._internal.pop(rid, None)
            if asked is not None and not asked[1].done():
                asked[1].set_result(event)
            return
        if rid and self.pending.pop(rid, None) is None:
            return  # answered "unavailable" already (too late)
        sid = self.sub_rids.pop(rid, None)
        if sid is not None and isinstance(event, Fail):
            self.subs.pop(sid, None)
            self.requests.pop(sid, None)
        self.session.reply(event)

    def link_lost(self, link: PeerLink) -> None:
        if self.links.get(link.node) is link:
            del self.links[link.node]
        if self._closed:
            return
        node = link.node
        for rid, (n, _, _) in list(self.pending.items()):
            if n == node:
                del self.pending[rid]
                sid = self.sub_rids.pop(rid, None)
                if sid is not None:
                    rs = self.subs.get(sid)
                    if rs is not None and rs.node == node:
                        self.relocate(sid, rs.top)
                        continue  # the subscribe is retried through the new leader
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
    def relocate(self, sid: int, top: int) -> None:
        """Subscribe ``sid`` again through whichever node leads its shard now; its tags go on
        after ``top``. Cancelled (told to the client) if no leader takes it in time."""
        request = self.requests.get(sid)
        self.subs.pop(sid, None)
        if request is None or self._closed:
            return
        self.subs[sid] = _RemoteSub("", request, top, top)  # a placeholder: acks are no-ops
        self._spawn(self._relocate(sid, request, top))

    async def _relocate(self, sid: int, request: Subscribe, top: int) -> None:
        deadline = time.monotonic() + _RELOCATE_FOR
        shard = self.broker.shard_for(self._key(request) or "")
        why = "no leader"
        while time.monotonic() < deadline and not self._closed:
            if self.requests.get(sid) is not request:
                return  # unsubscribed meanwhile
            try:
                if shard.leading:
                    self.subs.pop(sid, None)
                    self.session.resubscribe_here(request, top)
                    return
                node = self.cluster.leader_of(shard.index)
                if node is not None and node != self.cluster.node_id:
                    answer = await self._ask(node, request, sid, top, shard.index)
                    if isinstance(answer, Ok):
                        if self.requests.get(sid) is request:
                            self.subs[sid] = _RemoteSub(node, request, top, top, shard.index)
                            if not self._watching:
                                self._watching = True
                                self._spawn(self._watch())
                        return
                    why = f"{answer}"
            except RequestError as exc:
                why = exc.message
            except Exception as exc:  # a link that failed: try again
                why = str(exc) or type(exc).__name__
            if sid in self.subs and self.requests.get(sid) is request:
                self.subs[sid] = _RemoteSub("", request, top, top)  # still moving
            await asyncio.sleep(_RETRY)
        if self.requests.pop(sid, None) is not None and not self._closed:
            self.subs.pop(sid, None)
            self.session.reply(
                Cancelled(sid, "unavailable", f"its shard found no new leader in time: {why}")
            )

    async def _ask(self, node: str, request: Subscribe, sid: int, top: int, shard: int) -> Event:
        self._next_internal += 1
        rid = self._next_internal
        fut: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._internal[rid] = (node, fut)
        # the subscription must be known for its node when deliveries start to arrive
        self.subs[sid] = _RemoteSub(node, request, top, top, shard)
        self._link(node).send(dataclasses.replace(request, rid=rid))
        try:
            return await asyncio.wait_for(fut, 10.0)
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


def _box_of(dest: Destination) -> str | None:
    if dest.kind is Kind.TOPIC or dest.is_pattern:
        return None
    return Shard.key_of(dest, "server" if dest.kind is Kind.CHANNEL else None)


__all__ = ["PEER_CLIENT", "Leaders", "PeerLink", "Relay"]
