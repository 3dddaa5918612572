"""The topic mesh: topic messages between nodes, over NATS subjects with interest.

A topic publish is delivered to the local subscribers by the broker, and published once on
NATS subject ``polymq.topic.<name>`` (each polymq segment one NATS token, see
:func:`escape`). Each node subscribes to the NATS subjects that cover its local topic
subscriptions' patterns (:func:`subjects_for`), so NATS carries a message only to nodes
that want it: its route protocol exchanges interest.

======================  =============================================================
polymq pattern          NATS subjects (after ``polymq.topic.``)
======================  =============================================================
``a.b``                 ``a.b``
``a.*.c``               ``a.*.c``
``a.#``                 ``a.>`` and ``a`` (``#`` may match no segment; ``>`` needs one)
``a.#.c``               ``a.>``
``#``, ``#.a``          ``>``
``a.bc*`` (prefix)      ``a.>`` (the whole segments before the partial one)
======================  =============================================================

A NATS subject can be broader than its pattern, so what arrives is matched again with
polymq's own rules before it is delivered. One node's subscriptions share one queue group
(named after the node): NATS hands each message to one member of a group, so a message
covered by two of our subjects (``a.*.c`` and ``a.>``) still arrives once. They also share
one inbox, read by one task, so messages are handled in the order NATS sent them (nats-py
would give each subscription its own queue and task, and reorder across them).

Messages travel as msgpack ``[m.to_wire(), ...]`` with header ``Polymq-Node`` (the origin;
a node ignores its own). Topic messages are transient: a publish is fire and forget, but
for one thing. A persistent message that some other node routes into a durable queue it
leads (a binding) is confirmed, as on one node, only once that copy is committed: when
``waits_for`` names shards led elsewhere whose durable queues are bound to the topic (every
node knows them: :mod:`polymq_core.topics.durableroutes`), the message goes with a NATS reply
subject (``polymq.routed.<node>.<token>``, header ``Polymq-Part``: which part of a batch
split to fit NATS' payload), every node that gets it answers there once its copies are
committed, naming the shards it leads and those whose copy failed, and
:meth:`TopicMesh.publish` returns a future that resolves when a leader of each of those
shards has answered, fails ``unavailable`` when one's copy failed (saying what that leader
knows of its fate), and fails ``unavailable`` ("may not have been committed") when one has
not answered within :data:`CONFIRM_WITHIN` seconds (a frozen or dead leader, a leader
without the binding's interest yet). The same answers carry :meth:`TopicMesh.append`: a
message the core itself sends to a queue whose shard another node leads (a dead letter),
on ``polymq.append.<shard>``, which every node hears and the shard's leader appends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from polymq.errors import Unavailable
from polymq.types import Message

from .trie import TopicRouter, validate_pattern

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

__all__ = [
    "CONFIRM_WITHIN",
    "Routed",
    "TopicMesh",
    "escape",
    "name_for",
    "subject_for",
    "subjects_for",
    "unescape",
]

log = logging.getLogger(__name__)

PREFIX = "polymq.topic."
NODE_HEADER = "Polymq-Node"
PART_HEADER = "Polymq-Part"  # which part of a split publish a confirmed message is
ROUTED = "polymq.routed."  # + <node>.<token>: where a confirmed message's copies are answered
APPEND = "polymq.append."  # + <shard>: a message for a queue of that shard (its leader's)
# seconds a publish waits for the leaders of the shards it was routed into to answer (the
# forwarding of a request to a leader waits as long: relay.py)
CONFIRM_WITHIN = 15.0
_SPECIAL = frozenset(".*>%")  # NATS token separator and wildcards, and our escape
_EMPTY = "%"  # an empty segment (a lone '%' is never an escape)
_INBOX_LIMIT = 65536  # messages received and not yet handled; beyond, NATS drops (slow consumer)


def escape(segment: str) -> str:
    """One polymq segment as one NATS token: printable ASCII stays, except ``. * > %``;
    everything else (spaces, controls, non-ASCII) becomes ``%XX`` per UTF-8 byte."""
    if not segment:
        return _EMPTY
    if segment.isascii() and segment.isprintable() and " " not in segment:
        if not any(c in _SPECIAL for c in segment):
            return segment  # the common case: a plain name
    out = []
    for c in segment:
        if "!" <= c <= "~" and c not in _SPECIAL:
            out.append(c)
        else:
            out.extend(f"%{b:02X}" for b in c.encode())
    return "".join(out)


def unescape(token: str) -> str:
    """The inverse of :func:`escape`; ``ValueError`` for what it never produces."""
    if token == _EMPTY:
        return ""
    if "%" not in token:
        return token
    raw = bytearray()
    i = 0
    while i < len(token):
        c = token[i]
        if c == "%":
            hex_ = token[i + 1 : i + 3]
            if len(hex_) != 2 or not all(h in "0123456789ABCDEF" for h in hex_):
                raise ValueError(f"bad escape in NATS token {token!r}")
            raw.append(int(hex_, 16))
            i += 3
        else:
            raw.extend(c.encode())
            i += 1
    return raw.decode()


def subject_for(name: str) -> str:
    """The NATS subject a topic's messages are published on."""
    return PREFIX + ".".join(escape(seg) for seg in name.split("."))


