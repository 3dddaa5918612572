"""Ending what a hung node holds on this one: the sessions of its peer links.

A node forwards its clients' requests for shards this node leads over peer links (client
connections logged in as ``peer/<node>``: :mod:`polymq_core.forwarding.relay`), and its clients'
subscriptions live here, in those sessions, with what was delivered to them and not yet
acknowledged (up to each one's prefetch). A node that hangs with its sockets open (stopped
with ``SIGSTOP``, a machine that freezes) never closes those sessions, so those deliveries
would stay checked out to it, and its share of each queue's new messages would go to it, for
as long as it hangs, while its clients (failed over to other nodes by their heartbeat:
:mod:`polymq.heartbeat`) wait for them. So once membership takes a node for unreachable
(unheard for three announcement periods, 6 s by default), its peer-link sessions here are
aborted: what they held goes back to its queues, for the consumers that are left. Should
the node come back, its relay finds its links closed and subscribes again, as after any
lost link.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from ..identities import PEER_CLIENT
from .membership import UNREACHABLE

__all__ = ["PeerSession", "PeerWatch", "origin_of"]

log = logging.getLogger(__name__)

_PREFIX = PEER_CLIENT + "/"


class PeerSession(Protocol):
    """What the watch uses of a session: what its client called itself, and closing it."""

    client: str

    def close(self, code: str | None, message: str, *, abort: bool = False) -> None: ...


def origin_of(client: str) -> str | None:
    """The node a peer link comes from, by its Hello's ``client`` (``peer/<node>``)."""
    if not client.startswith(_PREFIX):
        return None
    return client[len(_PREFIX) :] or None


class PeerWatch:
    """Every ``every`` seconds, closes the sessions (of ``sessions()``) that are peer links
    from a node ``state_of`` says is unreachable."""

    def __init__(
        self,
        sessions: Callable[[], Iterable[PeerSession]],
        state_of: Callable[[str], str],
        every: float,
    ) -> None:
        self.sessions = sessions
        self.state_of = state_of
        self.every = every

    def sweep(self) -> list[str]:
        """Close the peer-link sessions of unreachable nodes now; the nodes, one per
        session closed."""
        closed = []
        for session in list(self.sessions()):
            node = origin_of(session.client)
            if node is None or self.state_of(node) != UNREACHABLE:
                continue
            session.close(  # (aborted: a hung node reads nothing, its socket would not drain)
                "unavailable",
                f"node {node} is unreachable: its link's requests are let go",
                abort=True,
            )
            closed.append(node)
        if closed:
            log.warning(
                "closed %d peer link(s) from unreachable node(s) %s: what their subscriptions "
                "held unacknowledged goes back to its queues",
                len(closed),
                ", ".join(sorted(set(closed))),
            )
        return closed

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                self.sweep()
            except Exception:  # a bug must not stop the watch
                log.exception("peer watch: sweep failed")
