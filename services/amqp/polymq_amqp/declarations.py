"""exchange.declare / delete and queue.declare / bind / unbind / purge / delete.

Each runs as the session's busy task (it needs the core before it is answered). The
records are kept by :class:`~polymq_amqp.topology.Topology`; the rules are RabbitMQ's:

- ``amq.``-prefixed names are reserved (403) but the predeclared ``amq.direct``,
  ``amq.fanout``, ``amq.topic``, ``amq.headers`` and ``amq.match`` exist in every vhost; the
  default exchange ``""`` can be neither declared, bound nor deleted (403);
- a passive declaration of something absent is 404; a redeclaration with other attributes
  or arguments is 406 (``inequivalent arg 'durable' for queue 'q' in vhost '/': ...``);
  an unknown exchange type is a connection error 503;
- an exclusive queue belongs to its connection (405 RESOURCE_LOCKED for any other) and is
  deleted when it closes; an empty queue name declares a server-named ``amq.gen-...`` queue,
  and an empty name elsewhere means the channel's last declared queue;
- deleting something absent is not an error (RabbitMQ's behaviour since 3.x); ``if_unused``
  and ``if_empty`` refuse with 406.

Permissions are RabbitMQ's (its access-control table), with two differences that hold a user
to exactly their grants:

- a queue.declare with ``x-dead-letter-exchange`` needs WRITE on where its dead letters go,
  as a basic.publish there would (RabbitMQ: write on the DLX): the core destination
  ``arguments.py`` maps it to, ``topic/amqp.<DLX>.<key>`` or, for the default exchange,
  ``queue/<key>``; refused with 403 ACCESS_REFUSED. The core sends each dead letter later
  only while the declaring user may still write there (``polymq_server.auth.deadletter``);
- a passive queue.declare needs READ on the queue: its answer holds the message and
  consumer counts, which only READ shows (the core's stats need it too). RabbitMQ checks no
  permission for it; here it is 403 ACCESS_REFUSED, given before the queue is looked up, so
  that a refusal does not tell whether it exists; and a queue.declare-ok to a user without
  READ there counts 0 messages and 0 consumers. (A passive exchange.declare tells only that
  the exchange exists, and needs nothing, as in RabbitMQ.)
"""

from __future__ import annotations

import secrets
from typing import Any, Final, Protocol

from pamqp import commands, constants

from polymq_server.auth.deadletter import for_user
from polymq_server.auth.provider import Permission
from polymq_server.exchanges.kinds import BUILTIN, ExchangeType, valid_match_mode
from polymq_server.exchanges.records import ExchangeBinding
from polymq_server.names import UnmappableName

from . import replyto
from .arguments import queue_options
from .errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    ChannelException,
    ConnectionException,
)
from .parts import PartHost
from .topology import ExchangeRecord, QueueRecord, tagged_args
from .wire.tables import to_text

__all__ = ["Declarations", "DeclarationsHost"]

_NAME_RE: Final = constants.DOMAIN_REGEX["queue-name"]


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return to_text(v)


class DeclarationsHost(PartHost, Protocol):
    """What a channel's declarations ask of it: a part's view (``parts.py``), and the queue
    "" stands for. A protocol, so that this module need not import ``channel.py``, which
    imports it."""

    last_queue: str | None

    def resolve_queue(self, name: str) -> str: ...


