"""A frontend's one connection to the core, made again with backoff when it drops.

Every frontend (HTTP, STOMP, ...) shares one :class:`~polymq.client.Client` between all of
its own clients, so that requests issued together travel in one frame. :class:`CoreLink`
owns it: a task connects, watches the connection (the client's heartbeat finds a core that
hangs: :data:`CORE_HEARTBEAT`) and reconnects with jittered exponential backoff; while
there is no connection :meth:`CoreLink.get` and :meth:`CoreLink.call` fail fast with
``Unavailable``.

The link knows every core address it is given (``--core n1:7400,n2:7400``, or a name that
resolves to several, as a headless Service's does) and connects to the first that takes it,
starting after the one it lost (:mod:`polymq.addresses`).

**Failover.** Given several addresses, or a name (not an IP address, nor ``localhost``, nor
the core served in this process), the link's client fails over by itself
(:mod:`polymq.failover`, for :data:`CORE_FAILOVER` seconds): when the node it is connected
to goes, it connects to another, subscribes every subscription again (the frontends'
consumers and subscribers included: their deliveries go on, the unacknowledged ones come
again flagged redelivered, and acks of deliveries made on the lost connection are dropped,
as the core gives those again), and sends again every request still unanswered (publishes
with their batch ids: the core answers one it had taken as a duplicate, never takes it
twice). Meanwhile requests wait; the frontends' clients notice a delay (``failed_over`` is
told, ``on_failover`` too). Only when no address takes it in time is the client closed, and
then, as with one IP address given (a single core: there is nowhere else to go), a lost
connection ends what lived on it (``on_lost``) and the link connects again with backoff;
the frontends' clients reconnect as their protocols let them.

A frontend subclasses it or passes hooks: ``on_connect(client)`` when a connection is made,
``on_lost(client, reason)`` when it is gone (everything that lived on it, subscriptions
included, is gone with it). Publishes may hold a :class:`ByteBudget` (half the core's frame
limit) while they are in flight, so that requests coalesced into one frame can never make a
frame the core would refuse.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from ssl import SSLContext
from typing import Any, Literal, TypeVar

from polymq import inproc
from polymq.addresses import DEFAULT_PORT, is_ip, parse_addresses
from polymq.client import Client, Subscription
from polymq.deliveries import SubscriptionHost
from polymq.errors import ConnectionClosed, RequestError, Unauthorized, Unavailable
from polymq.failover import Reconnected
from polymq.types import Message

from .. import alarms
from ..messages.avro import SchemaCache
from ..names import from_core
from ..reload import TOPIC, Reloader, ReloadError
from .connections import ConnectionTable, Responder, instance_id

__all__ = [
    "CORE_FAILOVER",
    "CORE_HEARTBEAT",
    "CORE_TIMEOUT",
    "ByteBudget",
    "CoreLink",
    "fails_over",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

CORE_TIMEOUT = 30.0  # seconds for the core to answer one request
CORE_FAILOVER = 30.0  # seconds a link given several cores fails over for before it gives up
_CONNECT_TIMEOUT = 5.0
CORE_HEARTBEAT = 5.0  # seconds the core may stay silent after a ping (polymq.heartbeat)
_WATCH_EVERY = 5.0  # seconds between looks whether the client closed (if not woken sooner)
_MIN_DELAY, _MAX_DELAY = 0.1, 5.0
_DEFAULT_MAX_FRAME = 64 * 1024 * 1024
# the fix for a frontend refused the core's system.* topics (reserved: principals.py)
_TAG_IT = 'give this frontend\'s core user the tag "administrator" in the users file'


def fails_over(addresses: Sequence[str]) -> bool:
    """Whether a link given ``addresses`` fails over: several, or one name (which may stand
    for several nodes: a headless Service's), but neither an IP address nor localhost, nor
    the core served in this process (``polymq run``'s frontends stop with it)."""
    if len(addresses) != 1:
        return True
    [only] = parse_addresses(addresses)
    if inproc.served(only.host, only.port):
        return False
    return not is_ip(only.host) and only.host != "localhost"


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
    """The shared client of one frontend (``service`` names it in logs and at the core)."""

    def __init__(
        self,
        host: str | Sequence[str],
        port: int = DEFAULT_PORT,
        *,
        service: str,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        ssl: SSLContext | None = None,
        on_connect: Callable[[Client], None] | None = None,
        on_lost: Callable[[Client, str], None] | None = None,
        on_failover: Callable[[Client, Reconnected], None] | None = None,
        local_buffer: int = 10_000,
        failover: float | Literal["auto"] | None = "auto",
    ) -> None:
        # the core's addresses, "host:port" each (``host``: a list, or one comma-separated
        # string of them; ``port`` for those without); the next connection tries them from
        # the one after the address last connected to
        self.addresses = [str(a) for a in parse_addresses(host, default_port=port)]
        # seconds the client fails over for (None: a loss ends the client; see the docstring)
        if failover == "auto":
            failover = CORE_FAILOVER if fails_over(self.addresses) else None
        self.failover: float | None = failover
        self._next = 0
        self.service = service
        self.user = user
        self.password = password
        self.token = token
        self.ssl = ssl  # TLS to the core (None: plain)
        self.on_connect = on_connect
        self.on_lost = on_lost
        self.on_failover = on_failover
        self.local_buffer = local_buffer
        self.client: Client | None = None
        self.last_error = "not connected yet"
        self.budget = ByteBudget(_DEFAULT_MAX_FRAME // 2)
        self.stopping = asyncio.Event()
        # futures of requests held open (long polls): woken together when the link stops
        self._held: set[asyncio.Future[None]] = set()
        self._wake = asyncio.Event()
        self._first_attempt = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._schemas: SchemaCache | None = None
        self.reloader: Reloader | None = None
        # the resource alarms on: the core's as last heard (polymq_server.alarms) and any
        # this frontend forced (a test switch); ``alarms`` is both, and who to tell
        self.alarms: frozenset[str] = frozenset()
        self._core_alarms: frozenset[str] = frozenset()
        self._forced_alarms: frozenset[str] = frozenset()
        self.alarm_hooks: list[Callable[[frozenset[str]], None]] = []
        # this instance's client connections, listed and closed through the core's admin
        self.connections = ConnectionTable(instance_id(service), service)

    @property
    def schemas(self) -> SchemaCache:
        """Avro schemas by id, read from the core's key/value store when first needed."""
        if self._schemas is None:

            async def fetch(key: str) -> bytes:
                return await self.call(lambda c: c.kv_get(key))

            self._schemas = SchemaCache(fetch)
        return self._schemas

    # ---- life cycle ------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """The core's address connected to, or every address it is given."""
        client = self.client
        if client is not None and client.address is not None:
            return str(client.address)
        return ",".join(self.addresses)

    def _order(self) -> list[str]:
        """The addresses to try, the one after the last connected to first."""
        i = self._next % len(self.addresses)
        return self.addresses[i:] + self.addresses[:i]

    def _passed(self, client: Client) -> None:
        """``client``'s connection is lost: next time, start after its address."""
        where = client.address
        if where is None:
            return
        for i, given in enumerate(parse_addresses(self.addresses)):
            if (given.host, given.port) in ((where.host, where.port), (where.name, where.port)):
                self._next = i + 1
                return

    @property
    def connected(self) -> bool:
        return self.client is not None and not self.client.closed

    async def start(self, first_wait: float = _CONNECT_TIMEOUT + 1) -> None:
        """Start connecting; return after the first attempt (or ``first_wait``) either way."""
        self._task = asyncio.create_task(self._run(), name=f"polymq-{self.service}-corelink")
        try:
            await asyncio.wait_for(self._first_attempt.wait(), first_wait)
        except TimeoutError:
            pass

    def begin_stop(self) -> None:
        """The service is stopping: set :attr:`stopping` and wake every held request."""
        self.stopping.set()
        held, self._held = self._held, set()
        for fut in held:
            if not fut.done():
                fut.set_result(None)

    def hold(self) -> asyncio.Future[None]:
        """A future that :meth:`begin_stop` wakes (done at once if stopping already): a
        waiting request awaits it instead of a task of its own on :attr:`stopping`. The
        holder wakes it too when its request ends, and calls :meth:`release`."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.stopping.is_set():
            fut.set_result(None)
        else:
            self._held.add(fut)
        return fut

    def release(self, fut: asyncio.Future[None]) -> None:
        self._held.discard(fut)

    async def stop(self) -> None:
        self.begin_stop()
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
            self.detached(client, "the frontend is stopping")

    def spawn(self, coro: Coroutine[Any, Any, T], what: str) -> asyncio.Task[T]:
        """A background request nobody waits for; ``stop()`` lets it finish (briefly)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("%s: %s failed: %s", self.service, what, t.exception())

        task.add_done_callback(done)
        return task

    async def _run(self) -> None:
        delay = _MIN_DELAY
        failures = 0
        while True:
            try:
                client = await Client.connect(
                    self._order(),
                    client=self.service,
                    user=self.user,
                    password=self.password,
                    token=self.token,
                    timeout=_CONNECT_TIMEOUT,
                    local_buffer=self.local_buffer,
                    ssl=self.ssl,
                    reconnect_timeout=self.failover,  # (None: this loop reconnects)
                    on_reconnect=self._reconnected,
                    heartbeat=CORE_HEARTBEAT,
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
                    "%s: cannot connect to the core at %s: %s%s; retrying",
                    self.service,
                    self.address,
                    self.last_error,
                    hint,
                )
                self._first_attempt.set()
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, _MAX_DELAY)
                continue
            self.attached(client)
            failures = 0
            delay = _MIN_DELAY
            self._first_attempt.set()
            try:
                await self._watch(client)
            finally:
                if self.client is client:
                    self.client = None
                self._passed(client)
                await client.close()
                reason = client.close_reason
                self.last_error = str(reason) if reason else "connection lost"
                self.detached(client, self.last_error)
            log.warning(
                "%s: lost the connection to the core at %s: %s; reconnecting (to %s)",
                self.service,
                client.address,
                self.last_error,
                ", ".join(self._order()),
            )

    def _reconnected(self, event: Reconnected) -> None:
        client = self.client
        if client is not None:
            self.failed_over(client, event)

    def failed_over(self, client: Client, event: Reconnected) -> None:
        """``client`` failed over (its subscriptions and unanswered requests are made again
        on the new connection): the frontends' sessions go on (subclasses count it)."""
        log.warning(
            "%s: lost the core at %s (%s); failed over to %s in %.2f s",
            self.service,
            event.previous,
            event.reason,
            event.address,
            event.downtime,
        )
        if self.on_failover is not None:
            try:
                self.on_failover(client, event)
            except Exception:  # pragma: no cover - a hook's bug must not stop the link
                log.exception("%s: on_failover hook failed", self.service)

    def attached(self, client: Client) -> None:
        """A connection was made: it becomes the shared client (subclasses check limits)."""
        frame = client.limits.get("max_frame")
        if isinstance(frame, int) and frame > 0:
            self.budget.limit = frame // 2
        self.client = client
        self.last_error = ""
        log.info("%s: connected to the core at %s (%s)", self.service, self.address, client.server)
        if self.on_connect is not None:
            self.on_connect(client)
        if self.reloader is not None:
            self.spawn(self._follow(client, self.reloader), f"subscribing to topic/{TOPIC}")
        self.spawn(self._follow_alarms(client), f"subscribing to topic/{alarms.TOPIC}")
        self.spawn(self._answer_connections(client), "subscribing to topic/system.connections.*")

    async def _answer_connections(self, client: Client) -> None:
        try:
            await Responder(client, self.connections).start()
        except RequestError as exc:
            log.warning(
                "%s: the admin API will not list this instance's connections: %s (%s)",
                self.service,
                exc,
                _TAG_IT,
            )

    async def _follow_alarms(self, client: Client) -> None:
        try:
            await client.subscribe(f"topic/{alarms.TOPIC}", listener=_AlarmListener(self))
        except RequestError as exc:
            log.warning(
                "%s: will not hear the core's resource alarms: topic/%s: %s (%s)",
                self.service,
                alarms.TOPIC,
                exc,
                _TAG_IT,
            )

    def refuse_publish_in_alarm(self) -> None:
        """Unavailable (503 over HTTP) while a resource alarm of the core is on: the HTTP
        family's publishers are held back this way (clients retry after ``Retry-After``)."""
        if self.alarms:
            raise Unavailable(alarms.why(self.alarms))

    def on_alarms(self, now: frozenset[str]) -> None:
        """The core's alarms as announced: tell the hooks when they change."""
        self._core_alarms = now
        self._alarms_changed()

    def force_alarm(self, name: str, on: bool) -> None:
        """Set (``on``) or clear an alarm of this frontend's own (a test switch: publishers
        are held as by the core's alarms)."""
        forced = self._forced_alarms
        self._forced_alarms = forced | {name} if on else forced - {name}
        self._alarms_changed()

    def _alarms_changed(self) -> None:
        now = self._core_alarms | self._forced_alarms
        if now == self.alarms:
            return
        self.alarms = now
        if now:
            log.warning("%s: %s", self.service, alarms.why(now))
        else:
            log.info("%s: the broker's resource alarms cleared: publishers go on", self.service)
        for hook in self.alarm_hooks:
            try:
                hook(now)
            except Exception:  # pragma: no cover - a hook's bug must not stop the others
                log.exception("%s: an alarm hook failed", self.service)

    def follow_config(self, reloader: Reloader) -> None:
        """From each connection on, apply to this frontend (with ``reloader``) every reload
        the core publishes on its topic ``system.config`` (see :mod:`polymq_server.reload`);
        a users reload has this frontend's open connections check their logins again."""
        self.reloader = reloader
        reloader.users_hooks.append(self.connections.recheck)

    async def _follow(self, client: Client, reloader: Reloader) -> None:
        try:
            await client.subscribe(f"topic/{TOPIC}", listener=_ConfigListener(self, reloader))
        except RequestError as exc:  # e.g. Forbidden: the frontend's core user may not read it
            log.warning(
                "%s: will not hear configuration reloads: topic/%s: %s (%s)",
                self.service,
                TOPIC,
                exc,
                _TAG_IT,
            )

    def detached(self, client: Client, reason: str) -> None:
        """The connection is gone, and with it everything that lived on it."""
        if self.on_lost is not None:
            try:
                self.on_lost(client, reason)
            except Exception:  # pragma: no cover - a hook's bug must not stop reconnecting
                log.exception("%s: on_lost hook failed", self.service)

    async def _watch(self, client: Client) -> None:
        """Return when ``client`` is closed: the core closed it, it failed over for longer
        than it may, or its heartbeat found the core hung (with failover it moves on, as
        after a loss; without, it closes)."""
        while not client.closed:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), _WATCH_EVERY)
            except TimeoutError:
                pass

    # ---- requests ----------------------------------------------------------------------
    def get(self) -> Client:
        """The shared client; ``Unavailable`` (at once) while there is none."""
        client = self.client
        if client is None or client.closed:
            self._wake.set()
            raise Unavailable(f"not connected to the core at {self.address}: {self.last_error}")
        return client

    def notice(self, exc: BaseException, client: Client) -> None:
        """A request on ``client`` failed with ``exc``: wake the watcher if the link is gone."""
        if isinstance(exc, ConnectionClosed) or client.closed:
            self._wake.set()

    async def call(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        """``fn(client)`` against the core, within :data:`CORE_TIMEOUT`."""
        client = self.get()
        return await self.guard(client, asyncio.wait_for(fn(client), CORE_TIMEOUT))

    async def guard(self, client: Client | SubscriptionHost, aw: Awaitable[T]) -> T:
        """Await ``aw`` (a request on ``client``, or on the one a subscription holds); a
        Goodbye becomes ``Unavailable``."""
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


class _AlarmListener:
    """Hands the alarms heard on ``topic/system.alarms`` to the link."""

    def __init__(self, link: CoreLink) -> None:
        self.link = link

    def on_deliver(self, sub: Subscription, tags: list[int], messages: list[Message]) -> None:
        for message in messages:
            if not from_core(message.headers):
                log.warning(
                    "%s: ignored an alarms announcement not from the core", self.link.service
                )
                continue
            try:
                self.link.on_alarms(alarms.decode(message.body))
            except ValueError as exc:
                log.error("%s: an unreadable alarms announcement: %s", self.link.service, exc)

    def on_end(self, sub: Subscription, error: BaseException) -> None:
        pass  # the connection is gone: the next one subscribes again


class _ConfigListener:
    """Applies the reloads heard on ``topic/system.config`` as they come."""

    def __init__(self, link: CoreLink, reloader: Reloader) -> None:
        self.link = link
        self.reloader = reloader

    def on_deliver(self, sub: Subscription, tags: list[int], messages: list[Message]) -> None:
        for message in messages:
            if not from_core(message.headers):
                log.warning("%s: ignored a reload not from the core", self.link.service)
                continue
            try:
                change = json.loads(message.body)
                if isinstance(change, dict):
                    self.reloader.apply(change)
            except (ValueError, ReloadError) as exc:  # (ReloadError is a ValueError)
                log.error("%s: configuration reload: %s", self.link.service, exc)

    def on_end(self, sub: Subscription, error: BaseException) -> None:
        pass  # the connection is gone: the next one subscribes again
