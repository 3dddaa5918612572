"""AMQP names and the core's: moved to :mod:`polymq.names` (the STOMP frontend's vhosts use
the same names); imported from there."""

from __future__ import annotations

from polymq import names as _names
from polymq.names import *  # noqa: F403

__all__ = _names.__all__
