"""Exchange types and how each routes: moved to :mod:`polymq.exchanges` (the STOMP
frontend's ``/exchange/`` destinations route the same way); imported from there."""

from __future__ import annotations

from polymq import exchanges as _exchanges
from polymq.exchanges import *  # noqa: F403

__all__ = _exchanges.__all__
