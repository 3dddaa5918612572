"""The broker: routes each request of a session to the shard that owns its destination,
or to the topic router, after checking the session's permission.

The broker owns the life cycle (start, a graceful stop), the sessions, authentication, the
one table of routes from request type to its handler and the shard that serves it, and the
object that every handler is given (:class:`~polymq_core.handlers.context.HandlerContext`: the
settings, sensors and auth, the shards and the shard of a key, the bindings, the topic
router, the cursor subscriptions, the topic mesh, the check of a named destination). The
handlers live by concern:

- :class:`~polymq_core.handlers.publisher.PublishHandler`: ``Publish``, topic fanout and
  routing to bound queues, dead letters;
- :class:`~polymq_core.handlers.consumers.ConsumeHandler`: subscriptions and their acks, pulls and
  settles of leases, cursor subscriptions;
- :class:`~polymq_core.handlers.catalog.Catalog`: declare, delete, purge, bindings, metadata, stats,
  peek;
- :class:`~polymq_core.handlers.keyvalue.KeyValue`: the key/value store.

Handlers answer with a plain result (sent as ``Ok``), an ``Event``, or an awaitable (a
persistent publish waits for the store; a pull may wait for messages): see
:mod:`polymq_core.handlers.answers`. Errors are raised as ``RequestError`` and sent as ``Fail`` by
the session. Every durable change goes through ``Shard.commit``. Each request type is
registered once (:class:`~polymq_core.handlers.routes.Route`): with its handler, and how
the shard that serves it is found (:meth:`Broker.shard_key`), which a cluster node's relay
asks to know whether to forward a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from polymq.errors import BadRequest, Unauthorized, Unavailable
from polymq.events import (
    Ack,
    Bind,
    Bindings,
    CursorClose,
    CursorOpen,
    CursorPoll,
    Declare,
    Delete,
    Event,
    Hello,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    MetaGet,
    MetaSet,
    Nack,
    Peek,
    Ping,
    Publish,
    Pull,
    Purge,
    Settle,
    Stats,
    Subscribe,
    Unbind,
    Unsubscribe,
)
from polymq.types import Message
from polymq_server.auth.logins import password_login
from polymq_server.auth.provider import INTERNAL_PRINCIPAL, AuthProvider, Principal
from polymq_server.link.connections import ConnectionTable
from polymq_server.resources import ConnectionLimits

from .alarms import ResourceMonitor
from .destinations.paging import Pressure
from .destinations.queue import Queue
from .destinations.shard import Shard
from .handlers.catalog import Catalog
from .handlers.consumers import ConsumeHandler
from .handlers.context import HandlerContext
from .handlers.cursors import QueueCursor
from .handlers.deadletters import may_dead_letter
from .handlers.keyvalue import KeyValue
from .handlers.publisher import PublishHandler
from .handlers.routes import Route
from .identities import ADMIN_CLIENT, PEER_CLIENT
from .store.contract import Store
from .store.sqlite import SqliteStore

if TYPE_CHECKING:
    from .config import CoreSettings
    from .forwarding.relay import Leaders
    from .handlers.caller import Caller
    from .metrics import Sensors
    from .session import Session

log = logging.getLogger(__name__)

# seconds a login that comes while the core recovers its store waits before it is told to
# come back ("unavailable"): below the wire's handshake timeout
RECOVERY_WAIT = 5.0


class Broker:
    def __init__(
        self,
        settings: CoreSettings,
        sensors: Sensors,
        auth: AuthProvider,
        *,
        stores: Callable[[int], Store] | None = None,
        cluster: Leaders | None = None,
    ) -> None:
        """``stores``: the store of shard *i* (default: its own SQLite file in the data
        dir). ``cluster``: this node's view of the cluster; the stores are then replicated
        logs and each shard is served only while this node leads it (others forward)."""
        self.sensors = sensors
        self.auth = auth
        # (a cluster node by its id: the node a frontend's connections are listed under)
        self.server_name = f"polymq-core/{settings.node}"
        self.cluster = cluster
        if stores is None:
            stores = partial(_sqlite_store, settings)
        self.shards = [
            Shard(self, i, stores(i), sensors, replicated=cluster is not None)
            for i in range(settings.shards)
        ]
        # what the handlers share (the settings are kept there: see the property below)
        self.context = context = HandlerContext(
            settings, sensors, auth, self.shards, cluster.node_id if cluster is not None else None
        )
        self.bindings = context.bindings  # (what a shard asks of its host: ShardHost)
        self.sessions: set[Session] = set()
        # the resource alarms (polymq_server.alarms)
        self.monitor = ResourceMonitor(self, sensors.registry)
        self.connections = ConnectionLimits(
            "the core's wire port", settings.max_connections, settings.max_connections_per_user
        )
        # the wire clients, as the admin API lists them (polymq_server.link.connections)
        self.clients = ConnectionTable(f"core-{settings.node}", "core")
        self.started = time.time()
        self.ready = False
        self.recovered = asyncio.Event()  # set once start() has opened every shard
        self.publisher = publisher = PublishHandler(context)
        consumers = ConsumeHandler(context)
        catalog = Catalog(context)
        kv = KeyValue(context)
        # each request type once: how it is served, and how its shard is found (routes.py)
        self.routes: dict[type[Event], Route[Session]] = {
            Publish: Route(publisher.publish, publisher.publish_key),
            Declare: Route(catalog.declare, catalog.declare_key),
            Delete: Route(catalog.delete, catalog.configure_key),
            Purge: Route(catalog.purge, catalog.configure_key),
            Subscribe: Route(consumers.subscribe, consumers.subscribe_key),
            Unsubscribe: Route(consumers.unsubscribe),
            Ack: Route(consumers.ack),
            Nack: Route(consumers.nack),
            Pull: Route(consumers.pull, consumers.pull_key),
            Settle: Route(consumers.settle, consumers.settle_key),
            Stats: Route(catalog.stats, catalog.read_key),
            Peek: Route(catalog.peek, catalog.peek_key),
            MetaGet: Route(catalog.meta_get, catalog.read_key),
            MetaSet: Route(catalog.meta_set, catalog.configure_key),
            KvGet: Route(kv.get, kv.key_of),
            KvPut: Route(kv.put, kv.key_of),
            KvDelete: Route(kv.delete, kv.key_of),
            KvList: Route(kv.keys),
            Bind: Route(catalog.bind, catalog.bind_key),
            Unbind: Route(catalog.unbind, catalog.bind_key),
            Bindings: Route(catalog.bindings, catalog.bindings_key),
            Ping: Route(lambda s, e: "pong"),
            CursorOpen: Route(consumers.cursor_open, consumers.subscribe_key),
            CursorPoll: Route(consumers.cursor_poll),
            CursorClose: Route(consumers.cursor_close),
        }

    @property
    def settings(self) -> CoreSettings:
        """The core's settings: the handlers' (a reload replaces them, :mod:`.reload`)."""
        return self.context.settings

    @settings.setter
    def settings(self, settings: CoreSettings) -> None:
        self.context.settings = settings

    # ---- life cycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        for shard in self.shards:
            await shard.open()
        if self.cluster is None:  # one node leads every shard (a cluster's follow theirs)
            self.sensors.shards_led.set(len(self.shards))
        self.context.cursors.start()
        self.monitor.start()
        self.ready = True
        self.recovered.set()

    async def stop(
        self,
        grace: float = 10.0,
        *,
        hand_over: Callable[[list[Shard]], Awaitable[None]] | None = None,
    ) -> None:
        """Read no more requests, answer those already read (persistent publishes once
        durable; waiting pulls with what they have), say goodbye, flush the stores.
        ``hand_over`` (a cluster node's): given the shards once every session is closed and
        before they are, to hand on what only memory holds."""
        self.ready = False
        await self.monitor.stop()
        sessions = list(self.sessions)
        for session in sessions:
            session.quiesce()
        for shard in self.shards:
            shard.wake_waiters()
        for cur in self.context.cursors.subs.values():
            if not isinstance(cur, QueueCursor):
                cur.wake()
        answered = [asyncio.ensure_future(s.answered()) for s in sessions]
        if answered:
            _, late = await asyncio.wait(answered, timeout=grace)
            if late:
                log.warning("%d sessions still had unanswered requests at shutdown", len(late))
                for t in late:
                    t.cancel()
        for session in sessions:
            session.close("shutdown", "node shutting down: reconnect (to another node)")
        await self.context.cursors.stop()
        if hand_over is not None:
            try:
                await hand_over(self.shards)
            except Exception:  # (the shards still close: what was not handed is dropped)
                log.exception("handing on the shards' transient messages failed")
        for shard in self.shards:
            await shard.close()

    def publish_topic(self, name: str, msgs: list[Message]) -> int:
        """Publish ``msgs`` to topic ``name`` from within the core (the resource alarms)."""
        return self.publisher.publish_topic(name, msgs)

    def alarms_changed(self) -> None:
        """The monitor set or cleared a resource alarm: native publishers follow."""
        for session in list(self.sessions):
            session.alarm_changed()

    def session_opened(self, session: Session) -> None:
        self.sessions.add(session)

    def logged_in(self, session: Session) -> None:
        """``session`` is logged in: the admin API lists it (not the cluster's own links
        and the admin's: their clients are ``peer`` and ``polymq-admin``)."""
        principal = session.principal
        if session.client == ADMIN_CLIENT and principal is not None:  # what the core says
            session.speaks_for_core = principal.name == INTERNAL_PRINCIPAL
        if session.client in (PEER_CLIENT, ADMIN_CLIENT):
            return
        session.tracked = tracked = self.clients.open(
            "native",
            session.name,
            lambda reason: session.close("closed", reason),
            lambda: {
                "subscriptions": len(session.subs),
                "messages_in": session.messages_in,
                "messages_out": session.messages_out,
            },
        )
        tracked.user = principal.name if principal is not None else None
        tracked.client = session.client

    def session_closed(self, session: Session) -> None:
        if session.tracked is not None:
            self.clients.close(session.tracked)
        if session in self.sessions:
            self.sessions.discard(session)
            session.admission.release()
            if session.principal is not None:
                self.sensors.on_connection(session.protocol, -1)

    async def authenticate(
        self, hello: Hello, auth: AuthProvider | None = None, source: str | None = None
    ) -> Principal:
        """Who ``hello`` logs in as, by ``auth``: the provider of the listener it came in on
        (the peers' TLS listener's takes the cluster secret), else the core's; ``source``:
        the client's address, whose failed password logins are held back (none: an
        in-process link), :mod:`polymq_server.auth.logins`."""
        if not self.ready:
            if self.recovered.is_set():  # it was ready: this is its stop
                raise Unavailable("the core is not ready")
            # bound before recovery (service.py): a client waits a moment, then is told
            try:
                await asyncio.wait_for(self.recovered.wait(), RECOVERY_WAIT)
            except TimeoutError:
                raise Unavailable(
                    "the core is starting (recovering its store): connect again shortly"
                ) from None
            if not self.ready:
                raise Unavailable("the core is not ready")
        auth = self.auth if auth is None else auth
        if hello.token:
            return await auth.authenticate_token(str(hello.token))
        if hello.user:
            user, password = str(hello.user), str(hello.password or "")
            return await password_login(auth, user, password, source)
        try:
            return await auth.anonymous()
        except Unauthorized:
            raise Unauthorized("this core needs credentials: user/password or a token") from None

    # ---- dispatch ------------------------------------------------------------------------
    def handle(self, session: Session, event: Event) -> Any:
        route = self.routes.get(type(event))
        if route is None:
            raise BadRequest(f"{type(event).__name__} is not a request")
        return route.serve(session, event)

    def shard_key(self, session: Caller, event: Event) -> str | None:
        """The key of the shard that serves ``event`` (a relay forwards it to the node that
        leads that shard), parsed and authorized as it would be served; None: it is served
        by whichever node has it."""
        route = self.routes.get(type(event))
        if route is None or route.shard_key is None:
            return None
        return route.shard_key(session, event)

    # ---- what a shard asks of the broker (shard.ShardHost) -------------------------------
    def shard_for(self, key: str) -> Shard:
        """(The handlers' :meth:`HandlerContext.shard_for`: what a shard, the relay and the
        cluster node ask.)"""
        return self.context.shard_for(key)

    @property
    def pressure(self) -> Pressure:
        return self.monitor.pressure

    def restore_cursors(self, shard: Shard, records: list[tuple[str, str, bytes]]) -> None:
        self.context.cursors.restore(shard, records)

    def drop_cursors(self, shard: Shard) -> None:
        self.context.cursors.drop(shard)

    def dead_letter(
        self, msg: Message, target: str, reason: str, source: str, by: str | None
    ) -> asyncio.Future[None] | None:
        """``msg`` left queue ``source`` for ``reason``: to ``target`` if ``by``, who declared
        the queue, still may write there (:mod:`polymq_core.handlers.deadletters`); the future
        of its dead letter's write (None: nothing to wait for, or dropped)."""
        if may_dead_letter(self.auth, by, target, source):
            return self.publisher.dead_letter(msg, target, reason, source)
        return None

    # ---- introspection (the admin pages and the sensors) -----------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "server": self.server_name,
            "uptime_seconds": round(time.time() - self.started, 3),
            "connections": sum(1 for s in self.sessions if s.client != ADMIN_CLIENT),
            "topic_subscriptions": len(self.context.topics),
            "bindings": len(self.bindings),
            "shards": [s.describe() for s in self.shards],
        }

    def depth(self, kind: str) -> int:
        """Ready messages over the in-memory destinations of one kind."""
        prefix = kind + "/"
        return sum(
            holder.count if isinstance(holder, Queue) else len(holder.entries)
            for shard in self.shards
            for key, holder in shard.holders.items()
            if key.startswith(prefix)
        )

    def in_flight(self) -> int:
        return sum(
            len(holder.inflight)
            for shard in self.shards
            for holder in shard.holders.values()
            if isinstance(holder, Queue)
        )

    def destinations(self, limit: int = 1000) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for shard in self.shards:
            for holder in shard.holders.values():
                out.append(holder.stats())
                if len(out) >= limit:
                    return out
        return out


def _sqlite_store(settings: CoreSettings, index: int) -> Store:
    """Shard *index*'s store on a single node: its own SQLite file in the data dir."""
    return SqliteStore(settings.data_dir / f"shard-{index:03d}.db")
