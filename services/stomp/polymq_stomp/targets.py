"""A STOMP connection's targets: where each of its destination headers leads, and the
queues it owns.

Where a destination leads is :func:`~polymq_stomp.destinations.parse_destination`'s answer
for this connection (its id names its temp queues, its vhost prefixes the core's names), or
for ``/exchange/`` the core's exchange records (``exchange.py``); a connection sends to few
destinations, many times each, so the answers are remembered (1024 at most). The queues it
owns are its temp queues, declared at their first use with an idle TTL, and the queues
behind its topic subscriptions (``queues.py``): the session deletes them at its close.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from polymq_server.auth.provider import Permission

from .destinations import Control, ExchangeRef, Target, parse_destination
from .exchange import resolve as resolve_exchange

if TYPE_CHECKING:
    from .parts import PartSession

__all__ = ["ConnectionTargets"]

_REMEMBERED: Final = 1024  # destinations whose targets a connection remembers


class ConnectionTargets:
    """The targets of ``session``'s destinations, and the queues it owns."""

    def __init__(self, session: PartSession) -> None:
        self._session = session
        self._targets: dict[str, Target | Control] = {}  # (an ExchangeRef's: its Target)
        self._owned: set[str] = set()  # core names of the queues the connection owns

    def lookup(
        self, destination: str | None, *, pattern: bool = False, command: str = "SEND"
    ) -> Target | Control | ExchangeRef:
        """Where a STOMP destination leads (see ``destinations.py``), or Refused; an
        ExchangeRef needs :meth:`exchange_target` (it awaits the core)."""
        if destination is not None and not pattern:
            hit = self._targets.get(destination)
            if hit is not None:
                return hit
        session = self._session
        target = parse_destination(
            destination,
            session.conn_id,
            pattern=pattern,
            vhost_prefix=session.vhost_prefix,
            command=command,
        )
        if isinstance(target, ExchangeRef):
            return target
        if destination is not None and not pattern and len(self._targets) < _REMEMBERED:
            self._targets[destination] = target
        return target

    async def exchange_target(self, ref: ExchangeRef, *, subscribe: bool) -> Target:
        """The topic (pattern) behind ``/exchange/<E>/<K>`` (see ``exchange.py``); SEND's is
        remembered for the connection."""
        target = await resolve_exchange(self._session, ref, subscribe=subscribe)
        if not subscribe and len(self._targets) < _REMEMBERED:
            self._targets[ref.stomp] = target
        return target

    # ---- the queues it owns ------------------------------------------------------------------
    def owns(self, core: str) -> bool:
        """Is queue ``core`` one of the connection's (a temp queue declared, a queue behind
        one of its topic subscriptions)?"""
        return core in self._owned

    def own(self, core: str) -> None:
        """Delete queue ``core`` when the connection closes (a queue behind a topic
        subscription, see queues.py), as the temp queues."""
        self._owned.add(core)

    def disown(self, core: str) -> None:
        self._owned.discard(core)

    def owned(self) -> list[str]:
        """The queues to delete at the close."""
        return list(self._owned)

    def take_owned(self) -> list[str]:
        """The queues to delete now (a DISCONNECT): the connection owns none after."""
        owned, self._owned = list(self._owned), set()
        return owned

    async def ensure_temp(self, target: Target) -> None:
        """Declare this connection's temp queue ``target`` (once): not durable, with an idle
        TTL in case this frontend dies before it deletes it."""
        if target.core in self._owned:
            return
        session = self._session
        session.authorize(Permission.CONFIGURE, target.core)
        client = session.client()
        ttl = session.settings.stomp_temp_queue_ttl
        link = session.hub.link
        await link.guard(client, client.declare(target.core, durable=False, idle_ttl=ttl))
        self._owned.add(target.core)
