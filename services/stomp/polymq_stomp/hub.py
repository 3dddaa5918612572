"""What every connection of one STOMP frontend shares (TCP and WebSocket alike): settings,
the core link, the auth provider, metrics, the open sessions, the connection limits, and
AMQP's exchanges and bindings (the records ``/exchange/`` destinations route by, see
``exchange.py``). The service makes it; each session is handed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from polymq_server.auth.provider import AuthProvider
from polymq_server.exchanges.records import Records
from polymq_server.link.corelink import CoreLink
from polymq_server.resources import ConnectionLimits
from polymq_server.sessions.frontend import Shutdown

from .config import StompSettings
from .metrics import StompMetrics

__all__ = ["HubSession", "StompHub"]


class HubSession(Shutdown, Protocol):
    """An open session, as the hub and the service see it (a protocol, so that this module
    need not import ``session.py``, which imports it): its shutdown, and reading's pauses
    to decide again (the core's resource alarms changed)."""

    def update_reading(self) -> None: ...


@dataclass(eq=False)
class StompHub:
    """What every session of one frontend shares."""

    settings: StompSettings
    link: CoreLink
    auth: AuthProvider
    metrics: StompMetrics
    sessions: set[HubSession] = field(default_factory=set)
    stopping: bool = False
    # the listeners' connection limits (the service sets them from its settings)
    connections: ConnectionLimits = field(default_factory=lambda: ConnectionLimits("stomp"))
    records: Records = field(init=False)  # AMQP's exchanges and bindings (see exchange.py)

    def __post_init__(self) -> None:
        self.records = Records(self.link)
