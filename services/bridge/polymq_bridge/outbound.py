"""polymq -> RabbitMQ: a polymq queue or stream, forwarded to an exchange at least once.

A session subscribes to the source with ``client-individual`` acks and the link's prefetch,
so at most ``prefetch`` messages are in flight. Each delivery is published on a channel in
confirm mode; the polymq delivery is acknowledged only when RabbitMQ's basic.ack for it
arrives. A basic.nack, a publish that fails or is not confirmed within
``bridge_publish_timeout``, or either connection going away ends the session: the
subscription ends with it and the core puts every unacknowledged delivery back in the queue
(a message RabbitMQ did take but whose confirm was lost is sent again: a duplicate, never a
loss). A message RabbitMQ cannot route (no queue bound: basic.return, as the link publishes
with ``mandatory``) is, by the link's ``on_unroutable``: ``retry`` (the default) left in polymq
while the session ends and the link retries with backoff until RabbitMQ can route it (a
binding appears); ``reject`` nacked without requeue (the core dead-letters it if the queue has
a dead-letter destination; a stream link skips it); ``drop``: published without mandatory,
RabbitMQ drops it, as it does for any client that does not ask.

A stream is never consumed, so its progress is the bridge's: the highest sequence confirmed
together with every earlier one, kept in the core's key/value store under
``polymq-bridge/<link>/offset`` (every second while it moves, and when a session ends). A new
session resumes after it; the configured ``offset`` applies only to a link's first session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, ExchangeType
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import DeliveryError

from polymq import Client, Delivery, Subscription
from polymq.answers import DestinationStats, QueueStats, StreamStats
from polymq.errors import NotFound
from polymq.tasks import check_cancelled

from .config import OutboundLink
from .link import Contiguous, LinkRunner, SessionEnded, describe
from .props import to_amqp
from .side import Attachment

__all__ = ["OutboundRunner", "StreamProgress"]

StreamProgress = Contiguous  # a stream link's progress: entries in delivery order

log = logging.getLogger(__name__)

_SAVE_INTERVAL = 1.0  # seconds between writes of a stream link's progress


class OutboundRunner(LinkRunner):
    config: OutboundLink
    _inflight: dict[int, asyncio.Task[Any]]  # delivery tag -> its publish, this session
    _publishes: set[asyncio.Future[Any]]  # aio-pika publishes not finished yet, any session

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inflight = {}
        self._publishes = set()

    def _publish_done(self, fut: asyncio.Future[Any]) -> None:
        self._publishes.discard(fut)
        if not fut.cancelled():
            fut.exception()  # retrieved: a publish given up on may fail as its channel closes

    async def stop(self) -> None:
        await super().stop()
        # what is left belongs to channels that are closed or closing: cancelling is safe now
        for fut in list(self._publishes):
            fut.cancel()

    def describe_route(self) -> str:
        c = self.config
        ex = c.exchange or "(default exchange)"
        return f"polymq {c.source} -> RabbitMQ {ex} with routing key {c.routing_key!r}"

    async def _session(
        self, core: Attachment[Client], rabbit: Attachment[AbstractConnection]
    ) -> None:
        c = self.config
        client = core.conn
        channel = await rabbit.conn.channel(publisher_confirms=True)
        channel.close_callbacks.add(self.channel_closed())
        progress: StreamProgress | None = None
        sub: Subscription | None = None
        self._inflight = {}
        try:
            exchange = await self._exchange(channel)
            options: dict[str, Any] = {"ack_mode": "client-individual", "prefetch": c.prefetch}
            if c.is_stream:
                progress, offset = await self._start(client)
                options["offset"] = offset
            sub = await client.subscribe(c.source, **options)
            self.started()
            pump = self.spawn(self._pump(sub, exchange, progress), "pump")
            helpers = [pump, self.spawn(self._sample(client, progress), "stats")]
            await self.until_ended(core, rabbit, [pump])
            # a graceful stop: take nothing more, let what is in flight be confirmed
            pump.cancel()
            for h in helpers:
                h.cancel()
            await self._drain()
        finally:
            await self._finish(core, sub, progress)
            await self.close_channel(channel, rabbit)

    async def _exchange(self, channel: AbstractChannel) -> AbstractExchange:
        c = self.config
        if not c.exchange:
            return channel.default_exchange
        if c.exchange_type is not None:
            return await channel.declare_exchange(
                c.exchange, ExchangeType(c.exchange_type), durable=True
            )
        try:
            return await channel.get_exchange(c.exchange, ensure=True)
        except Exception as exc:
            self.metrics.error("source_failed")
            raise SessionEnded(
                f"RabbitMQ has no exchange {c.exchange!r} ({describe(exc)}); declare it or "
                'set "exchange_type" in the link to let the bridge declare it'
            ) from exc

    async def _start(self, client: Client) -> tuple[StreamProgress, int | str | float]:
        """Where a stream session starts: after the saved progress, else the configured
        offset (made a sequence number and saved at once where it can be)."""
        c = self.config
        try:
            raw = await client.kv_get(c.offset_key)
        except NotFound:
            raw = None
        if raw is not None:
            committed = int(raw.decode())
            self.metrics.offset.set(committed)
            return StreamProgress(committed), committed + 1
        offset = c.offset
        if offset in ("next", "last"):
            last: int | None = None  # (None: no such stream yet, or an empty one)
            with contextlib.suppress(NotFound):
                stats = await client.stats(c.source)
                last = stats.last_seq if isinstance(stats, StreamStats) else None
            if last is not None:
                offset = last + 1 if offset == "next" else last
            else:
                offset = "first"  # empty: the first entry to come is next and last
        if isinstance(offset, int):
            committed = max(0, offset - 1)
            await client.kv_put(c.offset_key, str(committed).encode())
            return StreamProgress(committed), offset
        return StreamProgress(0), offset

    async def _pump(
        self, sub: Subscription, exchange: AbstractExchange, progress: StreamProgress | None
    ) -> None:
        c = self.config
        m = self.metrics
        loop = asyncio.get_running_loop()
        async for delivery in sub:
            msg = delivery.message
            if msg.redelivered:
                m.redelivered.inc()
            if progress is not None:
                progress.taken(msg.seq)
            amqp = to_amqp(msg, time.time())
            # Never cancelled: aiormq's channel reader dies on a basic.return for a publish
            # whose confirm was cancelled (InvalidStateError), after which the channel cannot
            # even close. A publish given up on (the session ended, a timeout) is left to
            # finish when its confirm arrives or its channel closes; its result is ignored.
            pub = loop.create_task(exchange.publish(amqp, c.routing_key, mandatory=c.mandatory))
            self._publishes.add(pub)
            pub.add_done_callback(self._publish_done)
            task = loop.create_task(self._forward(delivery, pub, progress))
            self._inflight[delivery.tag] = task
            m.in_flight.set(len(self._inflight))

    async def _forward(
        self, delivery: Delivery, pub: asyncio.Task[Any], progress: StreamProgress | None
    ) -> None:
        """Settle ``delivery`` by the outcome of its publish (waited for, never cancelled)."""
        m = self.metrics
        done, _ = await asyncio.wait({pub}, timeout=self.settings.bridge_publish_timeout)
        try:
            if not done:
                raise TimeoutError
            result = pub.result()
        except DeliveryError as exc:
            m.error("rabbitmq_nack")
            self.fail(f"RabbitMQ refused a message (basic.nack): {describe(exc)}")
            return
        except TimeoutError:
            m.error("publish_failed")
            self.fail(
                f"RabbitMQ did not confirm a publish within "
                f"{self.settings.bridge_publish_timeout:g}s"
            )
            return
        except Exception as exc:
            m.error("publish_failed")
            self.fail(f"publishing to RabbitMQ failed: {describe(exc)}")
            return
        else:
            self._inflight.pop(delivery.tag, None)
            m.in_flight.set(len(self._inflight))
        if isinstance(result, DeliveredMessage):  # basic.return: RabbitMQ could not route it
            m.error("unroutable")
            c = self.config
            why = (
                f"RabbitMQ could not route message {delivery.message.id} to exchange "
                f"{c.exchange or '(default)'!r} with routing key {c.routing_key!r} "
                f"({getattr(result.delivery, 'reply_text', 'NO_ROUTE')})"
            )
            if c.on_unroutable == "retry":
                self.fail(f"{why}; it stays in polymq until RabbitMQ can route it")
                return
            if progress is None:
                delivery.nack(requeue=False)
            else:
                progress.confirmed(delivery.message.seq)
            log.warning(
                "bridge: link %s: %s; %s",
                self.name,
                why,
                "skipped" if progress is not None else "nacked without requeue",
            )
            return
        delivery.ack()
        m.moved.inc()
        m.bytes.inc(len(delivery.message.body))
        if progress is not None:
            progress.confirmed(delivery.message.seq)

    async def _drain(self) -> None:
        """Wait up to ``bridge_stop_grace`` for in-flight publishes to be confirmed."""
        inflight = list(self._inflight.values())
        if not inflight:
            return
        log.info("bridge: link %s: waiting for %d confirms", self.name, len(inflight))
        _, pending = await asyncio.wait(inflight, timeout=self.settings.bridge_stop_grace)
        if pending:
            log.warning(
                "bridge: link %s: %d messages unconfirmed at stop go back to the source",
                self.name,
                len(pending),
            )

    async def _finish(
        self, core: Attachment[Client], sub: Subscription | None, progress: StreamProgress | None
    ) -> None:
        """Give back what is unconfirmed (ending the subscription does it), save progress."""
        inflight, self._inflight = list(self._inflight.values()), {}
        for task in inflight:
            task.cancel()
        if inflight:  # let aio-pika unwind each publish before the channel is closed
            await asyncio.wait(inflight, timeout=5)
        if not core.alive:
            return
        if sub is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sub.unsubscribe(), 5)
        if progress is not None:
            with contextlib.suppress(Exception):
                await self._save(core.conn, progress)

    async def _save(self, client: Client, progress: StreamProgress) -> None:
        committed = progress.committed
        if committed != progress.saved:
            await client.kv_put(self.config.offset_key, str(committed).encode())
            progress.saved = committed
        self.metrics.offset.set(committed)

    async def _sample(self, client: Client, progress: StreamProgress | None) -> None:
        """Lag every ``bridge_stats_interval`` (and a stream's progress every second)."""
        c = self.config
        interval = self.settings.bridge_stats_interval
        next_stats = 0.0
        while True:
            check_cancelled()
            now = time.monotonic()
            if progress is not None:
                await self._save(client, progress)
            if now >= next_stats:
                next_stats = now + interval
                try:
                    stats = await asyncio.wait_for(client.stats(c.source), 5)
                except NotFound:
                    self.metrics.lag.set(0)  # no source: nothing waits
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.debug("bridge: link %s: stats failed: %s", self.name, exc)
                else:
                    self.metrics.lag.set(_lag(stats, progress))
            await asyncio.sleep(min(interval, _SAVE_INTERVAL) if progress else interval)


def _lag(stats: DestinationStats, progress: StreamProgress | None) -> int:
    """What the source holds that the link has not sent: a queue's messages, or a stream's
    entries after the last one ``progress`` committed."""
    if progress is None:
        return stats.messages if isinstance(stats, QueueStats | StreamStats) else 0
    last = stats.last_seq if isinstance(stats, StreamStats) else None
    return max(0, (last or progress.committed) - progress.committed)
