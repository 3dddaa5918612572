"""An AMQP connection's heartbeats, once its connection.tune-ok agreed an interval (the
client's choice of what connection.tune offered, see ``handshake.py``; 0: none).

One timer, every half interval, does both sides: a heartbeat frame goes out if nothing else
did for half an interval, and a client silent for two intervals (the spec's rule) is dropped
at once, without connection.close (it would not read it). It reads the session's clocks
(:class:`~polymq_server.sessions.frontend.FrontendSession`'s ``last_read`` and ``last_written``). A
heartbeat goes straight to the transport, never through the session's output buffer, and
only when that buffer is empty: waiting frames will say the connection is alive. While the
session has paused reading, the silence is its own, not the client's: the check counts
from the last time it found reading paused.

Unlike STOMP's (``polymq_stomp.heartbeat``: one interval each way, timers set for the
moment each is due, an ERROR frame with a grace factor), the interval is the same both
ways and the timer polls.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from polymq_server.sessions.frontend import SessionClocks

from .errors import CONNECTION_FORCED

if TYPE_CHECKING:
    from .metrics import AmqpMetrics
    from .wire.codec import AmqpConnection

__all__ = ["HeartbeatSession", "Heartbeats"]

log = logging.getLogger(__name__)

_EARLY = 0.01  # seconds the timer may fire early and still beat


class HeartbeatSession(SessionClocks, Protocol):
    """The session as its heartbeats see it: its clocks, its transport, and the drop."""

    @property
    def codec(self) -> AmqpConnection: ...
    @property
    def metrics(self) -> AmqpMetrics: ...

    def drop(self) -> None: ...


class Heartbeats:
    """The heartbeat timer of ``session``, every ``seconds`` / 2 (``seconds`` > 0)."""

    def __init__(self, session: HeartbeatSession, seconds: int) -> None:
        self._session = session
        self._interval = float(seconds)
        now = session.loop.time()
        # the clocks as the heartbeats count them: the session's, or later (a heartbeat
        # sent or not needed; reading found paused), and from now on
        self._beaten = now
        self._heard = now
        self._timer: asyncio.TimerHandle | None = session.loop.call_later(
            self._interval / 2, self._tick
        )

    def stop(self) -> None:
        """The connection closes: no more heartbeats nor checks."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        """Every half interval: send one if nothing else went out; drop a silent client."""
        session = self._session
        if session.closing:
            return
        now = session.loop.time()
        if session.reading_paused:
            self._heard = now  # we are not reading: the silence is ours
        if now - max(session.last_read, self._heard) > 2 * self._interval:
            session.metrics.error(CONNECTION_FORCED, "connection")
            log.info(
                "amqp %s: missed heartbeats from the client, timeout: %ds",
                session,
                int(self._interval),
            )
            session.drop()
            return
        written = max(session.last_written, self._beaten)
        if now - written >= self._interval / 2 - _EARLY and not session.output_pending:
            if session.transport.writable:
                session.transport.write(session.codec.send_heartbeat())
                session.metrics.method_out("heartbeat")
            self._beaten = now
        self._timer = session.loop.call_later(self._interval / 2, self._tick)
