"""What the core's request handlers know of the session a request came on: a protocol, so
that the handlers (``catalog``, ``keyvalue``, ...) and their destination check
(``context.py``) need not import ``session.py``, which reaches them through the broker's
routes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from polymq.types import Destination
    from polymq_server.auth.provider import Principal

__all__ = ["Caller"]


class Caller(Protocol):
    """Who sent a request (None before login or in anonymous mode) and the destinations
    it already named and may use (``HandlerContext.destination`` keeps them per session)."""

    principal: Principal | None
    destinations: dict[tuple[str, Any, bool], Destination]
