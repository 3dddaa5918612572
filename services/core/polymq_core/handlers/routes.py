"""A request type's route: the handler that serves it and how the shard that serves it is
found, registered once per type in the broker's table (``Broker.routes``): the broker's
dispatch calls the one, a cluster node's relay asks the other whether to forward
(:mod:`polymq_core.forwarding.relay`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .caller import Caller

__all__ = ["Route"]

S = TypeVar("S")


@dataclasses.dataclass(frozen=True, slots=True)
class Route(Generic[S]):
    """``serve(session, request)``: the handler (its answer: :mod:`.answers`).
    ``shard_key(session, request)``: the key of the shard that serves the request, parsed
    and authorized as ``serve`` would (raising what it would raise), or None for one every
    node serves itself; no ``shard_key``: the type is always served here (topics, listings,
    pings; acks and cursor polls follow their subscription, which the relay knows)."""

    serve: Callable[[S, Any], Any]
    shard_key: Callable[[Caller, Any], str | None] | None = None
