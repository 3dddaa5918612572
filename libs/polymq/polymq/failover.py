"""A client connection's failover: the part of a :class:`~polymq.connection.CoreConnection`
that, once its connection is lost (or the core says it is going), connects to another of
its addresses, makes its subscriptions and unanswered requests again there, and reports a
:class:`Reconnected`; or, when no address takes it within ``reconnect_timeout`` seconds,
fails what is pending. It runs per failover, not per message: what it uses of the
connection is a :class:`FailoverHost`.

The rules (docs/cluster.md, "Clients that fail over"): the addresses are tried the lost
one last, round after round with jittered exponential back-off; every subscription is made
again under its id and options (a stream's from the entry after the last delivered); every
request still unanswered is sent again in the order it was made (publishes with their batch
ids, so the core answers one it already took as a duplicate); acks, nacks and unsubscribes
of the lost connection are answered here and not sent (the core gives unacked deliveries
again; a tag handed out after the n-th failover is the core's plus ``n << 40``, so an old
tag never acks a new delivery). A publish or subscribe answered Unavailable (no shard
leader for longer than the core holds requests) is sent again a moment later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .addresses import Address, Backoff
from .deliveries import Subscription
from .errors import ConnectionClosed, PolymqError
from .events import Ack, Event, Nack, Publish, Subscribe, Unsubscribe

__all__ = ["FAILOVER_CODES", "Failover", "FailoverHost", "Reconnected"]

log = logging.getLogger("polymq.client")

# a Goodbye with one of these (or a connection lost) sends a failover connection elsewhere;
# any other (slow-consumer, protocol-error, unauthorized, ...) ends it, as without failover
FAILOVER_CODES = frozenset({"shutdown", "unavailable", "closed", "lost"})
_TAG_SHIFT = 40  # a subscription's tags on the n-th connection are n << 40 plus the core's
_RETRY_DELAY = 0.5  # seconds before a request answered Unavailable is sent again

# a request waiting for its answer: its future, what makes the answer of its Ok's result
# (None: the result as it is), and the request itself
Waiting = tuple[asyncio.Future[Any], Callable[[Any], Any] | None, Event]


@dataclass(frozen=True, slots=True)
class Reconnected:
    """The connection failed over: it lost ``previous`` (``reason`` says why) and is
    connected again, to ``address``, ``downtime`` seconds later; it re-subscribed
    ``resubscribed`` subscriptions and re-sent ``resent`` unanswered requests."""

    address: str
    previous: str
    reason: str
    downtime: float
    resubscribed: int
    resent: int


class FailoverHost(Protocol):
    """What the failover uses of its connection: its addresses, the requests waiting and
    the subscriptions, what waits to be sent, and connecting. A protocol, so that this
    module need not import the connection's, which imports it."""

    addresses: list[Address]
    address: Address | None
    closed: bool
    _pending: dict[int, Waiting]
    _subs: dict[int, Subscription]
    _out: list[Event]
    _ack_subs: set[Subscription]

    def _rid(self) -> int: ...
    def _send(self, ev: Event) -> None: ...
    def _flush(self) -> None: ...
    def _fail_all(self, reason: BaseException) -> None: ...
    async def _expanded(self) -> list[Address]: ...
    async def _attempt(self, address: Address, timeout: float) -> None: ...


