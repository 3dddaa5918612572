"""Resource alarms: the core's memory high watermark and disk free limit (issue 17).

While an alarm is on, publishers on every protocol are held back and consumers keep
draining. The core measures (``polymq_core.alarms``) and publishes its state on its topic
``system.alarms`` when it changes and every :data:`EVERY` seconds, as
``{"alarms": ["memory"], "memory": {"used": N, "limit": N, "rises_at": N, "clears_at": N,
"pressure": true}, "disk": {"free": N, "limit": N}}`` (bytes; ``limit`` is the memory high
watermark, under which the alarm rises and clears, ``pressure`` whether the memory is past
where it clears: ``polymq_core.alarms``); every frontend's core link hears it
(:meth:`polymq_server.link.corelink.CoreLink.on_alarms`) and holds its own publishers back in its
protocol's way: AMQP sends ``connection.blocked`` and stops reading publishing connections,
the HTTP, long-poll and Avro frontends answer a publish 503 with ``Retry-After``; the core
itself stops reading the wire connections of native publishers.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["EVERY", "RESOURCES", "TOPIC", "decode", "encode", "why"]

TOPIC: Final = "system.alarms"
EVERY: Final = 2.0  # seconds between two announcements of the same state
RESOURCES: Final = ("memory", "disk")


def encode(alarms: frozenset[str], detail: dict[str, Any]) -> bytes:
    return json.dumps({"alarms": sorted(alarms), **detail}, separators=(",", ":")).encode()


def decode(body: bytes) -> frozenset[str]:
    """The alarms an announcement says are on (ValueError if it is not one)."""
    data = json.loads(body)
    alarms = data.get("alarms") if isinstance(data, dict) else None
    if not isinstance(alarms, list) or not all(isinstance(a, str) for a in alarms):
        raise ValueError("not an alarms announcement")
    return frozenset(alarms)


def why(alarms: frozenset[str]) -> str:
    """What a held publisher is told."""
    names = " and ".join(sorted(alarms))
    return f"the broker's {names} alarm is on: publishers are held until it clears; retry"
