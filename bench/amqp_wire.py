"""The AMQP load generator's client: pamqp frames over a raw asyncio Protocol, built for speed.

aio-pika saturates a CPU near 8k msg/s here, slower than the brokers it would measure, so the
AMQP scenarios (:mod:`bench.amqp`) also drive them with this. It is as little AMQP 0-9-1 as
:mod:`bench.amqp_load` needs, and no more:

- every frame we send is marshalled by pamqp; a publish (Basic.Publish + content header +
  body) is marshalled once into a bytes template and written ``batch`` at a time;
- received bytes are walked frame by frame with the 7-byte frame header only: a
  Basic.Deliver bumps a counter and remembers its delivery tag, a Basic.Ack / Basic.Nack from
  the broker (publisher confirms) moves the confirmed tag, content header and body frames are
  skipped; anything else (replies to our requests, Connection.Close / Channel.Close) is
  unmarshalled by pamqp and handed to whoever waits for it;
- writing waits only when the transport asks it to (``pause_writing``: the broker stopped
  reading).

One connection has one channel (number 1). Heart-beats are turned off (runs are short).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header
from pamqp.base import Frame

from .harness import BenchError

__all__ = ["AmqpError", "Link", "open_link", "publish_template"]

_DELIVER = b"\x00\x3c\x00\x3c"  # Basic.Deliver (class 60, method 60)
_ACK = b"\x00\x3c\x00\x50"  # Basic.Ack (60, 80)
_NACK = b"\x00\x3c\x00\x78"  # Basic.Nack (60, 120)
_FRAME_END = 0xCE
CHANNEL = 1


class AmqpError(BenchError):
    """The broker closed the connection or the channel, or sent what we cannot read."""


def publish_template(exchange: str, routing_key: str, body: bytes, persistent: bool) -> bytes:
    """One Basic.Publish with its content header and body, marshalled once."""
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    return b"".join(
        (
            frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), 1),
            frame.marshal(header.ContentHeader(0, len(body), props), CHANNEL),
            frame.marshal(pbody.ContentBody(body), CHANNEL),
        )
    )


def method_bytes(method: Frame, channel: int = CHANNEL) -> bytes:
    return frame.marshal(method, channel)


class Link(asyncio.Protocol):
    """One AMQP connection with channel 1 open."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiters: collections.deque[asyncio.Future[Frame]] = collections.deque()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: BaseException | None = None
        # deliveries: their count and the last delivery tag; the callback sees each chunk
        self.delivered = 0
        self.last_tag = 0
        self.on_deliveries: Callable[[int, int], None] | None = None
        # publisher confirms: the highest tag confirmed with every earlier one (and the
        # tags confirmed above it, out of order)
        self.confirmed = 0
        self._above: set[int] = set()
        self.nacked = 0
        self.on_confirm: Callable[[int], None] | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=256 * 1024)  # type: ignore[union-attr]

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(self.error or AmqpError(f"the broker closed the connection ({exc})"))
        self._can_write.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, n = 0, len(buf)
        deliveries = 0
        last_tag = self.last_tag
        confirmed = self.confirmed
        while n - pos >= 8:
            size = int.from_bytes(buf[pos + 3 : pos + 7], "big")
            end = pos + 7 + size
            if end >= n:
                break
            if buf[pos] == 1:  # a method frame
                cm = buf[pos + 7 : pos + 11]
                if cm == _DELIVER:
                    at = pos + 12 + buf[pos + 11]  # after the consumer tag (a short string)
                    last_tag = int.from_bytes(buf[at : at + 8], "big")
                    deliveries += 1
                elif cm == _ACK or cm == _NACK:
                    tag = int.from_bytes(buf[pos + 11 : pos + 19], "big")
                    if cm == _NACK:
                        self.nacked += 1
                    if buf[pos + 19] & 1:  # multiple: every tag up to this one
                        if tag > confirmed:
                            confirmed = tag
                            above = self._above
                            if above:
                                self._above = {t for t in above if t > tag}
                    elif tag == confirmed + 1:
                        confirmed = tag
                    elif tag > confirmed:
                        self._above.add(tag)  # a single confirm out of order
                    above = self._above
                    while above and confirmed + 1 in above:
                        confirmed += 1
                        above.discard(confirmed)
                else:
                    self._method(bytes(buf[pos : end + 1]))
            elif buf[pos] == 8:
                pass  # a heart-beat (we asked for none)
            pos = end + 1
        if pos:
            del buf[:pos]
        if deliveries:
            self.delivered += deliveries
            self.last_tag = last_tag
            if self.on_deliveries is not None:
                self.on_deliveries(deliveries, last_tag)
        if confirmed != self.confirmed:
            self.confirmed = confirmed
            if self.on_confirm is not None:
                self.on_confirm(confirmed)

    def _method(self, raw: bytes) -> None:
        try:
            _, _channel, value = frame.unmarshal(raw)
        except Exception as exc:
            self._abort(AmqpError(f"cannot read a frame from the broker: {exc}"))
            return
        if isinstance(value, commands.Connection.Close | commands.Channel.Close):
            what = "connection" if isinstance(value, commands.Connection.Close) else "channel"
            self._abort(
                AmqpError(f"the broker closed the {what}: {value.reply_code} {value.reply_text}")
            )
            return
        if self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(value)  # type: ignore[arg-type]

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def _abort(self, exc: BaseException) -> None:
        self._fail(exc)
        if self.transport is not None:
            self.transport.abort()

    # ---- sending -----------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if not self._can_write.is_set():
            await self._can_write.wait()
        if self.error is not None:
            raise self.error

    async def send(self, data: bytes) -> None:
        self.write(data)
        await self.drain()

    async def rpc(self, method: Frame, expect: type[Frame], timeout: float = 30.0) -> Any:
        """Send ``method`` on channel 1 (0 for Connection.*) and wait for its reply."""
        return await self.call(method_bytes(method, _channel_of(method)), expect, timeout)

    async def call(self, data: bytes, expect: type[Frame], timeout: float = 30.0) -> Any:
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.write(data)
        return await self._expect(fut, expect, timeout)

    async def expect(self, expect: type[Frame], timeout: float = 30.0) -> Any:
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return await self._expect(fut, expect, timeout)

    async def _expect(self, fut: asyncio.Future[Frame], expect: type[Frame], timeout: float) -> Any:
        if self.error is not None and not fut.done():
            raise self.error
        try:
            value = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise AmqpError(f"no {expect.__name__} from the broker within {timeout:g}s") from None
        if not isinstance(value, expect):
            raise AmqpError(f"expected {expect.__name__}, got {type(value).__name__}")
        return value

    # ---- channel 1 conveniences ----------------------------------------------------------------
    async def declare_queue(
        self, name: str, *, durable: bool = False, passive: bool = False
    ) -> Any:
        return await self.rpc(
            commands.Queue.Declare(queue=name, durable=durable, passive=passive),
            commands.Queue.DeclareOk,
        )

    async def purge(self, name: str) -> int:
        ok = await self.rpc(commands.Queue.Purge(queue=name), commands.Queue.PurgeOk)
        return int(ok.message_count)

    async def confirm_select(self) -> None:
        await self.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)

    async def qos(self, prefetch: int) -> None:
        await self.rpc(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)

    async def consume(self, queue: str, *, no_ack: bool, tag: str = "bench") -> None:
        await self.rpc(
            commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack),
            commands.Basic.ConsumeOk,
        )

    def ack_bytes(self, tag: int, multiple: bool = True) -> bytes:
        return method_bytes(commands.Basic.Ack(delivery_tag=tag, multiple=multiple))

    async def close(self) -> None:
        """Connection.Close and wait (briefly) for CloseOk; then the socket."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.error is None:
            try:
                await self.call(
                    method_bytes(commands.Connection.Close(reply_code=200), 0),
                    commands.Connection.CloseOk,
                    timeout=5,
                )
            except Exception:
                pass
        self.transport.close()


def _channel_of(method: Frame) -> int:
    return 0 if method.name.startswith("Connection.") else CHANNEL


async def open_link(params: dict[str, Any], timeout: float = 15.0) -> Link:
    """Connect, log in (PLAIN), open channel 1. ``params``: host, port, user, password,
    vhost."""
    loop = asyncio.get_running_loop()
    try:
        _, link = await asyncio.wait_for(
            loop.create_connection(Link, params["host"], params["port"]), timeout
        )
    except (OSError, TimeoutError) as exc:
        raise AmqpError(f"cannot connect to {params['host']}:{params['port']}: {exc}") from exc
    link.write(header.ProtocolHeader().marshal())
    await link.expect(commands.Connection.Start, timeout)
    user, password = params.get("user", "guest"), params.get("password", "guest")
    start_ok = commands.Connection.StartOk(
        client_properties={"product": "polymq-bench", "capabilities": {"publisher_confirms": True}},
        mechanism="PLAIN",
        response=f"\0{user}\0{password}",
        locale="en_US",
    )
    tune = await link.call(method_bytes(start_ok, 0), commands.Connection.Tune, timeout)
    link.write(
        method_bytes(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max or 2047, frame_max=tune.frame_max, heartbeat=0
            ),
            0,
        )
    )
    vhost = params.get("vhost", "/")
    await link.rpc(commands.Connection.Open(virtual_host=vhost), commands.Connection.OpenOk)
    await link.rpc(commands.Channel.Open(), commands.Channel.OpenOk)
    return link
