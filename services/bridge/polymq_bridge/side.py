"""The bridge's two connections, RabbitMQ and the polymq core, each made again when it drops.

A :class:`Side` owns one task that connects, watches the connection and, when it is gone,
reconnects after a capped, jittered exponential backoff (:class:`Backoff`). Each connection
is handed out as an :class:`Attachment`: the connection and a ``lost`` future that resolves
(with the reason) when it is gone, so that a link can run "until either side is lost" with one
``asyncio.wait``. A link that finds a connection broken first (a failed request) says so with
:meth:`Side.report_lost`, which makes the side reconnect at once instead of at its next check.

Both sides use the same policy, so the bridge's reconnect metrics read alike:
``polymq_bridge_connected{side}``, ``polymq_bridge_connects_total``,
``polymq_bridge_reconnects_total`` and ``polymq_bridge_connect_failures_total``.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aio_pika
from aio_pika.abc import AbstractConnection
from yarl import URL

from polymq import Client
from polymq.errors import Unauthorized
from polymq.tasks import check_cancelled

from .metrics import BridgeMetrics

__all__ = [
    "Attachment",
    "Backoff",
    "CoreSide",
    "RabbitSide",
    "Side",
    "Stopping",
]

log = logging.getLogger(__name__)

C = TypeVar("C")


_CONNECT_TIMEOUT = 5.0
_CORE_CHECK = 0.25  # seconds between looks at the core client's closed flag
_CORE_PING = 5.0  # seconds between pings (a core that hangs without closing)
_STABLE = 10.0  # a connection that lived this long resets the backoff


class _QuietReconnects(logging.Filter):
    """aiormq logs every failed connection attempt and every close by the broker at ERROR,
    with a traceback; the bridge reports the same once, in its own words (and everything
    at DEBUG). Installed on aiormq's connection logger by :class:`RabbitSide`."""

    _NOISE = ("error when creating transport", "Unexpected connection close from remote")
    _CLOSED = "Cancelling cause reader exited abnormally"  # noise when the cause is a close

    def filter(self, record: logging.LogRecord) -> bool:
        if log.isEnabledFor(logging.DEBUG):
            return True
        msg = str(record.msg)
        if msg.startswith(self._CLOSED):
            exc = record.exc_info[1] if record.exc_info else None
            return not isinstance(exc, ConnectionError)  # aiormq's ConnectionClosed is one
        return not msg.startswith(self._NOISE)


_QUIET = _QuietReconnects()


class Stopping(Exception):
    """The bridge is stopping: there will be no connection to wait for."""


