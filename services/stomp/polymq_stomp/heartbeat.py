"""A STOMP connection's heart-beats, once its CONNECT agreed them (``handshake.py`` agrees
the two intervals: the one we send at, the one the client sends at).

Sending: a beat (an EOL) whenever nothing went out for the interval we send at. Checking: a
client silent for longer than its interval times ``stomp_heartbeat_grace`` gets an ERROR
"heart-beat timeout" and is closed. Each direction runs on a timer of its own, set for the
moment it is next due, and reads the session's clocks
(:class:`~polymq_server.sessions.frontend.FrontendSession`'s ``last_read`` and ``last_written``). A
beat goes straight to the transport, never through the session's output buffer, and only
when that buffer is empty and the transport drains: a beat behind waiting frames would say
nothing. While the session has paused reading, the silence is its own, not the client's:
the check counts from the last time it found reading paused.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from polymq_server.sessions.frontend import SessionClocks

if TYPE_CHECKING:
    from .codec import StompConnection
    from .metrics import StompMetrics

__all__ = ["HeartbeatSession", "Heartbeats"]

_EARLY = 0.01  # seconds a send timer may fire early and still beat


class HeartbeatSession(SessionClocks, Protocol):
    """The session as its heart-beats see it: its clocks, its transport, and its ERROR."""

    @property
    def codec(self) -> StompConnection: ...
    @property
    def metrics(self) -> StompMetrics: ...

    def fail(
        self, message: str, detail: str, reason: str, receipt_id: str | None = None
    ) -> None: ...


class Heartbeats:
    """The heart-beat timers of ``session``: a beat every ``send_ms`` of silence on our side,
    a check that the client spoke within ``expect_ms`` times ``grace`` (0: not that way)."""

    def __init__(self, session: HeartbeatSession, send_ms: int, expect_ms: int, grace: float):
        self._session = session
        self._send_every = send_ms / 1000.0
        self._expect_every = expect_ms / 1000.0
        self._grace = grace
        now = session.loop.time()
        # the clocks as the heart-beats count them: the session's, or later (a beat sent or
        # not needed; reading found paused), and from now on
        self._beaten = now
        self._heard = now
        self._send_timer: asyncio.TimerHandle | None = None
        self._check_timer: asyncio.TimerHandle | None = None
        if self._send_every:
            self._send_timer = session.loop.call_later(self._send_every, self._send)
        if self._expect_every:
            self._check_timer = session.loop.call_later(self._limit, self._check)

    @property
    def _limit(self) -> float:
        """How long the client may be silent."""
        return self._expect_every * self._grace

    def stop(self) -> None:
        """The connection closes: no more beats nor checks."""
        for handle in (self._send_timer, self._check_timer):
            if handle is not None:
                handle.cancel()
        self._send_timer = self._check_timer = None

    def _send(self) -> None:
        session = self._session
        if session.closing:
            return
        loop = session.loop
        now = loop.time()
        due = max(session.last_written, self._beaten) + self._send_every
        if now >= due - _EARLY:
            if not session.output_pending and session.transport.writable:
                session.transport.write(session.codec.send_heartbeat())
                session.metrics.frames_out["HEARTBEAT"].inc()
            self._beaten = now
            due = now + self._send_every
        self._send_timer = loop.call_later(due - now, self._send)

    def _check(self) -> None:
        session = self._session
        if session.closing:
            return
        loop = session.loop
        now = loop.time()
        if session.reading_paused:
            self._heard = now  # we are not reading: the silence is ours, not the client's
        heard = max(session.last_read, self._heard)
        deadline = heard + self._limit
        if now >= deadline:
            session.fail(
                "heart-beat timeout",
                f"nothing received for {now - heard:.1f} s; the agreed heart-beat "
                f"interval is {self._expect_every * 1000:.0f} ms",
                "heartbeat",
            )
            return
        self._check_timer = loop.call_later(deadline - now, self._check)
