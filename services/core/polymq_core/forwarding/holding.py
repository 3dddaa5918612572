"""Holding a session's requests while their shard has no leader (a handover).

A request whose shard has no leader at the moment (an election, a leader stepping down or
leaving) is *held*, not refused: it waits, in order with the session's other requests for
that shard, until a node leads the shard, then is taken again by the session (served here or
forwarded there), at most :data:`HOLD_FOR` seconds from its arrival; after that it is
refused ``unavailable``. A request a node did not do is held again by the relay
(:mod:`polymq_core.forwarding.relay`, ``_again``) with a short pause before it is taken again.

:class:`RequestHolding` is the part of :class:`~polymq_core.forwarding.relay.Relay` that holds. It
is a
mixin: the relay checks for held requests of a shard on every request it takes, so it
reaches the queue of held requests with no layer between. The relay holds the state (its
session, broker and cluster, the subscriptions' requests and the held queue), declared
here, and creates it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from polymq.errors import Unavailable
from polymq.events import Event, Fail, Subscribe

if TYPE_CHECKING:
    from ..destinations.shard import Shard
    from ..metrics import Sensors

HOLD_FOR = 10.0  # seconds a request may wait for its shard to have a leader (handover)
_HOLD_POLL = 0.02  # seconds between looks at whether a held request's shard has one
_HOLD_MAX = 10_000  # requests one session may have held; more are refused at once


class Held(NamedTuple):
    """A request waiting for its shard to have a leader."""

    event: Event
    raw: bytes | None
    shard: int
    deadline: float
    not_before: float  # taken again no sooner (a node refused it: its view may lag)


class HoldingSession(Protocol):
    """What holding uses of the session: taking a held request again, and answering one
    that found no leader in time."""

    def request(self, event: Event, raw: bytes | None, held: Held | None = None) -> None: ...
    def reply(self, event: Event, raw: bytes | None = None) -> None: ...


class HoldingHost(Protocol):
    """What holding uses of the broker: the shards (does this node lead one now) and the
    sensors (a request given up is a request error)."""

    sensors: Sensors
    shards: list[Shard]


class LeaderView(Protocol):
    """What holding uses of the cluster: this node's id and who leads a shard."""

    node_id: str

    def leader_of(self, shard: int) -> str | None: ...


class RequestHolding:
    """Holding requests while their shard has no leader (see the module's docstring)."""

    # what the relay holds (Relay.__init__ makes it)
    session: HoldingSession
    broker: HoldingHost
    cluster: LeaderView
    requests: dict[int, Subscribe]  # every queue/stream subscription's request, by sid
    _held: collections.deque[Held]  # in arrival order
    _held_shards: collections.Counter[int]  # how many are held, per shard
    _releasing: bool  # a task takes them again as their shards find leaders
    _closed: bool

    if TYPE_CHECKING:

        def _spawn(self, coro: Any) -> None: ...

    def _hold(self, event: Event, raw: bytes | None, shard: int, was: Held | None = None) -> None:
        if len(self._held) >= _HOLD_MAX:
            raise Unavailable(f"shard {shard} is electing a leader; retry in a moment")
        deadline = was.deadline if was is not None else time.monotonic() + HOLD_FOR
        not_before = was.not_before if was is not None else 0.0
        self._held.append(Held(event, raw, shard, deadline, not_before))
        self._held_shards[shard] += 1
        if not self._releasing:
            self._releasing = True
            self._spawn(self._release())

    def _has_leader(self, held: Held) -> bool:
        if self.broker.shards[held.shard].leading:
            return True
        leader = self.cluster.leader_of(held.shard)
        return leader is not None and leader != self.cluster.node_id

    async def _release(self) -> None:
        """Take the held requests again, in order, as their shards find leaders."""
        try:
            while self._held and not self._closed:
                held = self._held[0]
                now = time.monotonic()
                ready = now >= held.not_before and self._has_leader(held)
                if not ready and now < held.deadline:
                    await asyncio.sleep(_HOLD_POLL)
                    continue
                self._held.popleft()
                self._held_shards[held.shard] -= 1
                if ready:
                    self.session.request(held.event, held.raw, held)
                else:
                    self._give_up(held)
        finally:
            self._releasing = False

    def _give_up(self, held: Held) -> None:
        event = held.event
        if isinstance(event, Subscribe) and self.requests.get(event.sid) is event:
            del self.requests[event.sid]
        rid: int = getattr(event, "rid", 0)
        if rid:
            self.broker.sensors.on_request_error("unavailable")
            why = f"shard {held.shard} found no leader within {HOLD_FOR:g} s; retry"
            self.session.reply(Fail(rid, "unavailable", why))


__all__ = ["HOLD_FOR", "Held", "HoldingHost", "HoldingSession", "LeaderView", "RequestHolding"]
