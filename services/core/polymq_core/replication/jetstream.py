"""A shard's stream in JetStream: the replicated log's client (docs/cluster.md, "Writes").

Every shard has one JetStream stream, ``POLYMQ_SHARD_<i>`` on subject ``polymq.shard.<i>``,
each message of it one entry (:mod:`polymq_core.store.logentry`). :class:`ShardLog` speaks to it
through nats-py: create it, ask who leads it, append an entry *fenced* by
``Nats-Expected-Last-Sequence``, read one entry, tail it in order, purge it, resize it, move
its leader. nats errors stop here and come out as :class:`~polymq_core.store.logentry.LogError`
(the tree is drawn in :mod:`polymq_core.store.logentry`); :class:`TailEnd` is the one this module
adds: a tail that cannot go on, because its next entry was purged.

What is done with the entries (the shard's store in cluster mode, which leads and which
follows) is :mod:`polymq_core.replication.replicatedstore`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.js.errors
from nats.js import api

from polymq.tasks import cancelling, check_cancelled

from ..store.logentry import Deposed, LogError, LogUnavailable, NoLeader

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

__all__ = ["ShardLog", "TailEnd"]

log = logging.getLogger(__name__)

# -- the stream --------------------------------------------------------------------------------

_WRONG_LAST_SEQUENCE = 10071  # JSStreamWrongLastSequenceErrF
_LAST_SEQUENCE = re.compile(r"wrong last sequence: (\d+)")
_NO_SUITABLE_PEERS = 10005  # JSClusterNoPeersErrF: peers are still joining
_UNAVAILABLE_ERRORS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoServersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    asyncio.TimeoutError,
)
_NATS_ERRORS = (nats.errors.Error, asyncio.TimeoutError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, nats.js.errors.APIError):
        return f"{exc.description or type(exc).__name__} (code {exc.code}, {exc.err_code})"
    return str(exc) or type(exc).__name__


def _translate(exc: BaseException, what: str) -> LogError:
    """A nats error as this module's, its message saying ``what`` failed."""
    text = f"{what}: {_describe(exc)}"
    if isinstance(exc, nats.js.errors.APIError):
        if exc.err_code == _WRONG_LAST_SEQUENCE:
            found = _LAST_SEQUENCE.search(exc.description or "")
            error: LogError = Deposed(text, last=int(found[1]) if found else None)
        elif exc.err_code == _NO_SUITABLE_PEERS or isinstance(exc, _UNAVAILABLE_ERRORS):
            error = LogUnavailable(text)
        else:
            error = LogError(text)
    elif isinstance(exc, (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)):
        error = NoLeader(text)  # (no subscriber: the request reached no stream leader)
    elif isinstance(exc, _UNAVAILABLE_ERRORS):
        error = LogUnavailable(text)
    else:
        error = LogError(text)
    error.__cause__ = exc
    return error


_BATCH = 64  # entries per pull request
_EXPIRES = 5.0  # seconds a pull request waits on the server
_HEARTBEAT = 1.0  # seconds between the server's idle heartbeats during a pull
_STALE = 3 * _HEARTBEAT  # silence after which the tail's consumer is presumed lost
_INACTIVE = 10.0  # seconds after which the server drops an abandoned tail consumer
_BACKOFF = (0.05, 2.0)  # the tail's retry delays: first, most
_HEADROOM = 4096  # bytes of a NATS message left for headers and protocol


class _Restart(Exception):
    """The tail's consumer is lost or out of step: make a new one from the next entry."""


class TailEnd(LogError):
    """The tail cannot go on: its next entry was purged, or the log is shorter than what
    was applied here."""


