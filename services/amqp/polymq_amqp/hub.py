"""What every connection of one AMQP frontend shares: settings, the core link, the auth
provider, metrics, the topology records, and the open connections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from polymq.auth import AuthProvider
from polymq.corelink import CoreLink

from .config import AmqpSettings
from .metrics import AmqpMetrics
from .topology import Topology

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Hub"]

_DEFAULT_MAX_BODY: Final = 16 * 1024 * 1024


@dataclass(eq=False)
class Hub:
    settings: AmqpSettings
    link: CoreLink
    auth: AuthProvider
    metrics: AmqpMetrics
    topology: Topology
    instance: str  # this frontend process, as exclusive queues name their owners
    sessions: dict[str, Session] = field(default_factory=dict)  # by connection id
    exclusive_consumers: dict[str, str] = field(default_factory=dict)  # core queue -> owner
    refusing: set[str] = field(default_factory=set)  # core queues that refused a batch
    stopping: bool = False

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
