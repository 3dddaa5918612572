"""Exchange-to-exchange bindings and where a publish goes: moved to :mod:`polymq.routing`
(resolution) and :mod:`polymq.records` (the binding records), which the STOMP frontend's
``/exchange/`` destinations share; imported from there. The records' keys are described in
``topology.py``, which writes them.
"""

from __future__ import annotations

from polymq.records import ExchangeBinding, binding_digest
from polymq.routing import (
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