class Failover:
    """The failover of ``host``: for up to ``timeout`` seconds after a loss, connecting
    attempts each within ``connect_timeout``; ``on_reconnect`` is told of each success."""

    def __init__(
        self,
        host: FailoverHost,
        timeout: float,
        connect_timeout: float,
        on_reconnect: Callable[[Reconnected], None] | None = None,
    ) -> None:
        self.host = host
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.on_reconnect = on_reconnect
        self.reconnects = 0
        self.retrying: dict[int, float] = {}  # request id -> when first answered Unavailable
        self._task: asyncio.Task[None] | None = None
        self._lost_at = 0.0  # time.monotonic() of the last loss
        self._generation = 0  # connections made since the first

    @property
    def active(self) -> bool:
        """Whether the connection is lost and this is connecting to another address."""
        return self._task is not None

    def begin(self, reason: PolymqError) -> None:
        """The connection was dropped (the host keeps what is pending and every
        subscription): connect elsewhere."""
        host = self.host
        self._lost_at = time.monotonic()
        log.warning(
            "polymq: lost the core at %s (%s); failing over to %s for up to %g s",
            host.address,
            reason,
            ", ".join(map(str, host.addresses)),
            self.timeout,
        )
        self._task = asyncio.get_running_loop().create_task(
            self._reconnect(reason), name="polymq-client-failover"
        )

    async def cancel(self) -> None:
        """Stop connecting (the host is closing)."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _reconnect(self, reason: PolymqError) -> None:
        """Try every address (the lost one last), round after round with back-off, until
        one welcomes us (then :meth:`_resume`) or the time is up (then everything pending
        fails)."""
        host = self.host
        deadline = self._lost_at + self.timeout
        previous = host.address
        backoff = Backoff()
        last: BaseException = reason
        try:
            while True:
                addresses = await host._expanded()
                if previous in addresses:
                    i = addresses.index(previous) + 1
                    addresses = addresses[i:] + addresses[:i]
                for address in addresses:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        await host._attempt(address, min(self.connect_timeout, left))
                    except PolymqError as exc:
                        last = exc
                        log.debug("polymq: failover to %s: %s", address, exc)
                        continue
                    self._task = None
                    self._resume(previous, reason)
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await asyncio.sleep(min(backoff.next(), left))
        except Exception as exc:  # a bug must not leave the calls waiting for ever
            log.exception("polymq: failover failed")
            last = exc
        self._task = None
        host._fail_all(
            ConnectionClosed(
                f"no polymq core took the connection within {self.timeout:g} s of losing "
                f"{previous} ({reason}); tried {', '.join(map(str, host.addresses))}, "
                f"last: {last}"
            )
        )

    def _resume(self, previous: Address | None, reason: PolymqError) -> None:
        """Connected again: subscribe every subscription again, send every unanswered
        request again in the order they were made (acks and unsubscribes of the lost
        connection are answered here: there is nothing left to ack or leave), and report."""
        host = self.host
        self._generation += 1
        base = self._generation << _TAG_SHIFT
        resend = sorted(host._pending.items())
        subscribing = {ev.sid for _, (_, _, ev) in resend if isinstance(ev, Subscribe)}
        out: list[Event] = []
        for sub in host._subs.values():
            sub._rebase(base)
            if sub.sid not in subscribing:
                out.append(self._resubscribe(sub))
        resubscribed = len(out)
        for rid, (fut, answer, ev) in resend:
            if fut.done() or isinstance(ev, Ack | Nack | Unsubscribe):
                del host._pending[rid]
                if not fut.done():
                    result = {"acked": 0} if isinstance(ev, Ack) else {"nacked": 0}
                    fut.set_result(None if isinstance(ev, Unsubscribe) else result)
                continue
            subscribing_sub = host._subs.get(ev.sid) if isinstance(ev, Subscribe) else None
            if isinstance(ev, Subscribe) and subscribing_sub is not None:
                # (a stream's deliveries may have come before its answer)
                ev = dataclasses.replace(ev, options=subscribing_sub._resume_options())
                host._pending[rid] = (fut, answer, ev)
            out.append(ev)
        resent = len(out) - resubscribed
        # what was made meanwhile is pending (above) but fire-and-forget publishes
        out += [ev for ev in host._out if isinstance(ev, Publish) and ev.rid == 0]
        host._out = out
        host._ack_subs.clear()
        self.reconnects += 1
        event = Reconnected(
            str(host.address),
            str(previous),
            str(reason),
            time.monotonic() - self._lost_at,
            resubscribed,
            resent,
        )
        log.warning(
            "polymq: failed over from %s to %s after %.2f s: %d subscriptions and %d requests "
            "made again",
            event.previous,
            event.address,
            event.downtime,
            resubscribed,
            resent,
        )
        host._flush()
        if self.on_reconnect is not None:
            try:
                self.on_reconnect(event)
            except Exception:  # the application's bug must not stop the connection
                log.exception("polymq: the on_reconnect callback failed")

    def _resubscribe(self, sub: Subscription) -> Subscribe:
        """``sub``'s Subscribe on the new connection; should the core refuse it, its
        iterator ends with why."""
        host = self.host
        ev = Subscribe(host._rid(), sub.sid, sub.destination, sub._resume_options())
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future[Any]) -> None:
            exc = None if f.cancelled() else f.exception()
            if exc is not None and host._subs.get(sub.sid) is sub:
                log.warning("polymq: cannot subscribe to %s again: %s", sub.destination, exc)
                del host._subs[sub.sid]
                sub._end(exc)

        fut.add_done_callback(done)
        host._pending[ev.rid] = (fut, sub._subscribed, ev)
        return ev

    def retry(self, rid: int) -> bool:
        """Request ``rid`` was answered Unavailable (its shard's leader was moving longer
        than the core holds requests): one that is safe to make twice (a publish with a
        batch id, a subscribe) is sent again a moment later, for up to ``timeout``
        seconds. Whether it was."""
        host = self.host
        waiting = host._pending.get(rid)
        if waiting is None or waiting[0].done():
            return False
        ev = waiting[2]
        if not (isinstance(ev, Subscribe) or (isinstance(ev, Publish) and ev.batch_id)):
            return False
        first = self.retrying.setdefault(rid, time.monotonic())
        if time.monotonic() - first > self.timeout:
            del self.retrying[rid]
            return False
        generation = self._generation

        def again() -> None:
            if self._generation == generation and rid in host._pending and not host.closed:
                host._send(ev)

        asyncio.get_running_loop().call_later(_RETRY_DELAY, again)
        return True
