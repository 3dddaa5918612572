"""What every bridge link shares: the run loop that restarts a link's session with backoff.

A link runs *sessions*. A session starts once both sides are connected, consumes the source
and forwards to the target, and ends when either connection is lost, when it fails (a
publish the target refused or did not confirm in time, a missing queue, ...) or when the
bridge stops. Whatever the source delivered and the target did not confirm is then given
back: unacknowledged messages return to the polymq queue when the subscription ends, and to
the RabbitMQ queue when the channel closes — the broker that still holds a message
redelivers it, so none is lost (some may arrive twice). Then the link waits a jittered,
capped, doubling delay and starts a new session.

Exception tree::

    Exception
     └── SessionEnded          a session stopped (its message says why); the link restarts
          └── SideLost         a connection went away during the session
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from aio_pika.abc import AbstractChannel, AbstractConnection

from polymq import Client

from .config import BridgeSettings, LinkConfig
from .metrics import LinkMetrics
from .side import Attachment, Backoff, CoreSide, RabbitSide, Stopping

__all__ = ["Contiguous", "LinkRunner", "SessionEnded", "SideLost", "describe"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_STABLE = 10.0  # a session that ran this long resets the backoff
_CLOSE_TIMEOUT = 5.0  # seconds for RabbitMQ to answer channel.close
_HELPERS_WITHIN = 1.0  # seconds a cancelled helper may take before it is cancelled again


class SessionEnded(Exception):
    """A session stopped; the message says why."""


class SideLost(SessionEnded):
    """A connection went away during the session."""


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Contiguous:
    """The highest number confirmed together with every number taken before it.

    Numbers are taken in increasing order (stream sequences, AMQP delivery tags) and
    confirmed in any order; ``committed`` only moves over an unbroken run of confirmed ones.
    """

    def __init__(self, committed: int) -> None:
        self.committed = committed
        self.saved = committed  # what was last written down (a stream link's kv record)
        self._pending: deque[int] = deque()  # in delivery order
        self._done: set[int] = set()

    def taken(self, seq: int) -> None:
        self._pending.append(seq)

    def confirmed(self, seq: int) -> None:
        self._done.add(seq)
        pending, done = self._pending, self._done
        while pending and pending[0] in done:
            s = pending.popleft()
            done.discard(s)
            self.committed = s

    @property
    def outstanding(self) -> int:
        return len(self._pending)


class LinkRunner(abc.ABC):
    """Runs one link's sessions until :meth:`stop`."""

    def __init__(
        self,
        config: LinkConfig,
        core: CoreSide,
        rabbit: RabbitSide,
        metrics: LinkMetrics,
        settings: BridgeSettings,
    ) -> None:
        self.config = config
        self.name = config.name
        self.core = core
        self.rabbit = rabbit
        self.metrics = metrics
        self.settings = settings
        self.state = "starting"
        self.last_error = ""
        self.running = False  # a session is consuming the source
        self.stopping = False
        self._draining = asyncio.Event()  # stop(): the session winds down gracefully
        self._failed: asyncio.Future[str] | None = None  # the session's own failure
        self._backoff = Backoff(settings.bridge_backoff_min, settings.bridge_backoff_max)
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # the current session's helpers

    # ---- life cycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"polymq-bridge-link-{self.name}")

    async def stop(self) -> None:
        """Stop consuming, give in-flight messages ``bridge_stop_grace`` to be confirmed,
        give back the rest, end the session."""
        self.stopping = True
        self._draining.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), self.settings.bridge_stop_grace + 5)
        except TimeoutError:
            log.warning("bridge: link %s did not stop in time; cancelling it", self.name)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def status(self) -> dict[str, Any]:
        c = self.config
        out: dict[str, Any] = {
            "name": c.name,
            "direction": c.direction.value,
            "state": self.state,
            "running": self.running,
        }
        if self.last_error:
            out["last_error"] = self.last_error
        return out

    async def _run(self) -> None:
        while not self.stopping:
            try:
                self.state = "waiting for the core"
                core = await self._unless_stopping(self.core.wait())
                self.state = "waiting for RabbitMQ"
                rabbit = await self._unless_stopping(self.rabbit.wait())
            except Stopping:
                break
            if self.notice_lost(core, rabbit):
                continue
            t0 = time.monotonic()
            self._failed = asyncio.get_running_loop().create_future()
            try:
                await self._session(core, rabbit)
                reason = ""
            except asyncio.CancelledError:
                raise
            except Stopping:
                break
            except SideLost as exc:
                reason = str(exc)
                self.metrics.error("connection_lost")
            except SessionEnded as exc:
                reason = str(exc)
            except Exception as exc:
                reason = describe(exc)
                if not (core.alive and rabbit.alive):
                    self.metrics.error("connection_lost")
                else:
                    self.metrics.error("source_failed")
                    log.debug("bridge: link %s session failed", self.name, exc_info=True)
            finally:
                self.running = False
                self.metrics.up.set(0)
                self.metrics.in_flight.set(0)
                await self._cancel_helpers()
            if self.stopping:
                break
            self.last_error = reason or "the session ended"
            if time.monotonic() - t0 >= _STABLE:
                self._backoff.reset()
            delay = self._backoff.next()
            self.state = f"restarting in {delay:.2f}s after: {self.last_error}"
            log.warning("bridge: link %s: %s; restarting in %.2fs", self.name, reason, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._draining.wait(), delay)
        self.state = "stopped"

    async def _unless_stopping(self, aw: Awaitable[T]) -> T:
        """``await aw``, or :class:`Stopping` as soon as :meth:`stop` is called."""
        task = asyncio.ensure_future(aw)
        drain = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait({task, drain}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drain.cancel()
            if not task.done():
                task.cancel()
        if task.cancelled():
            raise Stopping(f"link {self.name} is stopping")
        return task.result()

    # ---- for sessions ---------------------------------------------------------------------
    def spawn(self, aw: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        """A helper task of the current session (cancelled when the session ends)."""
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                # the session's outcome says why it ended; this is the detail
                log.debug("bridge: link %s: %s ended: %s", self.name, what, t.exception())

        task.add_done_callback(done)
        return task

    async def _cancel_helpers(self) -> None:
        """Cancel the session's helpers and wait until each has ended, cancelling again
        any that outlives a cancel (Python 3.11's ``wait_for`` can swallow one: see
        :func:`~polymq_bridge.side.check_cancelled`): the next session never waits on one."""
        left = set(self._tasks)
        warned = False
        while left:
            for t in left:
                t.cancel()
            _, left = await asyncio.wait(left, timeout=_HELPERS_WITHIN)
            if left and not warned:
                warned = True
                log.warning(
                    "bridge: link %s: %d helper task(s) went on after a cancel; cancelling again",
                    self.name,
                    len(left),
                )
        self._tasks.clear()

    def fail(self, reason: str) -> None:
        """End the current session (from a helper task of that session)."""
        if self._failed is not None and not self._failed.done():
            self._failed.set_result(reason)

    def failer(self) -> Callable[[str], None]:
        """``fail`` bound to the current session: for callbacks that may fire late (a
        channel's close callback), so that they can never end a later session."""
        failed = self._failed

        def fail(reason: str) -> None:
            if failed is not None and not failed.done():
                failed.set_result(reason)

        return fail

    def channel_closed(self) -> Callable[..., None]:
        """A close callback for this session's RabbitMQ channel."""
        fail = self.failer()

        def closed(_sender: Any, exc: BaseException | None = None) -> None:
            fail(f"the RabbitMQ channel closed: {describe(exc) if exc else 'closed'}")

        return closed

    async def until_ended(
        self,
        core: Attachment[Client],
        rabbit: Attachment[AbstractConnection],
        extra: Iterable[asyncio.Future[Any]] = (),
    ) -> str:
        """Wait until a side is lost, the session fails, ``extra`` completes or the bridge
        stops; returns ``"draining"`` for a graceful stop, else raises why it ended."""
        assert self._failed is not None
        drain = asyncio.ensure_future(self._draining.wait())
        waits: set[asyncio.Future[Any]] = {core.lost, rabbit.lost, self._failed, drain, *extra}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drain.cancel()
        self.notice_lost(core, rabbit)
        if core.lost.done():
            raise SideLost(f"lost the core: {core.lost.result()}")
        if rabbit.lost.done():
            raise SideLost(f"lost RabbitMQ: {rabbit.lost.result()}")
        if self._failed.done():
            raise SessionEnded(self._failed.result())
        for fut in extra:
            if fut.done():
                exc = fut.exception() if not fut.cancelled() else None
                if exc is not None:
                    raise SessionEnded(describe(exc)) from exc
                raise SessionEnded("the source ended")
        return "draining"

    def notice_lost(self, core: Attachment[Client], rabbit: Attachment[AbstractConnection]) -> bool:
        """Tell a side at once when its connection is seen closed (it would notice at its
        next check); True if either is gone."""
        if core.alive and core.conn.closed:
            reason = core.conn.close_reason
            self.core.report_lost(core, str(reason) if reason else "connection closed")
        if rabbit.alive and rabbit.conn.is_closed:
            self.rabbit.report_lost(rabbit, "connection closed")
        return not (core.alive and rabbit.alive)

    async def close_channel(
        self, channel: AbstractChannel, rabbit: Attachment[AbstractConnection]
    ) -> None:
        """Close a session's channel. Never by cancelling aio-pika midway (that can leave
        the connection out of step with RabbitMQ): a close that does not finish in time
        gives up the whole connection instead, which the RabbitMQ side then makes again."""
        if channel.is_closed or not rabbit.alive:
            return
        task = self.spawn(channel.close(), "closing a channel")
        done, _ = await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT)
        if not done:
            log.warning(
                "bridge: link %s: a RabbitMQ channel did not close within %gs; reconnecting",
                self.name,
                _CLOSE_TIMEOUT,
            )
            self.rabbit.report_lost(rabbit, "a channel did not close in time")

    def started(self) -> None:
        self.running = True
        self.state = "running"  # last_error stays: what ended the previous session
        self.metrics.up.set(1)
        self.metrics.sessions.inc()
        log.info("bridge: link %s is running (%s)", self.name, self.describe_route())

    @abc.abstractmethod
    def describe_route(self) -> str: ...

    @abc.abstractmethod
    async def _session(
        self, core: Attachment[Client], rabbit: Attachment[AbstractConnection]
    ) -> None:
        """Run one session; return after a graceful stop, raise :class:`SessionEnded`."""
