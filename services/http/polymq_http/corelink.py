"""The frontend's one connection to the core, made again with backoff when it drops.

Every handler shares one :class:`polymq.Client` (requests issued together travel in one
frame). :class:`CoreLink` owns it: a task connects, watches the connection (a ping every few
seconds finds a core that hangs) and reconnects with jittered exponential backoff; while
there is no connection :meth:`CoreLink.call` fails fast with ``Unavailable`` (503).

Two things keep the shared connection healthy whatever the requests carry:

- publishes hold a byte budget (half the core's frame limit) while they are in flight, so
  requests coalesced into one frame can never make a frame the core would refuse;
- a long poll whose HTTP request went away (client gone, deadline, shutdown) hands back any
  messages leased for it after it gave up: they are requeued at once instead of staying
  invisible until their visibility timeout.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from polymq import Client, Lease
from polymq.errors import ConnectionClosed, RequestError, Unauthorized, Unavailable

from .config import HttpSettings
from .metrics import HttpMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")

CORE_TIMEOUT = 30.0  # seconds for the core to answer one request (beyond a pull's wait)
_CONNECT_TIMEOUT = 5.0
_PING_INTERVAL = 5.0
_MIN_DELAY, _MAX_DELAY = 0.1, 5.0
_DEFAULT_MAX_FRAME = 64 * 1024 * 1024


class ByteBudget:
    """At most ``limit`` bytes held at once; one holder may exceed it when alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self, n: int) -> None:
        while self.used and self.used + n > self.limit:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)


class CoreLink:
    def __init__(self, settings: HttpSettings, metrics: HttpMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.client: Client | None = None
        self.last_error = "not connected yet"
        self.budget = ByteBudget(_DEFAULT_MAX_FRAME // 2)
        self.stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._first_attempt = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # ---- life cycle ------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.settings.core_host}:{self.settings.core_port}"

    @property
    def connected(self) -> bool:
        return self.client is not None and not self.client.closed

    async def start(self, first_wait: float = _CONNECT_TIMEOUT + 1) -> None:
        """Start connecting; return after the first attempt (or ``first_wait``) either way."""
        self._task = asyncio.create_task(self._run(), name="polymq-http-corelink")
        try:
            await asyncio.wait_for(self._first_attempt.wait(), first_wait)
        except TimeoutError:
            pass

    async def stop(self) -> None:
        self.stopping.set()
        if self._background:
            await asyncio.wait(set(self._background), timeout=2.0)
        for task in (*self._background, self._task):
            if task is not None and not task.done():
                task.cancel()
        for task in (*self._background, self._task):
            if task is not None:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:  # pragma: no cover - logged by the task itself
                    pass
        client, self.client = self.client, None
        if client is not None:
            await client.close()
        self.metrics.core_connected.set(0)

    async def _run(self) -> None:
        delay = _MIN_DELAY
        failures = 0
        while True:
            s = self.settings
            try:
                client = await Client.connect(
                    s.core_host,
                    s.core_port,
                    client="http",
                    user=s.core_user,
                    password=s.core_password,
                    token=s.core_token,
                    timeout=_CONNECT_TIMEOUT,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.last_error = str(exc) or type(exc).__name__
                hint = ""
                if isinstance(exc, Unauthorized):
                    hint = " (set POLYMQ_CORE_USER and POLYMQ_CORE_PASSWORD for this frontend)"
                level = logging.WARNING if failures == 1 or failures % 30 == 0 else logging.DEBUG
                log.log(
                    level,
                    "http: cannot connect to the core at %s: %s%s; retrying",
                    self.address,
                    self.last_error,
                    hint,
                )
                self._first_attempt.set()
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, _MAX_DELAY)
                continue
            self._attached(client)
            failures = 0
            delay = _MIN_DELAY
            self._first_attempt.set()
            try:
                await self._watch(client)
            finally:
                self.metrics.core_connected.set(0)
                if self.client is client:
                    self.client = None
                await client.close()
            reason = client.close_reason
            self.last_error = str(reason) if reason else "connection lost"
            log.warning(
                "http: lost the connection to the core at %s: %s; reconnecting",
                self.address,
                self.last_error,
            )

    def _attached(self, client: Client) -> None:
        limits = client.limits
        frame = limits.get("max_frame")
        if isinstance(frame, int) and frame > 0:
            self.budget.limit = frame // 2
        s = self.settings
        for name in ("max_body", "max_pull", "max_wait"):
            theirs = limits.get(name)
            if isinstance(theirs, int | float) and getattr(s, name) > theirs:
                log.warning(
                    "http: POLYMQ_%s=%s is above the core's %s: the core's limit rules",
                    name.upper(),
                    getattr(s, name),
                    theirs,
                )
        self.client = client
        self.last_error = ""
        self.metrics.core_connected.set(1)
        self.metrics.core_connects.inc()
        log.info("http: connected to the core at %s (%s)", self.address, client.server)

    async def _watch(self, client: Client) -> None:
        """Return when ``client`` is closed, or stops answering pings."""
        while not client.closed:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), _PING_INTERVAL)
                continue
            except TimeoutError:
                pass
            if client.closed:
                return
            try:
                await asyncio.wait_for(client.ping(), _CONNECT_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("http: the core at %s does not answer pings: %s", self.address, exc)
                return

    # ---- requests ----------------------------------------------------------------------
    def get(self) -> Client:
        client = self.client
        if client is None or client.closed:
            self._wake.set()
            raise Unavailable(f"not connected to the core at {self.address}: {self.last_error}")
        return client

    async def call(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        """``fn(client)`` against the core, within :data:`CORE_TIMEOUT`."""
        client = self.get()
        return await self._guard(client, asyncio.wait_for(fn(client), CORE_TIMEOUT))

    async def _guard(self, client: Client, aw: Awaitable[T]) -> T:
        try:
            return await aw
        except ConnectionClosed:
            self._wake.set()
            raise
        except RequestError as exc:
            if client.closed and type(exc) is RequestError:  # a Goodbye such as "shutdown"
                self._wake.set()
                raise Unavailable(f"lost the connection to the core: {exc.message}") from exc
            raise

    async def pull(
        self, destination: str, max_: int, wait: float, visibility: float
    ) -> list[Lease]:
        """Pull (long-polling up to ``wait``); an empty list if the service is stopping."""
        client = self.get()
        task = asyncio.ensure_future(
            client.pull(destination, max_, wait=wait, visibility=visibility)
        )
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait(
                {task, stopping}, timeout=wait + CORE_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            if not task.done():  # we gave up: whatever it leases later goes back at once
                task.add_done_callback(lambda t: self._requeue_result(client, t))
        if task in done:
            return await self._guard(client, task)
        if self.stopping.is_set():
            return []
        raise TimeoutError

    def _requeue_result(self, client: Client, task: asyncio.Future[list[Lease]]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        self.requeue(task.result(), client)

    def requeue(self, leases: list[Lease], client: Client | None = None) -> None:
        """Give leases back to their queue (nobody will see them), without waiting."""
        client = client if client is not None else self.client
        if not leases or client is None or client.closed:
            return
        receipts = [lease.receipt for lease in leases]
        log.info(
            "http: requeueing %d message(s) leased for a request that went away", len(receipts)
        )
        task = asyncio.ensure_future(client.settle(receipts, "requeue"))
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("http: requeueing abandoned leases failed: %s", t.exception())

        task.add_done_callback(done)
