"""What a session's parts ask of their :class:`~polymq_stomp.session.StompSession` and its
hub: the exchange routing (``exchange.py``), the connection's targets (``targets.py``), the
publisher and the subscriptions. The session holds them and they call back into it; they
name these protocols, not the StompSession, so that none of their modules imports
``session.py`` (which imports theirs). They live apart because all the parts need them;
what only one part asks is added by that part's module (``publisher.PublisherSession``,
``subscription.SubscriptionSession``). :class:`PartTargets` is how the other parts see the
connection's targets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from polymq.client import Client
    from polymq_server.auth.provider import Permission
    from polymq_server.exchanges.records import Records
    from polymq_server.link.corelink import CoreLink

    from .config import StompSettings
    from .destinations import Control, ExchangeRef, Target

__all__ = ["PartHub", "PartSession", "PartTargets"]


class PartHub(Protocol):
    """The hub as the parts see it: the core link, and AMQP's exchanges and bindings."""

    @property
    def link(self) -> CoreLink: ...
    @property
    def records(self) -> Records: ...


class PartTargets(Protocol):
    """The connection's targets (``targets.py``) as the parts see them: where a destination
    leads, and the queues the connection owns."""

    def lookup(
        self, destination: str | None, *, pattern: bool = False, command: str = "SEND"
    ) -> Target | Control | ExchangeRef: ...
    async def exchange_target(self, ref: ExchangeRef, *, subscribe: bool) -> Target: ...
    async def ensure_temp(self, target: Target) -> None: ...
    def owns(self, core: str) -> bool: ...
    def own(self, core: str) -> None: ...
    def disown(self, core: str) -> None: ...


class PartSession(Protocol):
    """The session as its parts see it."""

    @property
    def hub(self) -> PartHub: ...
    @property
    def settings(self) -> StompSettings: ...
    @property
    def conn_id(self) -> str: ...
    @property
    def vhost(self) -> str: ...
    @property
    def vhost_prefix(self) -> str: ...
    @property
    def targets(self) -> PartTargets: ...

    def client(self) -> Client: ...
    def authorize(self, permission: Permission, destination: str) -> None: ...
    def receipt(self, receipt_id: str, *extra: tuple[str, str]) -> None: ...
