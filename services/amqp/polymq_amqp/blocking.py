"""A connection's publisher blocked by a resource alarm (the hub's alarms, see ``hub.py``):
connection.blocked and connection.unblocked.

The session reads nothing more once it has read a publish while an alarm is set: that
publish is held here, and a client that announced the ``connection.blocked`` capability gets
``connection.blocked`` with the alarms as the reason (RabbitMQ's words: "low on memory").
When the last alarm clears, the session takes the held publish back (the client gets
``connection.unblocked`` if it was told), handles it and reads on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from pamqp import base, commands

if TYPE_CHECKING:
    from .hub import AmqpHub
    from .wire.events import Event

__all__ = ["Blocking", "BlockingSession"]

log = logging.getLogger(__name__)


class BlockingSession(Protocol):
    """The session as its blocking sees it: the alarms, whether the client takes
    connection.blocked, and how a method is sent."""

    @property
    def hub(self) -> AmqpHub: ...
    @property
    def blocked_notify(self) -> bool: ...

    def send_method(self, channel: int, method: base.Frame) -> bool: ...


class Blocking:
    """The publish ``session`` holds while an alarm is set (None: not blocked)."""

    def __init__(self, session: BlockingSession) -> None:
        self._session = session
        self.held: Event | None = None
        self._told = False  # connection.blocked went out

    def hold(self, publish: Event) -> None:
        """A publish while an alarm is set: hold it (the session reads nothing more)."""
        session = self._session
        alarms = sorted(session.hub.alarms)
        self.held = publish
        if session.blocked_notify and not self._told:
            reason = " and ".join(
                f"low on {a}" if a in ("memory", "disk") else f"{a} alarm" for a in alarms
            )  # RabbitMQ's: "low on memory"
            self._told = session.send_method(0, commands.Connection.Blocked(reason))
        log.info("amqp %s: publisher blocked (alarms: %s)", session, alarms)

    def release(self) -> Event:
        """The alarms cleared: the publish held (there is one), to be handled now."""
        held, self.held = self.held, None
        assert held is not None
        if self._told:
            self._told = False
            self._session.send_method(0, commands.Connection.Unblocked())
        log.info("amqp %s: publisher unblocked", self._session)
        return held