class Backoff:
    """Delays that double from ``low`` up to ``high``, each drawn from [d/2, d] (jitter)."""

    def __init__(
        self,
        low: float,
        high: float,
        rand: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.low = low
        self.high = high
        self.rand = rand
        self.current = low

    def next(self) -> float:
        d = self.current
        self.current = min(d * 2, self.high)
        return self.rand(d / 2, d)

    def reset(self) -> None:
        self.current = self.low


@dataclass(eq=False)
class Attachment(Generic[C]):
    """One connection, and a future that resolves with the reason when it is gone."""

    conn: C
    lost: asyncio.Future[str]
    number: int  # 1 for the first connection, 2 for the first reconnect, ...
    since: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return not self.lost.done()


class Side(abc.ABC, Generic[C]):
    """One side's connection, made again with backoff until :meth:`stop`."""

    side: str = ""

    def __init__(self, address: str, backoff: Backoff, metrics: BridgeMetrics) -> None:
        self.address = address
        self.backoff = backoff
        self.metrics = metrics
        self.current: Attachment[C] | None = None
        self.last_error = "not connected yet"
        self.stopping = False
        self._connections = 0
        self._changed = asyncio.Event()
        self._first_attempt = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- what the links use ---------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.current is not None and self.current.alive

    async def wait(self) -> Attachment[C]:
        """The current connection, waiting for one if there is none; :class:`Stopping`."""
        while True:
            if self.stopping:
                raise Stopping(f"the bridge is stopping ({self.side})")
            att = self.current
            if att is not None and att.alive:
                return att
            self._changed.clear()
            await self._changed.wait()

    def report_lost(self, att: Attachment[C], reason: str) -> None:
        """A user of ``att`` found it broken: reconnect now."""
        if not att.lost.done():
            att.lost.set_result(reason)

    # ---- life cycle -----------------------------------------------------------------------
    async def start(self, first_wait: float = _CONNECT_TIMEOUT + 1) -> None:
        """Start connecting; return after the first attempt (or ``first_wait``) either way."""
        self._task = asyncio.create_task(self._run(), name=f"polymq-bridge-{self.side}")
        try:
            await asyncio.wait_for(self._first_attempt.wait(), first_wait)
        except TimeoutError:
            pass

    async def stop(self) -> None:
        self.stopping = True
        self._changed.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        att, self.current = self.current, None
        if att is not None:
            if not att.lost.done():
                att.lost.set_result("the bridge is stopping")
            await self._close_quietly(att.conn)
        self.metrics.connected.labels(self.side).set(0)

    async def _run(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            check_cancelled()
            try:
                conn = await self._connect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.last_error = str(exc) or type(exc).__name__
                self.metrics.connect_failures.labels(self.side).inc()
                level = logging.WARNING if failures == 1 or failures % 30 == 0 else logging.DEBUG
                log.log(
                    level,
                    "bridge: cannot connect to %s at %s: %s%s; retrying",
                    self.side,
                    self.address,
                    self.last_error,
                    self._hint(exc),
                )
                self._first_attempt.set()
                await asyncio.sleep(self.backoff.next())
                continue
            failures = 0
            self._connections += 1
            att: Attachment[C] = Attachment(conn, loop.create_future(), self._connections)
            self.current = att
            self.last_error = ""
            self.metrics.connected.labels(self.side).set(1)
            self.metrics.connects.labels(self.side).inc()
            if att.number > 1:
                self.metrics.reconnects.labels(self.side).inc()
            log.info(
                "bridge: connected to %s at %s%s",
                self.side,
                self.address,
                f" (reconnect {att.number - 1})" if att.number > 1 else "",
            )
            self._first_attempt.set()
            self._changed.set()
            try:
                await self._watch(att)
            finally:
                if self.current is att:
                    self.current = None
                self.metrics.connected.labels(self.side).set(0)
                if not att.lost.done():
                    att.lost.set_result("connection closed")
                await self._close_quietly(conn)
            self.last_error = att.lost.result()
            if time.monotonic() - att.since >= _STABLE:
                self.backoff.reset()
            log.warning(
                "bridge: lost the connection to %s at %s: %s; reconnecting",
                self.side,
                self.address,
                self.last_error,
            )
            await asyncio.sleep(self.backoff.next())

    async def _close_quietly(self, conn: C) -> None:
        try:
            await asyncio.wait_for(self._close(conn), _CONNECT_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # closing what is already broken
            log.debug("bridge: closing the %s connection: %s", self.side, exc)

    def _hint(self, exc: BaseException) -> str:
        return ""

    @abc.abstractmethod
    async def _connect(self) -> C: ...

    @abc.abstractmethod
    async def _watch(self, att: Attachment[C]) -> None:
        """Return when the connection is gone (having resolved ``att.lost`` if it can)."""

    @abc.abstractmethod
    async def _close(self, conn: C) -> None: ...


class RabbitSide(Side[AbstractConnection]):
    side = "rabbitmq"

    def __init__(
        self,
        url: str,
        address: str,
        backoff: Backoff,
        metrics: BridgeMetrics,
        *,
        heartbeat: int = 10,
    ) -> None:
        super().__init__(address, backoff, metrics)
        logging.getLogger("aiormq.connection").addFilter(_QUIET)  # once: a set of filters
        u = URL(url)
        if "heartbeat" not in u.query:
            u = u.update_query(heartbeat=heartbeat)
        self._url = u

    async def _connect(self) -> AbstractConnection:
        return await aio_pika.connect(
            self._url,
            timeout=_CONNECT_TIMEOUT,
            client_properties={"connection_name": "polymq-bridge"},
        )

    async def _watch(self, att: Attachment[AbstractConnection]) -> None:
        def closed(sender: Any, exc: BaseException | None = None) -> None:
            if not att.lost.done():
                att.lost.set_result(str(exc) if exc else "connection closed")

        att.conn.close_callbacks.add(closed)
        if att.conn.is_closed:
            closed(None, None)
        await asyncio.shield(att.lost)

    async def _close(self, conn: AbstractConnection) -> None:
        if not conn.is_closed:
            await conn.close()

    def _hint(self, exc: BaseException) -> str:
        if "ACCESS_REFUSED" in str(exc) or "403" in str(exc):
            return " (check the user and password in POLYMQ_BRIDGE_RABBITMQ_URL)"
        return ""


class CoreSide(Side[Client]):
    side = "core"

    def __init__(
        self,
        host: str,
        port: int,
        backoff: Backoff,
        metrics: BridgeMetrics,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
    ) -> None:
        # (host: one, or several "HOST:PORT" comma-separated: see polymq_server.config)
        super().__init__(host if "," in host else f"{host}:{port}", backoff, metrics)
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.token = token

    async def _connect(self) -> Client:
        return await Client.connect(
            self.host,
            self.port,
            client="bridge",
            user=self.user,
            password=self.password,
            token=self.token,
            timeout=_CONNECT_TIMEOUT,
        )

    async def _watch(self, att: Attachment[Client]) -> None:
        client = att.conn
        next_ping = time.monotonic() + _CORE_PING
        while not att.lost.done():
            check_cancelled()
            if client.closed:
                reason = client.close_reason
                att.lost.set_result(str(reason) if reason else "connection closed")
                return
            if time.monotonic() >= next_ping:
                try:
                    await asyncio.wait_for(client.ping(), _CONNECT_TIMEOUT)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not att.lost.done():
                        att.lost.set_result(f"the core does not answer pings: {exc}")
                    return
                next_ping = time.monotonic() + _CORE_PING
            try:
                await asyncio.wait_for(asyncio.shield(att.lost), _CORE_CHECK)
            except TimeoutError:
                pass

    async def _close(self, conn: Client) -> None:
        await conn.close()

    def _hint(self, exc: BaseException) -> str:
        if isinstance(exc, Unauthorized):
            return " (set POLYMQ_CORE_USER and POLYMQ_CORE_PASSWORD for the bridge)"
        return ""
