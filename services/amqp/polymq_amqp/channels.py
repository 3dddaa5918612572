"""A connection's channels: the table of the open ones, by number, and how a channel opens
and closes (each channel's other methods are its own, ``channel.py``).

A channel opens with the client's channel.open (channel.open-ok) and closes three ways: the
client's channel.close (its resources released, then channel.close-ok), a channel exception
(released, then our channel.close with the reply code; the client's close-ok frees its
number in the codec), and the connection's end (every channel released). Releasing a
channel ends its consumers, whose unacknowledged messages go back to their queues.
"""

from __future__ import annotations

import logging

from pamqp import base, commands

from .channel import Channel, ChannelSession
from .errors import CHANNEL_ERROR, AmqpError, ConnectionException
from .wire.states import State

__all__ = ["Channels"]

log = logging.getLogger(__name__)


class Channels:
    """The open channels of ``session``'s connection."""

    def __init__(self, session: ChannelSession) -> None:
        self._session = session
        self._open: dict[int, Channel] = {}

    def get(self, number: int) -> Channel | None:
        return self._open.get(number)

    def __contains__(self, number: object) -> bool:
        return number in self._open

    def opened(self) -> list[Channel]:
        """The open channels, by number."""
        return [self._open[number] for number in sorted(self._open)]

    def counts(self) -> dict[str, int]:
        """The channels and their consumers, as the admin API shows the connection."""
        channels = list(self._open.values())
        subs = sum(len(ch.consumers.by_tag) for ch in channels)
        return {"subscriptions": subs, "channels": len(channels)}

    def handle(self, number: int, method: base.Frame) -> None:
        """A method on channel ``number`` (not 0). One the broker answers waits, with the
        frames behind it, until the channel's mandatory publishes are answered, so that
        their basic.return goes out before its answer (as RabbitMQ's channel sends them)."""
        ch = self._open.get(number)
        if ch is not None and ch.publisher.returns_due and method.synchronous:
            self._session.start_busy(self._after_returns(ch, number, method), number, method)
            return
        self._handle(number, method)

    async def _after_returns(self, ch: Channel, number: int, method: base.Frame) -> None:
        await ch.publisher.returns_sent()
        if self._open.get(number) is ch or isinstance(method, commands.Channel.Close):
            self._handle(number, method)  # (a channel closed meanwhile ignores the rest)

    def _handle(self, number: int, method: base.Frame) -> None:
        session = self._session
        if isinstance(method, commands.Channel.Open):
            self._open[number] = Channel(session, number)
            session.metrics.channels.inc()
            session.send_method(number, commands.Channel.OpenOk())
            return
        if isinstance(method, commands.Channel.Close):
            ch = self._open.pop(number, None)
            if ch is not None:
                ch.teardown()
                session.metrics.channels.dec()
            session.send_method(number, commands.Channel.CloseOk())
            return
        if isinstance(method, commands.Channel.CloseOk):
            return  # the answer to our channel.close: the codec freed the channel
        ch = self._open.get(number)
        if ch is None:  # pragma: no cover - the codec checks channel states
            raise ConnectionException(CHANNEL_ERROR, f"channel {number} is not open")
        ch.handle(method)

    def close(self, number: int, err: AmqpError) -> None:
        """channel.close with ``err``'s reply code; the channel's resources are released."""
        session = self._session
        ch = self._open.pop(number, None)
        if ch is not None:
            ch.teardown()
            session.metrics.channels.dec()
        if session.codec.channel_state(number) is not State.CHANNEL_OPEN:
            return
        session.metrics.error(err.reply_code, "channel")
        log.info("amqp %s: channel %d closed: %s", session, number, err.reply_text)
        session.send_method(
            number,
            commands.Channel.Close(err.reply_code, err.reply_text, err.class_id, err.method_id),
        )

    def close_all(self) -> None:
        """The connection ends: every channel's resources are released."""
        channels, self._open = list(self._open.values()), {}
        for ch in channels:
            ch.teardown()
        if channels:
            self._session.metrics.channels.dec(len(channels))
