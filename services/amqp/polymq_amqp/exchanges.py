"""Exchange types and how each routes: moved to :mod:`polymq_server.exchanges` (the STOMP
frontend's ``/exchange/`` destinations route the same way); imported from there."""

from __future__ import annotations

from polymq_server import exchanges as _exchanges
from polymq_server.exchanges import *  # noqa: F403

__all__ = _exchanges.__all__
