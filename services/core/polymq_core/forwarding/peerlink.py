"""A peer link: one client connection from this node's core to another's, on behalf of one
client session's :class:`~polymq_core.forwarding.relay.Relay` (a peer is just another client).

It logs in as ``peer/<this node>`` with the cluster secret (the other node never forwards
what comes over it again), writes what the relay queues in one frame per loop iteration,
and hands every event that comes back, with its op as it came, to its owner; a Goodbye or
a lost connection is told to the owner too, which decides what the requests still out
there become.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from polymq.codec import NEED_DATA, Connection, Role, weight
from polymq.errors import PolymqError, Unavailable
from polymq.events import Event, Goodbye, Hello, Welcome

from ..identities import PEER_CLIENT

log = logging.getLogger(__name__)

_FRAME_BYTES = 1024 * 1024  # message bytes per frame to a peer, roughly (far below max_frame)


class LinkOwner(Protocol):
    """What a link tells the relay that holds it (a protocol, so that this module need not
    import ``relay.py``): each event the node sends back, and the link's end."""

    def from_peer(self, link: PeerLink, event: Event, raw: bytes | None = None) -> None: ...
    def link_lost(self, link: PeerLink) -> None: ...


class PeerLink(asyncio.Protocol):
    """One connection to another node's core on behalf of one session: to ``node``, from
    ``origin`` (this node's id), logged in with the cluster ``secret``."""

    def __init__(
        self, owner: LinkOwner, node: str, *, origin: str, secret: str, max_frame: int
    ) -> None:
        self.owner = owner
        self.node = node
        self.origin = origin
        self.secret = secret
        self.conn = Connection(Role.CLIENT, max_frame=max_frame, keep_raw=True)
        self.transport: asyncio.Transport | None = None
        self.queued: list[Event] = []  # to send: written together, once per loop iteration
        self.raws: list[bytes | None] = []  # each queued event's op as the client sent it
        self._flush_scheduled = False
        self.closed = False
        self.goodbye = ""  # the code of the node's Goodbye, if it ended the link with one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        hello = Hello(1, f"{PEER_CLIENT}/{self.origin}", token=self.secret)
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
                self.goodbye = event.code or ""
                self.close()
                return
            assert isinstance(event, Event)
            self.owner.from_peer(self, event, conn.raw)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.owner.link_lost(self)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        elif self.transport is None:
            self.owner.link_lost(self)

    def abort(self) -> None:
        """Drop the connection at once, unflushed (one whose network was cut: a close
        would wait on it, and its packets on TCP's back-off once the network is back)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        else:
            self.owner.link_lost(self)

    def pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


__all__ = ["LinkOwner", "PeerLink"]
