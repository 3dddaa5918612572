"""Reloads in the core (:mod:`polymq.reload` says what a reload is and applies it).

In a cluster a reload is broadcast between the nodes on the NATS subject :data:`SUBJECT`
and every node applies it; each node announces the version it applied last on
``system.peers`` (``config_version``), so ``polymq cluster list`` shows a node that missed
one. On one node it is applied at once. Either way, a node that applied a reload publishes it
on its topic ``system.config`` for the frontends connected to it (:func:`publish`).
:func:`limits_setter` is how a reload's ``limits`` reach the broker's settings.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from polymq.config import ConfigError
from polymq.reload import LEVELS, TOPIC, Reloader, ReloadError, new_change
from polymq.types import Message

from .broker import Broker

__all__ = [
    "LEVELS",
    "SUBJECT",
    "ReloadError",
    "Reloader",
    "limits_setter",
    "new_change",
    "publisher",
]

SUBJECT = "polymq.system.config"


def limits_setter(broker: Broker) -> Callable[[dict[str, Any]], None]:
    """Sets a reload's limits on ``broker``'s settings (read where each limit is enforced,
    so new requests follow them at once), checked as at start-up."""

    def set_limits(limits: dict[str, Any]) -> None:
        settings = dataclasses.replace(broker.settings, **limits)
        try:
            settings.check()
        except ConfigError as exc:
            raise ReloadError(str(exc)) from exc
        broker.settings = settings

    return set_limits


def publisher(broker: Broker) -> Callable[[dict[str, Any]], None]:
    """Publishes each applied reload on ``broker``'s topic ``system.config`` (this node's
    subscribers only: every node publishes what it applied)."""

    def publish(change: dict[str, Any]) -> None:
        body = json.dumps(change, sort_keys=True).encode()
        broker.publisher.publish_topic(TOPIC, [Message(body=body, content_type="application/json")])

    return publish
