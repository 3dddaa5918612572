"""What a session writes: replies and deliveries, collected and sent as one frame per turn
of the loop, and the slow-consumer policy while the socket does not drain.

:class:`SessionOutput` is the part of :class:`~polymq_core.session.Session` that writes. A
reply goes out with the other replies of the turn (or at once past ``_REPLIES_AT_ONCE``);
deliveries collect per subscription (a :class:`Backlog`) and go out after them, in Deliver
events of at most ``_FRAME_MESSAGES`` messages, frames of about ``_FRAME_BYTES``. While the
socket does not drain (``pause_writing``), deliveries stay here; a subscription whose
backlog passes its ``buffer_messages`` / ``buffer_bytes`` gets its slow-consumer policy:
``disconnect`` closes the connection (its messages go back to their queues for others),
``drop`` drops topic messages for it alone.

It is a mixin, not a part the session calls through: every reply and delivery passes here,
so the session's (and the subscriptions') calls reach it with no layer between. The session
holds the state, declared here, and creates it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from polymq import inproc
from polymq.codec import EVENT_BYTES, Connection, weight
from polymq.errors import PolymqError
from polymq.events import Deliver, Event
from polymq.types import Message, SlowPolicy

if TYPE_CHECKING:
    from .destinations.subscription import Subscription
    from .metrics import Sensors

# (its lines are the session's: a slow consumer is logged as it was before the split)
log = logging.getLogger("polymq_core.session")

_FRAME_MESSAGES = 4096  # deliveries per Deliver event
_FRAME_BYTES = 4 * 1024 * 1024  # body bytes per frame, roughly


def _deliveries(sid: int, b: Backlog, events: list[Event], weights: list[int]) -> None:
    """Append ``b`` as Deliver events of at most _FRAME_MESSAGES / about _FRAME_BYTES."""
    n = len(b.tags)
    if n <= _FRAME_MESSAGES and b.nbytes <= _FRAME_BYTES:  # the common case
        events.append(Deliver(sid, b.tags, b.messages))
        weights.append(b.nbytes + n * EVENT_BYTES)
        return
    start = 0
    size = 0
    for i, m in enumerate(b.messages):
        size += len(m.body) + EVENT_BYTES
        if i + 1 - start >= _FRAME_MESSAGES or size >= _FRAME_BYTES or i + 1 == n:
            events.append(Deliver(sid, b.tags[start : i + 1], b.messages[start : i + 1]))
            weights.append(size)
            start, size = i + 1, 0


# Replies pending past this many go out at once rather than at the end of the loop's turn:
# a turn that reads many connections, each with a frame of thousands of requests, would
# otherwise hold every reply of them all at the same time (memory freed afterwards, but
# kept by the allocator).
_REPLIES_AT_ONCE = 1024

_SLOW_LINGER = 10.0  # seconds a cut slow consumer has to read what its socket still holds


class Backlog:
    """The deliveries of one subscription not yet written to the socket."""

    __slots__ = ("messages", "nbytes", "tags")

    def __init__(self) -> None:
        self.tags: list[int] = []
        self.messages: list[Message] = []
        self.nbytes = 0


class OutputHost(Protocol):
    """What writing uses of the broker: its sensors (slow consumers are counted)."""

    sensors: Sensors


class SessionOutput:
    """What a session writes (see the module's docstring)."""

    # what the session holds (Session.__init__ makes it)
    broker: OutputHost
    conn: Connection
    transport: asyncio.Transport | None
    loop: asyncio.AbstractEventLoop
    name: str
    messages_out: int  # delivered (the admin API's)
    _replies: list[Event]
    _raws: dict[int, bytes]  # index in _replies -> that event's encoded op
    _backlog: dict[Subscription, Backlog]
    _flush_scheduled: bool
    _paused: bool  # the socket is not draining
    _closed: bool
    # the transport is an in-process pipe to a frontend that takes events (polymq.inproc):
    # what can go as it is, is not encoded
    passes_events = False

    if TYPE_CHECKING:

        def close(
            self,
            code: str | None,
            message: str,
            *,
            abort: bool = False,
            linger: float | None = None,
        ) -> None: ...

    # ---- writing --------------------------------------------------------------------------
    def reply(self, event: Event, raw: bytes | None = None) -> None:
        """Send ``event`` (``raw``: its operation, encoded already by another node)."""
        if raw is not None:
            self._raws[len(self._replies)] = raw
        replies = self._replies
        replies.append(event)
        if len(replies) >= _REPLIES_AT_ONCE:
            self._flush()
        else:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    @property
    def writable(self) -> bool:
        return not self._paused and not self._closed

    def accepts(self, sub: Subscription) -> bool:
        """May a source hand ``sub`` another delivery now?

        While the socket does not drain, a ``disconnect`` subscription still takes deliveries:
        past its buffer the policy cuts this connection and its messages go to the others (a
        queue never waits on a slow consumer, nor leaves messages stuck with it). Others are
        passed over once their buffer is full."""
        if self._closed:
            return False
        if not self._paused or sub.options.slow_policy is SlowPolicy.DISCONNECT:
            return True
        b = self._backlog.get(sub)
        if b is None:
            return True
        o = sub.options
        return bool(len(b.tags) < o.buffer_messages and b.nbytes < o.buffer_bytes)

    def push_delivery(self, sub: Subscription, tag: int, msg: Message, key: Any) -> None:
        if self._closed:
            return  # cut off in the middle of a topic fan-out; queues ask accepts() first
        b = self._backlog.get(sub)
        if b is None:
            b = self._backlog[sub] = Backlog()
        b.tags.append(tag)
        b.messages.append(msg)
        b.nbytes += len(msg.body)
        if self._paused:
            o = sub.options
            if len(b.tags) > o.buffer_messages or b.nbytes > o.buffer_bytes:
                self._slow(sub, b)
        elif not self._flush_scheduled:
            self._schedule_flush()

    def push_deliveries(
        self, sub: Subscription, first: int, msgs: list[Message], nbytes: int
    ) -> None:
        """A topic's deliveries of ``msgs`` under tags ``first``, ``first + 1``, ...
        (``nbytes``: their bodies' bytes), as :meth:`push_delivery` of each: the backlog's
        lists grow by one extend each. While writing is paused each goes through
        :meth:`push_delivery`, which holds it to the subscription's buffer."""
        if self._closed:
            return
        if self._paused:
            for i, m in enumerate(msgs):
                self.push_delivery(sub, first + i, m, None)
            return
        b = self._backlog.get(sub)
        if b is None:
            b = self._backlog[sub] = Backlog()
        b.tags.extend(range(first, first + len(msgs)))
        b.messages.extend(msgs)
        b.nbytes += nbytes
        if not self._flush_scheduled:
            self._schedule_flush()

    def _slow(self, sub: Subscription, b: Backlog) -> None:
        if sub.options.slow_policy is SlowPolicy.DROP and sub.destination.startswith("topic/"):
            b.tags.pop()
            b.nbytes -= len(b.messages.pop().body)
            self.broker.sensors.on_slow_consumer("drop")
            return
        self.broker.sensors.on_slow_consumer("disconnect")
        log.warning(
            "session %s: slow consumer on %s (%d messages, %d bytes buffered), disconnecting",
            self.name,
            sub.destination,
            len(b.tags),
            b.nbytes,
        )
        self.close(
            "slow-consumer",
            f"subscription {sub.sid} on {sub.destination} passed its buffer of "
            f"{sub.options.buffer_messages} messages / {sub.options.buffer_bytes} bytes",
            linger=_SLOW_LINGER,
        )

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or self._closed or transport.is_closing():
            return
        events: list[Event] = self._replies
        self._replies = []
        given, self._raws = self._raws, {}
        weights = [weight(ev, given.get(i)) for i, ev in enumerate(events)]
        if not self._paused and self._backlog:
            backlog, self._backlog = self._backlog, {}
            for sub, b in backlog.items():
                if not sub.closed:
                    self.messages_out += len(b.tags)
                    _deliveries(sub.sid, b, events, weights)
        if not events:
            return
        raws = [given.get(i) for i in range(len(events))] if given else None
        try:
            if self.passes_events:  # a frontend in this process: its events as they are
                inproc.write_events(transport, self.conn, events, weights, _FRAME_BYTES)  # type: ignore[arg-type]
                return
            if len(events) == 1:
                transport.write(self.conn.send_many(events, raws))
                return
            # Frames of about _FRAME_BYTES each: no frame nears the peer's maximum.
            transport.writelines(self.conn.send_frames(events, weights, _FRAME_BYTES, raws))
        except PolymqError as exc:  # an event we cannot encode: a bug, not the peer's fault
            log.exception("session %s: cannot send: %s", self.name, exc)
            self.close("internal", "the server could not encode a reply", abort=True)


__all__ = ["Backlog", "OutputHost", "SessionOutput"]
