"""What every connection of one AMQP frontend shares: settings, the core link, the auth
provider, metrics, the topology records and the open connections.

The resource alarms are the core link's (``link.alarms``, as in every frontend: the core's
memory and disk alarms, and the admin port's test switch ``amqp_alarm_switch``, off by
default, see ``service.py``): while any is on, publishers are blocked as RabbitMQ blocks them
(``blocking.py``). A connection that publishes is blocked before its publish is handled: it
reads nothing more, and a client that announced the ``connection.blocked`` capability gets
``connection.blocked`` with the alarms as the reason; when the last alarm clears, it gets
``connection.unblocked`` and its publish goes on. Connections that do not publish are not
blocked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

from polymq_server.auth.provider import AuthProvider
from polymq_server.link.corelink import CoreLink
from polymq_server.resources import ConnectionLimits
from polymq_server.sessions.frontend import Shutdown

from .config import AmqpSettings
from .metrics import AmqpMetrics
from .topology import Topology

__all__ = ["AmqpHub", "HubSession"]

_DEFAULT_MAX_BODY: Final = 16 * 1024 * 1024


class HubSession(Shutdown, Protocol):
    """An open connection, as the hub and the service see it (a protocol, so that this
    module need not import ``session.py``, which imports it): is it on its way out, and the
    news it is told (the alarms changed, the core went away), and its shutdown."""

    @property
    def closing(self) -> bool: ...

    def alarm_changed(self) -> None: ...
    def core_lost(self, reason: str) -> None: ...


@dataclass(eq=False)
class AmqpHub:
    settings: AmqpSettings
    link: CoreLink
    auth: AuthProvider
    metrics: AmqpMetrics
    topology: Topology
    instance: str  # this frontend process, as exclusive queues name their owners
    sessions: dict[str, HubSession] = field(default_factory=dict)  # by connection id
    exclusive_consumers: dict[str, str] = field(default_factory=dict)  # core queue -> owner
    refusing: set[str] = field(default_factory=set)  # core queues that refused a batch
    stopping: bool = False
    # the listeners' connection limits (the service sets them from its settings)
    connections: ConnectionLimits = field(default_factory=lambda: ConnectionLimits("amqp"))

    @property
    def alarms(self) -> frozenset[str]:
        """The resource alarms on (the core link's): publishers wait while any is."""
        return self.link.alarms

    @property
    def max_body(self) -> int:
        """The core's largest message body (16 MiB until it said otherwise)."""
        client = self.link.client
        if client is not None:
            v = client.limits.get("max_body")
            if isinstance(v, int) and v > 0:
                return v
        return _DEFAULT_MAX_BODY

    def owner_alive(self, owner: str) -> bool:
        """Is the connection ``<instance>/<connection>`` (of this instance) still open?"""
        _, _, conn = owner.partition("/")
        session = self.sessions.get(conn)
        return session is not None and not session.closing
