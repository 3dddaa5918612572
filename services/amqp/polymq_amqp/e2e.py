"""Exchange-to-exchange bindings and where a publish goes: moved to :mod:`polymq_server.routing`
(resolution) and :mod:`polymq_server.records` (the binding records), which the STOMP frontend's
``/exchange/`` destinations share; imported from there. The records' keys are described in
``topology.py``, which writes them.
"""

from __future__ import annotations

from polymq_server.records import ExchangeBinding, binding_digest
from polymq_server.routing import (
    MAX_EXCHANGES,
    Missing,
    destinations,
    matches,
    reached,
    topic_matches,
)

__all__ = [
    "MAX_EXCHANGES",
    "ExchangeBinding",
    "Missing",
    "binding_digest",
    "destinations",
    "matches",
    "reached",
    "topic_matches",
]
