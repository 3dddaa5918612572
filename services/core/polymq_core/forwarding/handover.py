"""A leaving node hands what only its memory holds to the shards' next leaders
(docs/cluster.md, "Stopping a node").

A new leader loads from the shard's log what the log has: persistent messages of durable
queues, destinations and their options (those of non-durable queues too), bindings. What
only the leader's memory holds would go with it: **transient messages** (and every message
of a non-durable queue), ready or delivered and not yet acknowledged. (The **non-durable
queues** are declared and bound again before their messages go: the log has them, so that
changes nothing there, and a receiver of an older version needs it.) On a graceful stop,
once the broker has answered its sessions and before it closes its shards,
:class:`HandOver` takes each shard this node leads that holds such things:

1. waits until the shard's writes are in the log (the last acks' removals: a message acked
   here must not come back there), takes the contents out of memory (:func:`take`) and
   lets the shard go (``Shard.demote``);
2. steps down the shard's stream (JetStream picks another replica) and waits until another
   node leads it;
3. sends the contents to that node over the core wire protocol, logged in as a peer with
   the cluster secret (:func:`handover_client`; with cluster TLS on its ``peer_wire``
   listener): each non-durable queue declared with its options and bound as it was, then
   the messages as ordinary publishes, queue by queue in delivery order (priority, then
   sequence), one request answered before the next goes. Persistent messages of durable
   queues are not sent: the log has them, and sending them again would duplicate them.

The receiving node keeps each handed message's id, time and delivery count
(``Shard.publish(handed=True)``), so one delivered here and not acknowledged is delivered
there flagged ``redelivered``, as a failover returns a persistent one. A republish cannot
put a transient message of a durable queue back between the persistent ones the new leader
loads from the log: it goes after them (its priority still counts).

All of it within :data:`HAND_OVER_FOR` seconds. What was handed, and what could not be
(no other node took the shard in time, the receiver refused it, the time ran out), is
logged with counts: what could not be handed is dropped, as today, and as a crash
(``kill -9``) drops every transient message the node held (RabbitMQ's do the same).
Transient entries of streams are not handed over (a republish would renumber them): they
are counted as dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from polymq.client import Client
from polymq.errors import ConnectionClosed, PolymqError, RequestError
from polymq.types import MAX_PRIORITY, ChannelRole, Message
from polymq_server.auth.provider import INTERNAL_PRINCIPAL

from ..destinations.queue import Queue
from ..destinations.stream import Stream

if TYPE_CHECKING:
    from ..destinations.shard import Shard

log = logging.getLogger(__name__)

HAND_OVER_FOR = 20.0  # seconds the whole hand-over may take (the core's stop has 60)
_WRITTEN_WITHIN = 3.0  # seconds a shard's last writes may take to reach the log
_STEP_DOWN_EVERY = 2.0  # seconds between step-downs while this node still leads the stream
_LOOK_EVERY = 0.1  # seconds between looks at who leads the stream
_RETRY = 0.05  # seconds before a request the receiver did not do (not leading yet) again
_CONNECT_WITHIN = 5.0
_BATCH_BYTES = 512 * 1024  # message bytes per publish, roughly (far below max_frame)
_BATCH_COUNT = 1000
_AGAIN = frozenset({"not-leader", "unavailable"})  # not done there: send it again
_MARK = "handover"


def handover_client(node_id: str) -> str:
    """The ``Hello.client`` of node ``node_id``'s hand-over links: a peer's (its requests
    are never forwarded again), marked as a hand-over."""
    return f"peer/{node_id}/{_MARK}"


def is_handover(client: str, principal: str) -> bool:
    """Is a session that said ``client`` and logged in as ``principal`` a leaving node's
    hand-over link (whose publishes keep their ids and delivery counts)? Only a login with
    the cluster secret (or polymq's own service token) is."""
    word, _, rest = client.partition("/")
    return principal == INTERNAL_PRINCIPAL and word == "peer" and rest.endswith("/" + _MARK)


# ---- what to hand over, in what order (pure) --------------------------------------------------
@dataclasses.dataclass(frozen=True)
class QueueContents:
    """What only memory holds of one queue (a channel's inbox is one too)."""

    key: str  # queue/<name>, or channel/<name>><role>
    options: dict[str, Any] | None  # a non-durable queue's options: declared first; else None
    patterns: tuple[str, ...]  # a non-durable queue's bindings (topic patterns)
    messages: tuple[Message, ...]  # in delivery order: priority level, then sequence

    @property
    def unacked(self) -> int:
        """Messages already delivered (and not acknowledged) at least once."""
        return sum(1 for m in self.messages if m.delivery_count > 0)


@dataclasses.dataclass(frozen=True)
class ShardContents:
    index: int
    queues: tuple[QueueContents, ...]
    stream_entries: int  # transient entries of streams: not handed (dropped)

    @property
    def messages(self) -> int:
        return sum(len(q.messages) for q in self.queues)

    @property
    def unacked(self) -> int:
        return sum(q.unacked for q in self.queues)

    @property
    def declared(self) -> int:
        return sum(1 for q in self.queues if q.options is not None)

    def __bool__(self) -> bool:
        return bool(self.queues or self.stream_entries)


def memory_only(queue: Queue, patterns: Iterable[str] = ()) -> QueueContents | None:
    """What only memory holds of ``queue`` (``patterns``: its bindings), None if nothing:
    its transient messages (all of them in a non-durable queue), ready, returned or
    delivered and not acknowledged, in the order the queue would deliver them (its priority
    levels, highest first, then sequence); and a non-durable queue itself, even empty."""
    held = [m for level in queue.ready for m in level]
    held += [m for level in queue.requeued for _, m in level]
    held += [d.message for d in queue.inflight.values()]
    durable = queue.durable
    kept = [m for m in held if not ((m.persistent or m.stored) and durable)]
    if durable and not kept:
        return None
    cap = MAX_PRIORITY if queue.options.max_priority is None else queue.options.max_priority
    kept.sort(key=lambda m: (-min(m.priority, cap), m.seq))
    if durable:
        return QueueContents(queue.key, None, (), tuple(kept))
    return QueueContents(queue.key, queue.options.to_dict(), tuple(sorted(patterns)), tuple(kept))


def take(shard: Shard, patterns_of: Callable[[str], Iterable[str]]) -> ShardContents:
    """What only memory holds of ``shard`` (``patterns_of(key)``: a queue's bindings)."""
    queues: list[QueueContents] = []
    entries = 0
    for key in sorted(shard.holders):
        holder = shard.holders[key]
        if isinstance(holder, Queue):
            found = memory_only(holder, patterns_of(key))
            if found is not None:
                queues.append(found)
        elif isinstance(holder, Stream):
            entries += sum(
                1 for m in holder.entries if m.id and not (m.persistent and holder.durable)
            )  # (an entry without id is the gap of a failed write: nothing to hand)
    return ShardContents(shard.index, tuple(queues), entries)


def publish_target(key: str) -> tuple[str, str | None]:
    """(destination, role) of the publish that reaches queue ``key``: a channel's inbox of
    one role is where the other role publishes."""
    base, sep, role = key.partition(">")
    if not sep:
        return key, None
    return base, ChannelRole(role).other


def batches(
    messages: Sequence[Message], max_bytes: int = _BATCH_BYTES, max_count: int = _BATCH_COUNT
) -> list[list[Message]]:
    """``messages`` in order, cut into publishes of at most ``max_count`` messages and about
    ``max_bytes`` bytes of bodies (a bigger message goes alone)."""
    out: list[list[Message]] = []
    batch: list[Message] = []
    size = 0
    for m in messages:
        if batch and (len(batch) >= max_count or size + len(m.body) > max_bytes):
            out.append(batch)
            batch, size = [], 0
        batch.append(m)
        size += len(m.body)
    if batch:
        out.append(batch)
    return out


class Step(NamedTuple):
    """One request of a hand-over."""

    what: str  # for the log
    send: Callable[[Client], Awaitable[Any]]  # makes it, through a client of the receiver
    messages: int = 0  # messages it hands
    declares: int = 0  # non-durable queues it declares


def steps_of(contents: ShardContents) -> list[Step]:
    """The requests that hand ``contents`` on, in the order they go: queue by queue, a
    non-durable one declared with its options and bound as it was first, then its messages
    in delivery order, a batch a publish."""
    steps: list[Step] = []
    for queue in contents.queues:
        destination, role = publish_target(queue.key)
        if queue.options is not None:
            steps.append(Step(f"declare {destination}", _declare(destination, queue.options), 0, 1))
            for pattern in queue.patterns:
                steps.append(Step(f"bind {queue.key}", _bind(f"topic/{pattern}", queue.key)))
        for batch in batches(queue.messages):
            steps.append(
                Step(f"publish to {queue.key}", _publish(destination, batch, role), len(batch))
            )
    return steps


# ---- sending it ---------------------------------------------------------------------------------
class Successors(Protocol):
    """What the hand-over needs of the cluster."""

    node_id: str
    secret: str
    peer_ssl: ssl.SSLContext | None  # cluster TLS: links to peers use it

    async def written(self, shard: int) -> None: ...  # the shard's writes are in the log
    async def step_down(self, shard: int) -> None: ...  # hand the shard's stream on
    async def stream_leader(self, shard: int) -> str | None: ...  # who leads it now
    def heirs(self) -> set[str]: ...  # the other nodes that may take a shard (not stopping)
    def address_of(self, node: str) -> tuple[str, int] | None: ...


@dataclasses.dataclass
class _Tally:
    """How one shard's hand-over went."""

    handed: int = 0  # messages
    refused: int = 0  # messages the receiver answered no to (full, ...): dropped
    declared: int = 0  # non-durable queues
    why: str = ""  # why the rest was not handed, if it was not


class _Outcome(enum.Enum):
    DONE = "done"
    REFUSED = "refused"  # answered no: not done, and sending it again would not help
    LATE = "late"  # not done by the deadline


class HandOver:
    """One stop's hand-over (see the module docstring)."""

    def __init__(
        self,
        cluster: Successors,
        patterns_of: Callable[[str], Iterable[str]],
        within: float = HAND_OVER_FOR,
    ) -> None:
        self.cluster = cluster
        self.patterns_of = patterns_of
        self.within = within
        self._clients: dict[str, Client] = {}
        self._connecting: dict[str, asyncio.Future[Client]] = {}

    async def run(self, shards: Sequence[Shard]) -> dict[int, str]:
        """Hand on what the shards this node leads hold in memory only; the new leader of
        each shard handed (its stream stepped down)."""
        deadline = time.monotonic() + self.within
        found = [s for s in shards if s.leading and take(s, self.patterns_of)]
        if not found:
            return {}
        if not self.cluster.heirs():  # (the whole cluster stops: the others would not load)
            for shard in found:
                _dropped(take(shard, self.patterns_of), "every other node is stopping or gone")
            return {}
        try:
            done = await asyncio.gather(*(self._shard(s, deadline) for s in found))
        finally:
            await self._close()
        return {index: leader for index, leader in done if leader is not None}

    async def _shard(self, shard: Shard, deadline: float) -> tuple[int, str | None]:
        started = time.monotonic()
        i = shard.index
        shard.flush_removes()
        try:
            await asyncio.wait_for(self.cluster.written(i), _WRITTEN_WITHIN)
        except TimeoutError:
            log.warning("shard %d: its last writes did not reach the log in time", i)
        contents = take(shard, self.patterns_of)
        shard.demote("this node stops: what it held in memory goes to the next leader")
        leader, why = await self._successor(i, deadline)
        if leader is None:
            _dropped(contents, why)
            return i, None
        tally = await self._send(leader, contents, deadline)
        log.info(
            "shard %d: handed to node %s in %.2fs: %d of %d transient messages (%d of them"
            " unacknowledged, redelivered there), %d of %d non-durable queues",
            i,
            leader,
            time.monotonic() - started,
            tally.handed,
            contents.messages,
            contents.unacked,
            tally.declared,
            contents.declared,
        )
        left = contents.messages - tally.handed
        if left:
            log.warning(
                "shard %d: %d transient messages not handed to node %s (dropped): %d refused"
                " there, %d not sent (%s)",
                i,
                left,
                leader,
                tally.refused,
                left - tally.refused,
                tally.why,
            )
        if contents.stream_entries:
            log.warning(
                "shard %d: %d transient stream entries dropped (streams are not handed over)",
                i,
                contents.stream_entries,
            )
        return i, leader

    async def _successor(self, i: int, deadline: float) -> tuple[str | None, str]:
        """Step shard ``i``'s stream down (again while this node still leads it) until
        another node that may take it leads it (see ``Successors.heirs``); that node, or
        None and why not by ``deadline``."""
        cluster = self.cluster
        stepped = 0.0
        while time.monotonic() < deadline:
            heirs = cluster.heirs()
            if not heirs:
                return None, "every other node is stopping or gone"
            now = time.monotonic()
            leader = await cluster.stream_leader(i)
            if leader is not None and leader != cluster.node_id:
                if leader in heirs and cluster.address_of(leader) is not None:
                    return leader, ""
            elif now - stepped >= _STEP_DOWN_EVERY and (leader == cluster.node_id or not stepped):
                stepped = now
                try:
                    await asyncio.wait_for(cluster.step_down(i), _STEP_DOWN_EVERY)
                except Exception as exc:  # (no answer: look again, step down again later)
                    log.info("shard %d: stepping down its stream: %s", i, exc)
            await asyncio.sleep(_LOOK_EVERY)
        return None, f"no other node took it within {self.within:.0f}s"

    async def _send(self, leader: str, contents: ShardContents, deadline: float) -> _Tally:
        """Send ``contents`` to ``leader`` (or whoever leads the shard after it), in order,
        each request answered before the next; until done or ``deadline``."""
        tally = _Tally()
        node = leader
        for step in steps_of(contents):
            node, outcome = await self._request(contents.index, node, step.send, deadline)
            if outcome is _Outcome.LATE:
                tally.why = f"out of time ({self.within:.0f}s) at {step.what}"
                return tally
            if outcome is _Outcome.REFUSED:
                tally.refused += step.messages
                tally.why = f"refused at {step.what}"
            else:
                tally.handed += step.messages
                tally.declared += step.declares
        return tally

    async def _request(
        self, shard: int, node: str, send: Callable[[Client], Awaitable[Any]], deadline: float
    ) -> tuple[str, _Outcome]:
        """``send`` a request to ``node``, the shard's leader, and again while it was not
        done there (not leading the shard yet, a link lost: to whoever leads it then) until
        ``deadline``. The node last sent to, and the outcome."""
        while True:
            try:
                await send(await self._client(node))
                return node, _Outcome.DONE
            except RequestError as exc:
                if exc.code not in _AGAIN:
                    log.warning("shard %d: node %s refused a handed request: %s", shard, node, exc)
                    return node, _Outcome.REFUSED
            except (ConnectionClosed, OSError, TimeoutError) as exc:
                log.info("shard %d: the link to node %s: %s", shard, node, exc)
                await self._drop(node)
            if time.monotonic() + _RETRY >= deadline or not self.cluster.heirs():
                return node, _Outcome.LATE
            await asyncio.sleep(_RETRY)
            leader = await self.cluster.stream_leader(shard)
            if leader is not None and leader in self.cluster.heirs():
                node = leader

    async def _client(self, node: str) -> Client:
        client = self._clients.get(node)
        if client is not None and not client.closed:
            return client
        connecting = self._connecting.get(node)
        if connecting is None:
            connecting = asyncio.ensure_future(self._connect(node))
            self._connecting[node] = connecting
        try:
            client = await asyncio.shield(connecting)
        finally:
            if self._connecting.get(node) is connecting and connecting.done():
                del self._connecting[node]
        self._clients[node] = client
        return client

    async def _connect(self, node: str) -> Client:
        address = self.cluster.address_of(node)
        if address is None:
            raise ConnectionClosed(f"node {node} has not announced where it listens")
        return await Client.connect(
            address[0],
            address[1],
            client=handover_client(self.cluster.node_id),
            token=self.cluster.secret,
            timeout=_CONNECT_WITHIN,
            ssl=self.cluster.peer_ssl,
        )

    async def _drop(self, node: str) -> None:
        client = self._clients.pop(node, None)
        if client is not None:
            await client.close()

    async def _close(self) -> None:
        for fut in self._connecting.values():
            fut.cancel()
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.close()
            except PolymqError:
                pass


def _dropped(contents: ShardContents, why: str) -> None:
    log.warning(
        "shard %d: %s: %d transient messages (%d of them unacknowledged), %d non-durable"
        " queues and %d transient stream entries dropped",
        contents.index,
        why,
        contents.messages,
        contents.unacked,
        contents.declared,
        contents.stream_entries,
    )


def _declare(destination: str, options: dict[str, Any]) -> Callable[[Client], Awaitable[Any]]:
    return lambda client: client.declare(destination, **options)


def _bind(pattern: str, queue: str) -> Callable[[Client], Awaitable[Any]]:
    return lambda client: client.bind(pattern, queue)


def _publish(
    destination: str, messages: list[Message], role: str | None
) -> Callable[[Client], Awaitable[Any]]:
    return lambda client: client.publish(destination, messages, role=role)


__all__ = [
    "HAND_OVER_FOR",
    "HandOver",
    "QueueContents",
    "ShardContents",
    "Step",
    "Successors",
    "batches",
    "handover_client",
    "is_handover",
    "memory_only",
    "publish_target",
    "steps_of",
    "take",
]
