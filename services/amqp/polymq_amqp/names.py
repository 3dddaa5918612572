"""AMQP names and the core's: moved to :mod:`polymq_server.names` (the STOMP frontend's vhosts use
the same names); imported from there."""

from __future__ import annotations

from polymq_server import names as _names
from polymq_server.names import *  # noqa: F403

__all__ = _names.__all__