def name_for(subject: str) -> str | None:
    """The topic name of a mesh subject; None if it is not one."""
    if not subject.startswith(PREFIX):
        return None
    try:
        return ".".join(unescape(tok) for tok in subject[len(PREFIX) :].split("."))
    except (ValueError, UnicodeDecodeError):
        return None


def subjects_for(pattern: str) -> tuple[str, ...]:
    """The NATS subjects that together cover every topic ``pattern`` matches (and maybe
    more: filter again). ``ValueError`` for an invalid pattern."""
    validate_pattern(pattern)
    if pattern.endswith("*") and len(pattern) > 1 and pattern[-2] != ".":  # prefix 'a.bc*'
        whole = pattern[:-1].split(".")[:-1]
        return (PREFIX + "".join(escape(s) + "." for s in whole) + ">",)
    segs = pattern.split(".")
    tokens: list[str] = []
    for i, seg in enumerate(segs):
        if seg == "#":
            if not tokens:
                return (PREFIX + ">",)
            head = PREFIX + ".".join(tokens)
            if all(s == "#" for s in segs[i:]):  # '#'s may match nothing: 'a.#' is 'a' too
                return (head + ".>", head)
            return (head + ".>",)
        tokens.append("*" if seg == "*" else escape(seg))
    return (PREFIX + ".".join(tokens),)


@dataclass(frozen=True)
class _Publish:
    subject: str
    payload: bytes
    reply: str = ""  # a confirmed message's: where its copies are answered
    part: int = 0


