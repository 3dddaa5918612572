"""RabbitMQ -> polymq: a RabbitMQ queue, published into a polymq destination at least once.

A session consumes the queue with manual acks and ``basic.qos(prefetch)``, so at most
``prefetch`` messages are in flight. Messages that arrive together (in one loop iteration, up
to 1 MiB of bodies) are published into polymq as one batch, persistent when their delivery
mode says so (or always, with ``"persistent": "always"``); each is acknowledged to RabbitMQ
only after the core's receipt, which for persistent messages on a durable destination means
after they are on disk.

If the core refuses a batch for good (a body too large, ...), its messages are published one
by one and the ones refused are rejected without requeue (RabbitMQ dead-letters them if the
queue has a dead-letter exchange). Acknowledgements are ``basic.ack(multiple)`` up to the highest
delivery tag settled together with every earlier one, so a batch costs one frame. Any other
failure — the core unreachable, a full queue, no
receipt within ``bridge_publish_timeout`` — ends the session: the channel closes and
RabbitMQ requeues every unacknowledged message, to be delivered again in the next session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

import aiormq.abc
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)

from polymq import Client
from polymq.errors import BadRequest, ConnectionClosed, PayloadTooLarge, Unavailable
from polymq.tasks import check_cancelled
from polymq.types import Message, Outcome

from .config import InboundLink
from .link import Contiguous, LinkRunner, SessionEnded, describe
from .props import to_polymq
from .side import Attachment

__all__ = ["InboundRunner"]

log = logging.getLogger(__name__)

_BATCH_BYTES = 1024 * 1024  # body bytes that make a batch go out at once
_PERMANENT = (BadRequest, PayloadTooLarge)  # the core will never take this message

_Item = tuple[AbstractIncomingMessage, Message]


class InboundRunner(LinkRunner):
    config: InboundLink
    _session_no = 0
    _channel: aiormq.abc.AbstractChannel  # this session's, under aio-pika's

    def describe_route(self) -> str:
        c = self.config
        return f"RabbitMQ queue {c.queue!r} -> polymq {c.destination}"

    async def _session(
        self, core: Attachment[Client], rabbit: Attachment[AbstractConnection]
    ) -> None:
        c = self.config
        self._core = core
        self._batch: list[_Item] = []
        self._batch_bytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self._inflight = 0
        self._accepting = True
        self._idle = asyncio.Event()
        self._idle.set()
        channel = await rabbit.conn.channel(publisher_confirms=False)
        channel.close_callbacks.add(self.channel_closed())
        self._tags = Contiguous(0)  # delivery tags start at 1 on every channel
        self._acked = 0
        self._ops: deque[tuple[Outcome, int]] = deque()
        self._ops_ready = asyncio.Event()  # something to send
        self._ops_idle = asyncio.Event()  # nothing queued and nothing being sent
        self._ops_idle.set()
        try:
            self._channel = await channel.get_underlay_channel()
            await channel.set_qos(prefetch_count=c.prefetch)
            queue = await self._queue(channel)
            self._session_no += 1
            session_no = self._session_no

            async def on_message(message: AbstractIncomingMessage) -> None:
                if session_no == self._session_no:  # never a late one of an earlier channel
                    self._on_message(message)

            tag = await queue.consume(on_message, no_ack=False)
            self.started()
            self.spawn(self._sample(queue), "stats")
            self.spawn(self._acker(), "acker")
            await self.until_ended(core, rabbit)
            # a graceful stop: no more deliveries, let what is in flight get its receipt
            self._accepting = False
            cancel = self.spawn(queue.cancel(tag), "basic.cancel")  # never cut short
            await asyncio.wait({cancel}, timeout=5)
            self._flush()
            await self._drain()
            try:  # and let the acker send what they decided
                await asyncio.wait_for(self._ops_idle.wait(), self.settings.bridge_stop_grace)
            except TimeoutError:
                log.warning("bridge: link %s: acknowledgements not sent at stop", self.name)
        finally:
            self._accepting = False
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._batch = []
            # unacknowledged messages go back to the queue with the channel
            await self.close_channel(channel, rabbit)

    async def _queue(self, channel: AbstractChannel) -> AbstractQueue:
        c = self.config
        if c.declare:
            queue = await channel.declare_queue(c.queue, durable=True)
            for b in c.bindings:
                await queue.bind(b.exchange, b.routing_key)
            return queue
        try:
            return await channel.get_queue(c.queue, ensure=True)
        except Exception as exc:
            self.metrics.error("source_failed")
            raise SessionEnded(
                f"RabbitMQ has no queue {c.queue!r} ({describe(exc)}); declare it or set "
                '"declare": true in the link'
            ) from exc

    # ---- deliveries -> batches --------------------------------------------------------------
    def _on_message(self, message: AbstractIncomingMessage) -> None:
        if not self._accepting:
            return  # left unacknowledged: requeued when the channel closes
        if message.redelivered:
            self.metrics.redelivered.inc()
        self._tags.taken(message.delivery_tag or 0)
        msg = to_polymq(message, time.time(), always_persistent=self.config.always_persistent)
        self._batch.append((message, msg))
        self._batch_bytes += len(msg.body)
        self._inflight += 1
        self._idle.clear()
        self.metrics.in_flight.set(self._inflight)
        if self._batch_bytes >= _BATCH_BYTES:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            self.spawn(self._publish(batch), "publish")

    async def _publish(self, batch: list[_Item]) -> None:
        try:
            await self._send(batch)
        except _PERMANENT:
            if len(batch) > 1:  # one of them is refused: find it, the others go through
                for item in batch:
                    await self._publish([item])
                return
            message, msg = batch[0]
            self.metrics.error("rejected")
            log.error(
                "bridge: link %s: the core refused message %s from %r for good; rejected "
                "without requeue (RabbitMQ dead-letters it if the queue has a dead-letter "
                "exchange)",
                self.name,
                message.message_id or message.delivery_tag,
                self.config.queue,
                exc_info=True,
            )
            tag = message.delivery_tag or 0
            self._settle(Outcome.REJECT, tag)  # queued before any ack that covers it
            self._tags.confirmed(tag)
            self._settled(1)
            return
        except asyncio.CancelledError:
            raise
        except (ConnectionClosed, Unavailable) as exc:
            self.core.report_lost(self._core, describe(exc))
            self.fail(f"lost the core while publishing: {describe(exc)}")
            return
        except TimeoutError:
            self.metrics.error("publish_failed")
            self.fail(f"no receipt from the core within {self.settings.bridge_publish_timeout:g}s")
            return
        except Exception as exc:
            self.metrics.error("publish_failed")
            self.fail(f"the core refused a publish to {self.config.destination}: {describe(exc)}")
            return
        m = self.metrics
        tags = self._tags
        for message, msg in batch:
            tags.confirmed(message.delivery_tag or 0)
            m.moved.inc()
            m.bytes.inc(len(msg.body))
        # One basic.ack(multiple) for every delivery up to the highest tag whose earlier
        # ones are all settled; a later batch acknowledges what an earlier one could not.
        self._settle(Outcome.ACK, tags.committed)
        self._settled(len(batch))

    def _settle(self, outcome: Outcome, tag: int) -> None:
        """Queue a basic.ack (multiple, up to ``tag``) or basic.reject (not requeued: RabbitMQ
        dead-letters it, if the queue says where) for :meth:`_acker`."""
        ops = self._ops
        if outcome is Outcome.ACK:
            if tag <= self._acked:
                return
            self._acked = tag
            if ops and ops[-1][0] is Outcome.ACK:
                ops[-1] = (Outcome.ACK, tag)  # one frame acknowledges both
                return
        ops.append((outcome, tag))
        self._ops_idle.clear()
        self._ops_ready.set()

    async def _acker(self) -> None:
        """Sends acks and rejects one at a time, in the order they were decided: a multiple
        ack overtaking an earlier one (or a reject it covers) is a channel error."""
        ops = self._ops
        while True:
            await self._ops_ready.wait()
            self._ops_ready.clear()
            while ops:
                outcome, tag = ops.popleft()
                try:
                    if outcome is Outcome.ACK:
                        await self._channel.basic_ack(delivery_tag=tag, multiple=True)
                    else:
                        await self._channel.basic_reject(delivery_tag=tag, requeue=False)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the channel is gone: RabbitMQ requeues the rest
                    self.fail(f"cannot acknowledge to RabbitMQ: {describe(exc)}")
                    return
            self._ops_idle.set()

    async def _send(self, batch: list[_Item]) -> None:
        client = self._core.conn
        fut = client.publish_soon(self.config.destination, [msg for _, msg in batch])
        await asyncio.wait_for(fut, self.settings.bridge_publish_timeout)

    def _settled(self, n: int) -> None:
        self._inflight -= n
        self.metrics.in_flight.set(self._inflight)
        if self._inflight <= 0:
            self._idle.set()

    async def _drain(self) -> None:
        if self._inflight <= 0:
            return
        log.info("bridge: link %s: waiting for %d receipts", self.name, self._inflight)
        try:
            await asyncio.wait_for(self._idle.wait(), self.settings.bridge_stop_grace)
        except TimeoutError:
            log.warning(
                "bridge: link %s: %d messages without a receipt at stop go back to RabbitMQ",
                self.name,
                self._inflight,
            )

    async def _sample(self, queue: AbstractQueue) -> None:
        """RabbitMQ's count of ready messages (a passive declare) every stats interval."""
        while True:
            check_cancelled()
            try:
                ok: Any = await asyncio.wait_for(queue.declare(), 5)
                self.metrics.lag.set(ok.message_count)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("bridge: link %s: queue depth failed: %s", self.name, exc)
            await asyncio.sleep(self.settings.bridge_stats_interval)