class Declarations:
    def __init__(self, channel: DeclarationsHost) -> None:
        self.channel = channel
        self.session = channel.session
        self.names = channel.names
        self.topology = channel.session.topology

    # ---- helpers ---------------------------------------------------------------------------
    @property
    def vhost(self) -> str:
        return self.names.vhost

    def _no_queue(self, queue: str) -> ChannelException:
        return ChannelException(NOT_FOUND, f"no queue '{queue}' in vhost '{self.vhost}'")

    def _no_exchange(self, exchange: str) -> ChannelException:
        return ChannelException(NOT_FOUND, f"no exchange '{exchange}' in vhost '{self.vhost}'")

    def _locked(self, queue: str) -> ChannelException:
        return ChannelException(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{queue}' in vhost "
            f"'{self.vhost}'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.",
        )

    def _check_name(self, name: str, what: str) -> None:
        if len(name.encode("utf-8")) > (127 if what == "exchange" else 255) or not (
            _NAME_RE.fullmatch(name)
        ):
            raise ChannelException(
                PRECONDITION_FAILED,
                f"invalid {what} name {name[:80]!r}: use letters, digits and - _ . : @ # , / + "
                "and space",
            )

    def _core_queue(self, name: str) -> str:
        try:
            return self.names.queue(name)
        except UnmappableName as exc:
            raise ChannelException(PRECONDITION_FAILED, str(exc)) from None

    async def existing_queue(self, queue: str, *, exclusive_use: bool) -> QueueRecord | None:
        """The record of a queue that must exist (404); None when only the core has it
        (a queue made by another protocol). ``exclusive_use``: 405 if another connection
        owns it."""
        rec = await self.topology.queue(self.names, queue)
        if rec is None:
            if await self.topology.core_has(self._core_queue(queue)) is None:
                raise self._no_queue(queue)
            return None
        if exclusive_use and rec.exclusive and rec.owner != self.session.owner:
            raise self._locked(queue)
        return rec

    async def _counts(self, core: str) -> tuple[int, int]:
        stats = await self.topology.core_has(core)
        return (0, 0) if stats is None else (stats.messages, stats.subscribers)

    def _reply(self, method: Any, answer: Any) -> None:
        if not getattr(method, "nowait", False):
            self.session.send_method(self.channel.number, answer)

    # ---- exchanges ---------------------------------------------------------------------
    async def exchange_declare(self, m: commands.Exchange.Declare) -> None:
        name = m.exchange or ""
        kind = m.exchange_type or ""  # ("" is no type: refused below, as RabbitMQ does)
        if not name:
            if m.passive:
                self._reply(m, commands.Exchange.DeclareOk())
                return
            raise ChannelException(
                ACCESS_REFUSED, "operation not permitted on the default exchange"
            )
        self._check_name(name, "exchange")
        self.session.authorize(Permission.CONFIGURE, "topic/" + self.names.exchange_base(name))
        existing = await self.topology.exchange(self.names, name)
        if m.passive:
            if existing is None:
                raise self._no_exchange(name)
            self._reply(m, commands.Exchange.DeclareOk())
            return
        try:
            ExchangeType(kind)
        except ValueError:
            raise ConnectionException(COMMAND_INVALID, f"invalid exchange type '{kind}'") from None
        args = tagged_args(m.arguments)
        if existing is not None:
            for attr, got, have in (
                ("type", kind, existing.type),
                ("durable", bool(m.durable), existing.durable),
                ("auto_delete", bool(m.auto_delete), existing.auto_delete),
                ("internal", bool(m.internal), existing.internal),
            ):
                if got != have:
                    raise ChannelException(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{attr}' for exchange '{name}' in vhost "
                        f"'{self.vhost}': received '{_text(got)}' but current is "
                        f"'{_text(have)}'",
                    )
            if args != existing.arguments:
                raise ChannelException(
                    PRECONDITION_FAILED,
                    f"inequivalent arguments for exchange '{name}' in vhost '{self.vhost}'",
                )
        else:
            if name.startswith("amq."):
                raise ChannelException(
                    ACCESS_REFUSED,
                    f"exchange name '{name}' contains reserved prefix 'amq.*'",
                )
            rec = ExchangeRecord(
                name, kind, bool(m.durable), bool(m.auto_delete), bool(m.internal), args
            )
            await self.topology.put_exchange(self.names, rec)
        self._reply(m, commands.Exchange.DeclareOk())

    async def exchange_delete(self, m: commands.Exchange.Delete) -> None:
        name = m.exchange or ""
        if not name or name in BUILTIN:
            raise ChannelException(
                ACCESS_REFUSED, f"operation not permitted on exchange '{name or 'amq.default'}'"
            )
        self._check_name(name, "exchange")
        self.session.authorize(Permission.CONFIGURE, "topic/" + self.names.exchange_base(name))
        rec = await self.topology.exchange(self.names, name)
        if rec is not None:
            if m.if_unused and (
                await self.topology.exchange_bindings(self.names, name)
                or await self.topology.bindings_from(self.names, name)
            ):
                raise ChannelException(
                    PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.vhost}' in use"
                )
            await self.topology.delete_exchange(self.names, name)
        self._reply(m, commands.Exchange.DeleteOk())

    async def _exchange_binding(
        self, m: commands.Exchange.Bind | commands.Exchange.Unbind
    ) -> ExchangeBinding:
        """The binding an exchange.bind or exchange.unbind names (both ends must exist)."""
        source, destination = m.source or "", m.destination or ""
        if not source or not destination:
            raise ChannelException(
                ACCESS_REFUSED, "operation not permitted on the default exchange"
            )
        for name in (destination, source):
            self._check_name(name, "exchange")
            if await self.topology.exchange(self.names, name) is None:
                raise self._no_exchange(name)
        self.session.authorize(Permission.WRITE, "topic/" + self.names.exchange_base(destination))
        self.session.authorize(Permission.READ, "topic/" + self.names.exchange_base(source))
        args = dict(m.arguments or {})
        return ExchangeBinding(source, destination, m.routing_key or "", tagged_args(args))

    async def exchange_bind(self, m: commands.Exchange.Bind) -> None:
        binding = await self._exchange_binding(m)
        present = await self.topology.bindings_from(self.names, binding.source)
        if binding not in present:
            await self.topology.add_exchange_binding(self.names, binding)
        self._reply(m, commands.Exchange.BindOk())

    async def exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        binding = await self._exchange_binding(m)
        if binding in await self.topology.bindings_from(self.names, binding.source):
            await self.topology.remove_exchange_binding(self.names, binding)
            await self.topology.auto_delete(self.names, binding.source)  # as RabbitMQ
        self._reply(m, commands.Exchange.UnbindOk())

    # ---- queues --------------------------------------------------------------------------
    async def queue_declare(self, m: commands.Queue.Declare) -> None:
        session = self.session
        ch = self.channel
        topology = self.topology
        name = m.queue or ""
        if m.passive and (name == replyto.PSEUDO_QUEUE or name == ch.reply_to):
            self._reply(m, commands.Queue.DeclareOk(name, 0, 0))  # as RabbitMQ
            return
        if not name:
            name = "amq.gen-" + secrets.token_urlsafe(16)
        elif name.startswith("amq.") and not m.passive:
            raise ChannelException(
                ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'"
            )
        self._check_name(name, "queue")
        core = self._core_queue(name)
        if m.passive:
            session.authorize(Permission.READ, core)  # the counts are READ's (see above)
            await self.existing_queue(name, exclusive_use=True)
            messages, consumers = await self._counts(core)
            ch.last_queue = name
            self._reply(m, commands.Queue.DeclareOk(name, messages, consumers))
            return
        session.authorize(Permission.CONFIGURE, core)
        durable, exclusive, auto_delete = bool(m.durable), bool(m.exclusive), bool(m.auto_delete)
        args = dict(m.arguments or {})
        options = queue_options(
            args,
            self.names,
            name,
            durable=durable,
            exclusive=exclusive,
            exclusive_ttl=ch.settings.amqp_exclusive_ttl,
        )
        assert session.principal is not None  # (logged in before any channel opens)
        options = for_user(options, session.principal, session.authorize)
        tagged = tagged_args(args)
        rec = await topology.queue(self.names, name)
        if rec is not None:
            if rec.exclusive and rec.owner != session.owner:
                raise self._locked(name)
            self._equivalent(rec, durable, exclusive, auto_delete, tagged)
            if await topology.core_has(rec.core) is None:  # e.g. lost with a core restart
                await session.link.call(lambda c: c.declare(core, **options))
        else:
            await session.link.call(lambda c: c.declare(core, **options))
            rec = QueueRecord(
                name,
                core,
                durable,
                exclusive,
                auto_delete,
                tagged,
                session.owner if exclusive else None,
                expires="idle_ttl" in options,
            )
            await topology.put_queue(self.names, rec)
            if exclusive:
                session.exclusive_queues.add(name)
        messages, consumers = await self._counts(core) if self._may_read(core) else (0, 0)
        ch.last_queue = name
        self._reply(m, commands.Queue.DeclareOk(name, messages, consumers))

    def _may_read(self, core: str) -> bool:
        try:
            self.session.authorize(Permission.READ, core)
        except ChannelException:
            return False
        return True

    def _equivalent(
        self,
        rec: QueueRecord,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        tagged: dict[str, Any],
    ) -> None:
        for attr, got, have in (
            ("durable", durable, rec.durable),
            ("exclusive", exclusive, rec.exclusive),
            ("auto_delete", auto_delete, rec.auto_delete),
        ):
            if got != have:
                raise ChannelException(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{attr}' for queue '{rec.name}' in vhost '{self.vhost}': "
                    f"received '{_text(got)}' but current is '{_text(have)}'",
                )
        for key in sorted(set(tagged) | set(rec.arguments)):
            if tagged.get(key) != rec.arguments.get(key):
                got_v, have_v = tagged.get(key), rec.arguments.get(key)
                raise ChannelException(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{key}' for queue '{rec.name}' in vhost '{self.vhost}': "
                    f"received {_shown(got_v)} but current is {_shown(have_v)}",
                )

    async def _binding_ends(
        self, queue: str, exchange: str
    ) -> tuple[QueueRecord | None, str, ExchangeRecord]:
        if not exchange:
            raise ChannelException(
                ACCESS_REFUSED, "operation not permitted on the default exchange"
            )
        rec = await self.existing_queue(queue, exclusive_use=True)
        core = rec.core if rec is not None else self._core_queue(queue)
        ex = await self.topology.exchange(self.names, exchange)
        if ex is None:
            raise self._no_exchange(exchange)
        self.session.authorize(Permission.CONFIGURE, core)
        self.session.authorize(Permission.READ, "topic/" + self.names.exchange_base(exchange))
        return rec, core, ex

    async def queue_bind(self, m: commands.Queue.Bind) -> None:
        queue = self.channel.resolve_queue(m.queue or "")
        routing_key = m.routing_key or ""
        if not m.queue and not routing_key:
            routing_key = queue  # the spec: an empty key with an empty queue is the queue's
        args = dict(m.arguments or {})
        _rec, core, ex = await self._binding_ends(queue, m.exchange or "")
        if ex.kind is ExchangeType.HEADERS and not valid_match_mode(args):
            raise ChannelException(
                PRECONDITION_FAILED,
                f"invalid x-match {args.get('x-match')!r}: expected all, any, all-with-x or "
                "any-with-x",
            )
        try:
            binding = self.topology.make_binding(self.names, ex, queue, routing_key, args)
        except UnmappableName as exc:
            raise ChannelException(PRECONDITION_FAILED, str(exc)) from None
        if binding.pattern is not None:  # what the queue will hear: read as a subscription
            self.session.authorize(Permission.READ, binding.pattern)
        present = await self.topology.queue_bindings(self.names, queue)
        if not any(b.exchange == ex.name and b.digest == binding.digest for b in present):
            await self.topology.add_binding(self.names, core, binding)
        self._reply(m, commands.Queue.BindOk())

    async def queue_unbind(self, m: commands.Queue.Unbind) -> None:
        queue = self.channel.resolve_queue(m.queue or "")
        exchange = m.exchange or ""
        routing_key = m.routing_key or ""
        args = dict(m.arguments or {})
        _rec, _core, ex = await self._binding_ends(queue, exchange)
        try:
            wanted = self.topology.make_binding(self.names, ex, queue, routing_key, args)
        except UnmappableName:
            wanted = None
        if wanted is not None:
            for b in await self.topology.queue_bindings(self.names, queue):
                if b.exchange == ex.name and b.digest == wanted.digest:
                    await self.topology.remove_binding(self.names, b)
                    break
        self.session.send_method(self.channel.number, commands.Queue.UnbindOk())

    async def queue_purge(self, m: commands.Queue.Purge) -> None:
        queue = self.channel.resolve_queue(m.queue or "")
        rec = await self.existing_queue(queue, exclusive_use=True)
        core = rec.core if rec is not None else self._core_queue(queue)
        self.session.authorize(Permission.CONFIGURE, core)
        try:
            count = await self.session.link.call(lambda c: c.purge(core))
        except Exception as exc:
            from polymq.errors import NotFound

            if not isinstance(exc, NotFound):
                raise
            count = 0  # an idle queue the core forgot: nothing in it
        self._reply(m, commands.Queue.PurgeOk(message_count=count))

    async def queue_delete(self, m: commands.Queue.Delete) -> None:
        session = self.session
        queue = self.channel.resolve_queue(m.queue or "")
        topology = self.topology
        rec = await topology.queue(self.names, queue)
        core = rec.core if rec is not None else self._core_queue(queue)
        if rec is not None and rec.exclusive and rec.owner != session.owner:
            raise self._locked(queue)
        session.authorize(Permission.CONFIGURE, core)
        stats = await topology.core_has(core)
        if rec is None and stats is None:
            self._reply(m, commands.Queue.DeleteOk(message_count=0))
            return
        messages = 0 if stats is None else stats.messages
        if m.if_unused and stats is not None and stats.subscribers:
            raise ChannelException(
                PRECONDITION_FAILED, f"queue '{queue}' in vhost '{self.vhost}' in use"
            )
        if m.if_empty and messages:
            raise ChannelException(
                PRECONDITION_FAILED, f"queue '{queue}' in vhost '{self.vhost}' is not empty"
            )
        if rec is None:
            rec = QueueRecord(queue, core, True, False, False, {})
        await topology.delete_queue(self.names, rec)
        session.exclusive_queues.discard(queue)
        self._reply(m, commands.Queue.DeleteOk(message_count=messages))


def _shown(tagged: Any) -> str:
    if tagged is None:
        return "none"
    kind = {"S": "longstr", "i": "long", "t": "bool", "d": "double"}.get(tagged[0], "value")
    value = tagged[1] if len(tagged) > 1 else ""
    return f"the value '{value}' of type '{kind}'"