@dataclass(frozen=True)
class Routed:
    """What a node answers about the copies of a confirmed message it routed: the shards it
    leads, those whose copy failed (shard, why), how many queues took a copy, and the keys
    of those that refused it (full, under ``reject``)."""

    led: list[int]
    failed: list[tuple[int, str]]
    queues: int
    refused: list[str]

    def to_wire(self, part: int) -> bytes:
        fields = [part, self.led, [list(f) for f in self.failed], self.queues, self.refused]
        return bytes(msgpack.packb(fields, use_bin_type=True))

    @staticmethod
    def from_wire(data: bytes) -> tuple[int, Routed]:
        """(the part, the answer); ``ValueError`` for what :meth:`to_wire` never makes."""
        try:
            part, led, failed, queues, refused = msgpack.unpackb(data, raw=False)
            return int(part), Routed(
                [int(s) for s in led],
                [(int(s), str(why)) for s, why in failed],
                int(queues),
                [str(k) for k in refused],
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not an answer about routed copies: {exc}") from None


class _Confirm:
    """A confirmed publish waiting for the leaders of ``left`` (part, shard) to answer."""

    __slots__ = ("future", "left", "name", "queues", "refused", "timer")

    def __init__(self, name: str, left: set[tuple[int, int]], future: asyncio.Future[Any]):
        self.name = name
        self.left = left
        self.future = future
        self.queues = 0
        self.refused: list[str] = []
        self.timer: asyncio.TimerHandle | None = None


@dataclass(frozen=True)
class _Subscribe:
    subject: str


@dataclass(frozen=True)
class _Unsubscribe:
    subject: str


_Op = _Publish | _Subscribe | _Unsubscribe


class TopicMesh:
    """Carries topic messages to the other nodes and delivers theirs here.

    ``interest`` and ``publish`` are synchronous; their NATS calls run, in call order, in
    one owned task (so a subscribe is never overtaken by its unsubscribe, nor one publish
    by the next)."""

    PREFIX = PREFIX

    def __init__(
        self,
        nc: NatsClient,
        node_id: str,
        deliver_local: Callable[[str, list[Message], bool], Awaitable[Routed] | None],
        waits_for: Callable[[str], set[int]] | None = None,
        deliver_queue: Callable[[int, str, list[Message]], Awaitable[Routed] | None] | None = None,
    ) -> None:
        """``deliver_local(name, messages, answer)``: hands another node's messages to this
        one's subscribers and bound queues; with ``answer``, returns what to answer about
        the copies once they are committed. ``waits_for(name)``: the shards led by other
        nodes whose durable queues a persistent message to ``name`` must reach before it is
        confirmed (module docstring); None: never wait. ``deliver_queue(shard, key,
        messages)``: appends what another node's :meth:`append` sent, if this node leads
        ``shard`` (what to answer), else None."""
        self.nc = nc
        self.node_id = node_id
        self._deliver_local = deliver_local
        self._waits_for = waits_for
        self._deliver_queue = deliver_queue
        self._routed_prefix = ROUTED + escape(node_id) + "."
        self._tokens = itertools.count(1)
        self._confirms: dict[str, _Confirm] = {}  # token -> a publish waiting for answers
        self._answering: set[asyncio.Task[None]] = set()  # answers about our copies
        self._queue_group = "polymq-" + escape(node_id)
        self._headers = {NODE_HEADER: node_id}
        self._patterns: dict[str, int] = {}  # pattern -> local interest (refcount)
        self._wanted: dict[str, int] = {}  # NATS subject -> patterns needing it
        self._router: TopicRouter[str] = TopicRouter()  # the patterns, to filter arrivals
        self._subs: dict[str, Subscription] = {}  # NATS subject -> our subscription
        self._ops: asyncio.Queue[_Op | None] = asyncio.Queue()
        self._inbox: asyncio.Queue[Msg] = asyncio.Queue(maxsize=_INBOX_LIMIT)
        self._task: asyncio.Task[None] | None = None  # runs the NATS calls
        self._reader: asyncio.Task[None] | None = None  # handles what arrives
        self._closed = False

    # ---- life cycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Run the NATS calls (those queued before start too)."""
        if self._task is not None or self._closed:
            raise RuntimeError("the topic mesh is already started (or stopped)")
        if self._waits_for is not None:
            self._subs[self._routed_prefix + "*"] = await self.nc.subscribe(
                self._routed_prefix + "*", cb=self._answered
            )
        if self._deliver_queue is not None:
            self._subs[APPEND + "*"] = await self.nc.subscribe(APPEND + "*", cb=self._append)
        self._task = asyncio.create_task(self._run(), name=f"topic-mesh-{self.node_id}")
        self._reader = asyncio.create_task(self._read(), name=f"topic-mesh-in-{self.node_id}")

    async def stop(self, grace: float = 2.0) -> None:
        """Send what is queued (up to ``grace`` seconds), then unsubscribe. Idempotent."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            self._ops.put_nowait(None)
            try:
                await asyncio.wait_for(asyncio.shield(task), grace)
            except TimeoutError:
                log.warning("topic mesh: %d operations unsent at stop", self._ops.qsize())
        for owned in (task, self._reader):
            if owned is not None:
                owned.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await owned
        self._reader = None
        for answering in list(self._answering):
            answering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answering
        for token in list(self._confirms):
            self._fail(token, "this node is stopping")
        subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            with contextlib.suppress(Exception):  # the connection may be closed already
                await sub.unsubscribe()
        while not self._inbox.empty():  # unhandled: let a Subscription.drain's join() end
            self._inbox.get_nowait()
            self._inbox.task_done()

    # ---- the broker's side -------------------------------------------------------------------
    def interest(self, pattern: str, delta: int) -> None:
        """Add ``delta`` local subscriptions to ``pattern``: the first one subscribes the
        NATS subjects that cover it, the last one gone unsubscribes them. ``ValueError``
        for an invalid pattern; a count going below zero is logged and taken as zero."""
        subjects = subjects_for(pattern)
        old = self._patterns.get(pattern, 0)
        new = old + delta
        if new < 0:  # a caller's bug: say so, but never fail the broker's unsubscribe
            log.error("topic mesh: interest in %r dropped below zero (%+d)", pattern, delta)
            new = 0
        if old == new:
            return
        if new:
            self._patterns[pattern] = new
        else:
            del self._patterns[pattern]
        if old == 0:
            self._router.add(pattern, pattern)
            for subject in subjects:
                count = self._wanted.get(subject, 0)
                self._wanted[subject] = count + 1
                if count == 0:
                    self._ops.put_nowait(_Subscribe(subject))
        elif new == 0:
            self._router.remove(pattern, pattern)
            for subject in subjects:
                count = self._wanted.pop(subject) - 1
                if count:
                    self._wanted[subject] = count
                else:
                    self._ops.put_nowait(_Unsubscribe(subject))

    def publish(self, name: str, messages: list[Message]) -> asyncio.Future[Routed] | None:
        """Send ``messages`` of topic ``name`` to the nodes that want them. A batch larger
        than NATS' max payload goes in several parts. Fire and forget (None), unless a
        persistent message must reach durable queues that other nodes lead: then the future
        of their leaders' answers (module docstring), with the queues that took a copy and
        those that refused it."""
        if self._closed or not messages:
            return None
        subject = subject_for(name)
        payloads = self._payloads(messages)
        shards = set()
        if self._waits_for is not None and any(m.persistent for m in messages):
            shards = self._waits_for(name)
        if not shards:
            for payload in payloads:
                self._ops.put_nowait(_Publish(subject, payload))
            return None
        left = {(part, shard) for part in range(len(payloads)) for shard in shards}
        token, future = self._wait(f"topic/{name}", left)
        reply = self._routed_prefix + token
        for part, payload in enumerate(payloads):
            self._ops.put_nowait(_Publish(subject, payload, reply, part))
        if not payloads:  # too large for NATS: it reaches none of them
            self._fail(token, "too large to reach them", fate="not sent")
        return future

    def append(self, key: str, shard: int, messages: list[Message]) -> asyncio.Future[Routed]:
        """Append ``messages`` to queue ``key`` of ``shard``, which another node leads (a
        dead letter): sent on ``polymq.append.<shard>``, which every node hears and the
        shard's leader does; the future of its answer, as for :meth:`publish`."""
        token, future = self._wait(key, {(0, shard)})
        if self._closed:
            self._fail(token, "this node is stopping", fate="not sent")
            return future
        payload = msgpack.packb([key, [m.to_wire() for m in messages]], use_bin_type=True)
        self._ops.put_nowait(_Publish(APPEND + str(shard), payload, self._routed_prefix + token))
        return future

    def _wait(self, label: str, left: set[tuple[int, int]]) -> tuple[str, asyncio.Future[Routed]]:
        """A publish to ``label`` waiting for the answers of the leaders of ``left`` (part,
        shard): its token and its future."""
        loop = asyncio.get_running_loop()
        token = str(next(self._tokens))
        confirm = self._confirms[token] = _Confirm(label, left, loop.create_future())
        confirm.future.add_done_callback(_retrieved)
        confirm.timer = loop.call_later(CONFIRM_WITHIN, self._expire, token)
        return token, confirm.future

    async def _answered(self, msg: Msg) -> None:
        """A node answers about its copies of a confirmed message of ours."""
        token = msg.subject.rpartition(".")[2]
        confirm = self._confirms.get(token)
        if confirm is not None:
            try:
                part, routed = Routed.from_wire(msg.data)
            except ValueError as exc:
                log.warning("topic mesh: a malformed answer on %s: %s", msg.subject, exc)
            else:
                self._tally(token, confirm, part, routed)

    def _tally(self, token: str, confirm: _Confirm, part: int, routed: Routed) -> None:
        confirm.queues += routed.queues
        confirm.refused += routed.refused
        if routed.failed:  # (``why`` says whether it may have been committed after all)
            shard, why = routed.failed[0]
            self._fail(token, f"the copy for shard {shard} failed: {why}", fate="")
            return
        for shard in routed.led:
            confirm.left.discard((part, shard))
        if not confirm.left:
            self._confirms.pop(token, None)
            if confirm.timer is not None:
                confirm.timer.cancel()
            if not confirm.future.done():
                confirm.future.set_result(Routed([], [], confirm.queues, confirm.refused))

    def _expire(self, token: str) -> None:
        self._fail(token, f"no answer within {CONFIRM_WITHIN:g} s")

    def _fail(self, token: str, why: str, *, fate: str = "may not have been committed") -> None:
        """Answer the publish ``token`` ``unavailable``, ``why``; ``fate``: what that says of
        the copies (by default, not known: they may or may not be in those queues)."""
        confirm = self._confirms.pop(token, None)
        if confirm is None:
            return
        if confirm.timer is not None:
            confirm.timer.cancel()
        if confirm.future.done():
            return
        shards = sorted({s for _, s in confirm.left})
        there = f"; {fate} there" if fate else ""
        confirm.future.set_exception(
            Unavailable(
                f"{confirm.name}: routed into durable queues of shard(s)"
                f" {', '.join(map(str, shards))}, led by other nodes: {why}{there}"
                " (publish it again)"
            )
        )

    def _payloads(self, messages: list[Message]) -> list[bytes]:
        payload = msgpack.packb([m.to_wire() for m in messages], use_bin_type=True)
        limit = self.nc.max_payload or 0
        if limit <= 0 or len(payload) < limit - 1024:  # room for the headers
            return [payload]
        if len(messages) == 1:
            log.warning(
                "topic mesh: a message of %d bytes exceeds NATS' max payload (%d): it"
                " reaches this node's subscribers only",
                len(payload),
                limit,
            )
            return []
        half = len(messages) // 2
        return self._payloads(messages[:half]) + self._payloads(messages[half:])

    # ---- NATS --------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            op = await self._ops.get()
            if op is None:
                return
            try:
                if isinstance(op, _Publish) and op.reply:
                    headers = {**self._headers, PART_HEADER: str(op.part)}
                    await self.nc.publish(op.subject, op.payload, op.reply, headers)
                elif isinstance(op, _Publish):
                    await self.nc.publish(op.subject, op.payload, headers=self._headers)
                elif isinstance(op, _Subscribe):
                    if op.subject not in self._subs:
                        self._subs[op.subject] = await self._subscribe(op.subject)
                else:
                    sub = self._subs.pop(op.subject, None)
                    if sub is not None:
                        await sub.unsubscribe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a closed or reconnecting connection: go on
                log.warning("topic mesh: %s on %s failed: %r", type(op).__name__, op.subject, exc)
                if isinstance(op, _Publish) and op.reply:
                    self._fail(op.reply.rpartition(".")[2], f"sending it failed ({exc!r})")

    async def _subscribe(self, subject: str) -> Subscription:
        # Without a callback, nats-py only puts a subscription's messages on its
        # ``_pending_queue`` (its reader, in arrival order); with our inbox there, every
        # subscription feeds one queue. No byte limit: nats-py would count bytes it never
        # sees consumed. Should a later nats-py lack the attribute, fall back to a
        # callback per subscription (order across subscriptions is then not kept).
        sub = await self.nc.subscribe(subject, queue=self._queue_group, pending_bytes_limit=0)
        own = getattr(sub, "_pending_queue", None)
        if isinstance(own, asyncio.Queue):
            sub._pending_queue = self._inbox
            while not own.empty():  # arrived before the swap (it cannot, but be sure)
                self._inbox.put_nowait(own.get_nowait())
            return sub
        log.warning("topic mesh: this nats-py has no _pending_queue; order may suffer")
        await sub.unsubscribe()
        return await self.nc.subscribe(subject, queue=self._queue_group, cb=self._received)

    async def _read(self) -> None:
        while True:
            msg = await self._inbox.get()
            try:
                self._handle(msg)
            finally:
                self._inbox.task_done()

    async def _received(self, msg: Msg) -> None:
        self._handle(msg)

    def _handle(self, msg: Msg) -> None:
        headers = msg.headers
        if headers is not None and headers.get(NODE_HEADER) == self.node_id:
            return
        name = name_for(msg.subject)
        if name is None:
            log.warning("topic mesh: ignoring a message on %s", msg.subject)
            return
        if not self._router.match(name):
            return  # the NATS subject is broader than our patterns
        try:
            fields: Any = msgpack.unpackb(msg.data, raw=False)
            if not isinstance(fields, list):
                raise ValueError("not a list of messages")
            messages = [Message.from_wire(f) for f in fields]
        except Exception as exc:
            origin = headers.get(NODE_HEADER) if headers else None
            log.warning("topic mesh: a malformed message from %s on %r: %s", origin, name, exc)
            return
        reply = msg.reply
        try:
            answer = self._deliver_local(name, messages, bool(reply))
        except Exception:
            log.exception("topic mesh: delivering %r failed", name)
            return
        if reply and answer is not None:
            part = headers.get(PART_HEADER, "0") if headers else "0"
            self._answer_soon(reply, int(part) if part.isdigit() else 0, answer)

    async def _append(self, msg: Msg) -> None:
        """Another node's :meth:`append`: ours to do if we lead its shard."""
        headers = msg.headers
        if headers is not None and headers.get(NODE_HEADER) == self.node_id:
            return
        assert self._deliver_queue is not None
        try:
            shard = int(msg.subject.rpartition(".")[2])
            key, fields = msgpack.unpackb(msg.data, raw=False)
            messages = [Message.from_wire(f) for f in fields]
            answer = self._deliver_queue(shard, str(key), messages)
        except Exception as exc:
            log.warning("topic mesh: a malformed append on %s: %s", msg.subject, exc)
            return
        if answer is not None and msg.reply:
            self._answer_soon(msg.reply, 0, answer)

    def _answer_soon(self, reply: str, part: int, answer: Awaitable[Routed]) -> None:
        task = asyncio.create_task(self._answer(reply, part, answer))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, reply: str, part: int, answer: Awaitable[Routed]) -> None:
        """Tell the origin of a confirmed message about our copies, once they are done."""
        routed = await answer
        try:
            await self.nc.publish(reply, routed.to_wire(part))
        except Exception as exc:  # (the origin answers "may not have been committed")
            log.warning("topic mesh: answering on %s failed: %r", reply, exc)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark a failure as seen: the publish that waited may have failed already."""
    if not fut.cancelled():
        fut.exception()