class ShardLog:
    """Shard ``shard``'s stream, ``{prefix}_{shard}`` on ``polymq.shard.{shard}``."""

    def __init__(
        self,
        js: JetStreamContext,
        shard: int,
        node_id: str,
        *,
        replicas: int,
        prefix: str = "POLYMQ_SHARD",
        timeout: float = 5.0,
    ) -> None:
        self.js = js
        self.shard = shard
        self.node_id = node_id
        self.replicas = replicas
        self.stream = f"{prefix}_{shard}"
        self.subject = f"polymq.shard.{shard}"
        self.timeout = timeout
        self.peers: tuple[str, ...] = ()  # the stream's replicas, at the last look
        self.offline: tuple[str, ...] = ()  # those of them JetStream calls offline
        self.configured = 0  # the replicas its configuration asks for, at the last look
        self._nudged = asyncio.Event()  # a new leader: a tail waiting to retry tries now
        # the tails' current tries (see nudge), and those of them applying an entry
        self._attempts: set[asyncio.Future[None]] = set()
        self._in_entry: set[asyncio.Future[None] | None] = set()
        self.on_new_leader: Callable[[], None] | None = None  # told by nudge()

    def __repr__(self) -> str:
        return f"<ShardLog {self.stream} x{self.replicas}>"

    @property
    def _nc(self) -> NatsClient:
        nc: NatsClient = self.js._nc
        return nc

    @property
    def max_entry(self) -> int:
        """The largest entry the log takes, in bytes (the server's max_payload, less room
        for headers)."""
        try:
            limit = int(self._nc.max_payload)
        except Exception:  # not connected yet: nats-server's default
            limit = 1024 * 1024
        return max(limit - _HEADROOM, 1024)

    async def _call(self, what: str, call: Awaitable[Any]) -> Any:
        """``call`` within the log's timeout, nats errors translated."""
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        except _NATS_ERRORS as exc:
            raise _translate(exc, f"{what} {self.stream}") from exc

    async def ensure(self) -> None:
        """Create the stream, or find it there with the same configuration (or with another
        number of replicas, which it then keeps: a node given only some of its peers
        counts fewer nodes than the one that made the stream). While the cluster's
        JetStream has no meta leader (or too few peers), try again until ``timeout``; then
        :class:`LogUnavailable`."""
        config = api.StreamConfig(
            name=self.stream,
            subjects=[self.subject],
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            num_replicas=self.replicas,
            allow_direct=True,
            discard=api.DiscardPolicy.OLD,
            max_msgs=-1,
            max_bytes=-1,
            max_age=0,
        )
        deadline = time.monotonic() + self.timeout
        delay = _BACKOFF[0]
        while True:
            try:
                await self._call("creating", self.js.add_stream(config))
                return
            except LogUnavailable as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.debug("%s: JetStream not ready (%s); trying again", self.stream, exc)
            except LogError as exc:
                try:
                    there = (await self._stream_info()).config
                except LogError:
                    raise exc from None
                if there.num_replicas == self.replicas or there.subjects != config.subjects:
                    raise  # not a question of replicas
                log.info(
                    "%s: kept with %s replicas (this node counts %d nodes)",
                    self.stream,
                    there.num_replicas,
                    self.replicas,
                )
                self.replicas = there.num_replicas or self.replicas
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF[1])

    async def _stream_info(self) -> api.StreamInfo:
        info: api.StreamInfo = await self._call("asking about", self.js.stream_info(self.stream))
        cluster = info.cluster
        if cluster is not None:
            names = [cluster.leader] + [r.name for r in cluster.replicas or ()]
            self.peers = tuple(sorted(n for n in names if n))
            self.configured = int(info.config.num_replicas or 0)
            self.offline = tuple(
                sorted(r.name for r in cluster.replicas or () if r.offline and r.name)
            )
        return info

    async def info(self) -> tuple[str | None, int]:
        """(the server name of the stream's Raft leader, or None while there is none; the
        sequence of its last entry, 0 if none)."""
        info = await self._stream_info()
        leader = info.cluster.leader if info.cluster is not None else None
        return leader or None, int(info.state.last_seq or 0)

    async def followers(self) -> dict[str, tuple[int, float]]:
        """The stream's replicas but its leader, as its Raft leader reports them now: per
        server name (a node's id), (the entries its copy is behind the leader's, the seconds
        since the leader last heard from it); those JetStream calls offline left out."""
        cluster = (await self._stream_info()).cluster
        replicas = cluster.replicas or () if cluster is not None else ()
        return {
            r.name: (int(r.lag or 0), (r.active or 0) / 1e9)  # (active: nanoseconds)
            for r in replicas
            if r.name and not r.offline
        }

    async def append(self, payload: bytes, expected_last: int) -> int:
        """Append ``payload`` if the stream's last sequence is ``expected_last``; its new
        sequence once a majority of the replicas have it. :class:`Deposed` if the last
        sequence is another, :class:`LogUnavailable` if no answer came in time (the entry
        may or may not have been appended)."""
        headers = {"Nats-Expected-Last-Sequence": str(expected_last)}
        try:
            ack = await self.js.publish(
                self.subject, payload, timeout=self.timeout, stream=self.stream, headers=headers
            )
        except _NATS_ERRORS as exc:
            raise _translate(exc, f"appending to {self.stream} after {expected_last}") from exc
        return int(ack.seq)

    async def get(self, seq: int) -> bytes:
        """Entry ``seq``, read from the stream's leader: no consumer needed (JetStream makes
        consumers through its meta leader, which may be electing too after a crash)."""
        msg = await self._call("reading", self.js.get_msg(self.stream, seq))
        return bytes(msg.data or b"")

    async def span(self) -> tuple[int, int]:
        """(the sequence of the stream's first entry, of its last); the first is the last
        plus one when the stream is empty, (0, 0) if it never had an entry."""
        first, last, _, _ = await self.extent()
        return first, last

    async def extent(self) -> tuple[int, int, int, int]:
        """:meth:`span`, then the entries the stream holds and their bytes."""
        state = (await self._stream_info()).state
        return (
            int(state.first_seq or 0),
            int(state.last_seq or 0),
            int(state.messages or 0),
            int(state.bytes or 0),
        )

    async def purge_below(self, seq: int) -> None:
        """Drop every entry before ``seq`` (``seq`` and after stay)."""
        if seq <= 1:
            return
        await self._call("purging", self.js.purge_stream(self.stream, seq=seq))

    async def step_down(self, preferred: str | None = None) -> None:
        """Ask the stream's Raft leader to hand leadership to another replica (to the
        server named ``preferred``, if given and able)."""
        body = {"placement": {"preferred": preferred}} if preferred else None
        await self._request("LEADER.STEPDOWN", body, "stepping down")

    async def remove_peer(self, server: str) -> None:
        """Take the server named ``server`` out of the stream's replicas for good
        (JetStream places a new replica on a server that has none; it refuses with "peer
        remap failed" when there is none). :class:`LogError` if JetStream refuses."""
        await self._request("PEER.REMOVE", {"peer": server}, f"removing {server} from")

    async def _request(self, api_name: str, body: dict[str, Any] | None, what: str) -> None:
        """``$JS.API.STREAM.<api_name>.<stream>`` with ``body``; its error translated."""
        subject = f"$JS.API.STREAM.{api_name}.{self.stream}"
        data = json.dumps(body).encode() if body is not None else b""
        msg = await self._call(what, self._nc.request(subject, data))
        try:
            answer = json.loads(msg.data)
        except ValueError as exc:
            raise LogError(f"{what} {self.stream}: unreadable answer") from exc
        error = answer.get("error")
        if error:
            try:
                nats.js.errors.APIError.from_error(error)  # raises the error's own class
            except nats.js.errors.APIError as exc:
                raise _translate(exc, f"{what} {self.stream}") from exc

    async def resize(self, replicas: int) -> None:
        """Give the stream ``replicas`` replicas: fewer (JetStream drops offline ones first,
        then those furthest behind; never the leader) or more (JetStream places them on
        servers that have none). :class:`LogError` if it refuses."""
        info = await self._stream_info()
        config = info.config
        config.num_replicas = replicas
        await self._call("resizing", self.js.update_stream(config))
        self.replicas = replicas

    # -- tailing ---------------------------------------------------------------------------

    def tail(
        self, start: int, on_entry: Callable[[int, bytes], Awaitable[None]]
    ) -> asyncio.Task[None]:
        """A task that calls ``on_entry(seq, data)`` for every entry from ``start`` on, in
        order, each awaited before the next, never skipping one and never repeating one. It
        survives leader changes and reconnects (a new consumer starts after the last entry
        delivered). It ends with :class:`LogError` if entry ``start`` was purged (or the
        stream ends before ``start - 1``), or with what ``on_entry`` raised. The caller
        owns the task: cancel and await it."""
        return asyncio.get_running_loop().create_task(
            self._tail(start, on_entry), name=f"tail {self.stream} from {start}"
        )

    async def _tail(self, start: int, on_entry: Callable[[int, bytes], Awaitable[None]]) -> None:
        expected = [start]  # the next sequence to deliver; a cell shared with _consume
        delay = _BACKOFF[0]
        while True:
            check_cancelled()
            began = expected[0]
            self._nudged.clear()
            attempt = asyncio.ensure_future(self._tail_once(expected, on_entry))
            self._attempts.add(attempt)
            try:
                await attempt
            except asyncio.CancelledError:
                if cancelling():
                    raise
                # nudged: the try was waiting on a request to the old leader, which would
                # only have failed after its timeout (seconds of a failover)
                log.debug("%s: tail restarts at %d (a new leader)", self.stream, expected[0])
            except (LogUnavailable, _Restart) as exc:
                log.debug("%s: tail restarts at %d (%s)", self.stream, expected[0], exc)
            except TailEnd:
                raise
            except LogError as exc:
                log.warning("%s: tail restarts at %d (%s)", self.stream, expected[0], exc)
            finally:
                self._attempts.discard(attempt)
            if expected[0] > began or self._nudged.is_set():  # going well, or a new leader
                delay = _BACKOFF[0]
                if self._nudged.is_set():
                    continue  # at once
            try:
                await asyncio.wait_for(self._nudged.wait(), delay)
            except TimeoutError:
                delay = min(delay * 2, _BACKOFF[1])
            else:
                delay = _BACKOFF[0]

    async def _tail_once(
        self, expected: list[int], on_entry: Callable[[int, bytes], Awaitable[None]]
    ) -> None:
        await self._check_start(expected[0])
        await self._consume(expected, on_entry)

    def nudge(self) -> None:
        """The stream has a new leader: a tail waiting to try again (its consumer was lost
        with the old leader, or could not be made without one) tries at once, and a try
        waiting on NATS (a request the dead leader will never answer, a consumer gone with
        it) starts again at once; one applying an entry, once it is applied."""
        self._nudged.set()  # (cleared as each try begins: one applying sees it after)
        if self.on_new_leader is not None:
            self.on_new_leader()
        for attempt in list(self._attempts):
            if not attempt.done() and attempt not in self._in_entry:
                attempt.cancel()

    async def _check_start(self, seq: int) -> None:
        state = (await self._stream_info()).state
        first, last = int(state.first_seq or 0), int(state.last_seq or 0)
        if seq < first:
            raise TailEnd(f"purged: {self.stream} starts at entry {first}; {seq} is gone")
        if seq > last + 1:
            # Seen when a restarted node asks before its replica and the stream's leader
            # have caught up with each other: try again (with back-off) rather than stop;
            # the log keeps saying so if it lasts (a log that lost entries, or another
            # log under the same name).
            raise LogError(
                f"behind: {self.stream} ends at entry {last}, but {seq - 1} was applied here"
            )

    async def _consume(
        self, expected: list[int], on_entry: Callable[[int, bytes], Awaitable[None]]
    ) -> None:
        """One ephemeral pull consumer from ``expected[0]`` on, until it is lost."""
        nc = self._nc
        inbox = nc.new_inbox()
        try:
            sub = await nc.subscribe(inbox)
        except _NATS_ERRORS as exc:
            raise _translate(exc, f"tailing {self.stream}") from exc
        consumer: str | None = None
        try:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=expected[0],
                ack_policy=api.AckPolicy.NONE,
                filter_subject=self.subject,
                replay_policy=api.ReplayPolicy.INSTANT,
                mem_storage=True,
                num_replicas=1,
                inactive_threshold=_INACTIVE,
            )
            info = await self._call("tailing", self.js.add_consumer(self.stream, config))
            consumer = str(info.name)
            pull = json.dumps(
                {
                    "batch": _BATCH,
                    "expires": int(_EXPIRES * 1e9),
                    "idle_heartbeat": int(_HEARTBEAT * 1e9),
                }
            ).encode()
            next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{consumer}"
            while True:
                check_cancelled()
                try:
                    await nc.publish(next_subject, pull, reply=inbox)
                except _NATS_ERRORS as exc:
                    raise _translate(exc, f"tailing {self.stream}") from exc
                wanted = _BATCH
                while wanted:
                    msg = await self._next(sub)
                    check_cancelled()
                    headers = msg.headers or {}
                    status = headers.get("Status")
                    if status is not None:
                        if status == "100":  # idle heartbeat
                            continue
                        if status in ("404", "408"):  # the pull request ran out
                            break
                        raise _Restart(f"{status} {headers.get('Description', '')}")
                    wanted -= 1
                    try:
                        seq = int(msg.metadata.sequence.stream)
                    except Exception as exc:
                        raise _Restart(f"a message without stream metadata ({exc})") from exc
                    if seq < expected[0]:
                        continue  # a repeat
                    if seq > expected[0]:
                        await self._check_start(expected[0])  # purged: TailEnd
                        raise _Restart(f"entry {seq} came, {expected[0]} was next")
                    me = asyncio.current_task()
                    self._in_entry.add(me)
                    try:
                        await on_entry(seq, msg.data)
                    finally:
                        self._in_entry.discard(me)
                    expected[0] = seq + 1
                    if self._nudged.is_set():  # nudged while applying it
                        raise _Restart("the stream has a new leader")
        finally:
            try:
                await sub.unsubscribe()
            except _NATS_ERRORS:
                pass
            if consumer is not None and not cancelling():
                try:
                    async with asyncio.timeout(1.0):
                        await self.js.delete_consumer(self.stream, consumer)
                except _NATS_ERRORS:
                    pass  # it goes by itself after _INACTIVE

    async def _next(self, sub: Any) -> Msg:
        try:
            msg: Msg = await sub.next_msg(timeout=_STALE)
        except nats.errors.TimeoutError as exc:
            raise _Restart(f"no word from the consumer for {_STALE:.0f} s") from exc
        except _NATS_ERRORS as exc:
            raise _translate(exc, f"tailing {self.stream}") from exc
        return msg
