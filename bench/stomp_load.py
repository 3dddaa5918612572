"""An asyncio STOMP load generator, faster than the brokers it measures.

stomp.py saturates a core at ~20k msg/s, slower than the brokers, so the STOMP scenarios
(:mod:`bench.stomp`) drive them with this instead:

- frames are bytes templates built once (:mod:`bench.stomp_wire`); a producer writes
  ``batch`` SENDs per ``write`` (pipelined, no receipt per SEND) and waits only when the
  transport asks it to (``pause_writing``: the broker stopped reading);
- received bytes are scanned, not parsed: the generator's bodies never contain NUL, so every
  NUL ends a frame, and a chunk whose NUL count equals its ``MESSAGE`` count holds nothing but
  whole MESSAGE frames (``Scanner``, ``bytes.count`` / ``bytes.find``); anything else
  (CONNECTED, RECEIPT, ERROR) takes a slow path that splits frames one by one;
- the producer stays at most ``window`` messages ahead of the consumer (``progress``, a
  shared counter the consumer process bumps): the figure is what a broker sustains, not how
  fast it buffers a backlog it then drains (or pages out) at another rate;
- ``ack: client`` subscriptions are acknowledged cumulatively: one ACK naming the last
  message of a chunk once ``ack_every`` messages are unacknowledged;
- TCP uses an :class:`asyncio.Protocol`; WebSocket uses aiohttp's client with the
  ``v12.stomp`` subprotocol and one STOMP frame per WebSocket message (what stompjs sends
  and every STOMP-over-WebSocket server accepts; ``ws_frames_per_message`` batches more).

Workers, each run in its own process by :class:`bench.harness.Worker` (``params`` carry the
endpoint: ``transport`` tcp|ws, ``host``, ``port``, ``path``, ``login``, ``passcode``,
``vhost``, ``ws_opcode`` text|binary): :func:`producer`, :func:`consumer` (one or more
connections, each with one subscription), :func:`rate_producer` (a fixed rate, a timestamp
in each body) and :func:`latency_consumer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from .harness import BenchError
from .native import _await_counters, _Counter
from .stomp_wire import BODY, Link, StompError, bodies, close_link, open_link, send_frame

__all__ = ["consumer", "latency_consumer", "producer", "rate_producer"]


def now() -> float:
    return time.monotonic()


# =========================================================================================
# workers (each runs in its own process)
# =========================================================================================
async def producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Pipelined SENDs of one constant frame, ``batch`` per write, until ``count`` messages
    or ``seconds``; then DISCONNECT with a receipt (the broker has handled every SEND)."""
    link = await open_link(params)
    try:
        persistent = params.get("persistent")
        one = send_frame(params["destination"], BODY, persistent)
        batch, count = params["batch"], params["count"]
        frames = [one] * batch
        blob = one * batch
        ch.send(ready=True, frame_bytes=len(one))
        await ch.recv()  # go
        cpu0 = time.process_time()
        sent = 0
        t0 = now()
        stop_at = t0 + params["seconds"]
        progress, window = params.get("progress"), params.get("window") or 0
        subs = params.get("connections", 1)
        waited = 0.0
        while sent < count - 1:
            k = min(batch, count - 1 - sent)
            if k == batch:
                await link.send(frames, blob)
            else:
                await link.send(frames[:k])
            sent += k
            if now() >= stop_at:
                break
            if progress is not None and window and sent - progress.value // subs > window:
                # Wait until the consumer is within half a window. Another process bumps the
                # counter, so this polls shared memory (no Event to await) every 2 ms: libuv
                # timers have 1 ms granularity and a shorter sleep would spin.
                w0 = now()
                low = window // 2
                while sent - progress.value // subs > low and now() < stop_at:  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
                waited += now() - w0
            else:
                await asyncio.sleep(0)  # let ERROR frames and the pipe in
        # the last SEND asks for a RECEIPT: once it comes, the broker has handled them all
        rid, fut = link.next_receipt()
        await link.send([send_frame(params["destination"], BODY, persistent, rid)])
        sent += 1
        t_sent = now()
        await link.wait_receipt(fut, "the last SEND", params.get("timeout", 60))
        return {
            "sent": sent,
            "t_first": t0,
            "t_sent": t_sent,
            "t_handled": now(),
            "cpu_seconds": time.process_time() - cpu0,
            "window_wait_seconds": waited,
        }
    finally:
        await close_link(link)


def _ack_frame(link: Link, chunk: bytes, sub_id: str) -> bytes:
    """A cumulative ACK naming the last message of ``chunk`` (``ack`` header in STOMP 1.2,
    ``message-id`` + ``subscription`` before)."""
    if link.version == "1.2":
        i = chunk.rfind(b"\nack:")
        if i >= 0:
            j = chunk.find(b"\n", i + 5)
            return b"ACK\nid:" + chunk[i + 5 : j] + b"\n\n\0"
    i = chunk.rfind(b"\nmessage-id:")
    if i < 0:
        raise StompError("a MESSAGE without an ack or message-id header")
    j = chunk.find(b"\n", i + 12)
    sub = sub_id.encode()
    return b"ACK\nmessage-id:" + chunk[i + 12 : j] + b"\nsubscription:" + sub + b"\n\n\0"


class _Sub:
    """One subscription's counting and cumulative acknowledgement."""

    __slots__ = (
        "ack_client",
        "ack_every",
        "counter",
        "last_chunk",
        "link",
        "on_bodies",
        "progress",
        "unacked",
    )

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.progress = params.get("progress")  # deliveries, shared with the producer
        self.ack_client = params["ack"] == "client"
        self.ack_every = max(1, params.get("ack_every") or params.get("prefetch", 1000) // 2)
        self.counter = _Counter()
        self.unacked = 0
        self.last_chunk = b""
        self.link: Link | None = None
        self.on_bodies: Callable[[int, bytes], None] | None = None

    def on_chunk(self, n: int, chunk: bytes) -> None:
        counter = self.counter
        t = time.monotonic()
        if self.on_bodies is not None:
            self.on_bodies(n, chunk)
        if counter.got == 0:
            counter.first = t
        counter.got += n
        counter.last = t
        if self.progress is not None:
            self.progress.value += n
        if self.ack_client:
            self.unacked += n
            if self.unacked >= self.ack_every or counter.got >= counter.target:
                assert self.link is not None
                self.link.queue_ack(_ack_frame(self.link, chunk, "0"))
                self.unacked = 0
            else:
                self.last_chunk = chunk
        if counter.got >= counter.target:
            counter.done.set()

    async def close(self) -> None:
        """Acknowledge what is left (an earlier run's leftovers must not be redelivered to
        the next), DISCONNECT, close."""
        link = self.link
        if link is None:
            return
        if self.unacked and link.scanner.error is None:
            with contextlib.suppress(Exception):
                await link.send([_ack_frame(link, self.last_chunk, "0")])
        await close_link(link)

    async def open(self, params: Mapping[str, Any]) -> None:
        self.link = link = await open_link(params, self.on_chunk)
        headers = {"id": "0", "destination": params["destination"], "ack": params["ack"]}
        if self.ack_client and params.get("prefetch"):
            headers["prefetch-count"] = str(params["prefetch"])
        await link.request("SUBSCRIBE", headers)  # the subscription is live at the broker


async def _quiet(subs: list[_Sub], quiet: float) -> int:
    """Wait until no message has arrived for ``quiet`` seconds (leftovers of an earlier run
    in a broker's durable queue); returns how many came, and zeroes the counters."""
    if quiet <= 0:
        return 0
    deadline = now() + 30
    while now() < deadline:
        before = sum(s.counter.got for s in subs)
        await asyncio.sleep(quiet)
        if sum(s.counter.got for s in subs) == before:
            break
    stale = sum(s.counter.got for s in subs)
    for s in subs:
        c = s.counter
        c.got, c.first, c.last = 0, 0.0, 0.0
        if s.progress is not None:
            s.progress.value = 0
    return stale


async def consumer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """``connections`` connections with one subscription each (``ack`` auto|client, client
    acknowledged cumulatively every ``ack_every``); counts until told how many to expect."""
    subs = [_Sub(params) for _ in range(params.get("connections", 1))]
    try:
        await asyncio.gather(*(s.open(params) for s in subs))
        stale = await _quiet(subs, params.get("quiet", 0.0))
        watch = [asyncio.ensure_future(_watch(s.link)) for s in subs if s.link is not None]
        ch.send(ready=True, stale=stale)
        counters = [s.counter for s in subs]
        result = await _await_counters(ch, counters, watch, params["timeout"])
        result["stale"] = stale
        result["ws_messages"] = sum(getattr(s.link, "ws_messages", 0) for s in subs)
        return result
    finally:
        await asyncio.gather(*(s.close() for s in subs))


async def _watch(link: Link) -> None:
    """Ends with the broker's ERROR (or a lost connection) so a waiting consumer fails fast."""
    await asyncio.shield(link.closed)
    if link.scanner.error is not None:
        raise link.scanner.error


async def rate_producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """SENDs at ``rate`` msg/s for ``seconds``, each body ``%032d`` of ``monotonic_ns`` at
    the time it was written (checked every millisecond; late ticks catch up in one write)."""
    link = await open_link(params)
    try:
        rate, seconds = params["rate"], params["seconds"]
        dest = params["destination"]
        persistent = params.get("persistent")
        ch.send(ready=True)
        await ch.recv()  # go
        cpu0 = time.process_time()
        sent = 0
        t0 = now()
        total = int(rate * seconds)
        ns = time.monotonic_ns
        while sent < total - 1:
            due = min(total - 1, int((now() - t0) * rate) + 1) - sent
            if due > 0:
                frames = [send_frame(dest, b"%032d" % ns(), persistent) for _ in range(due)]
                await link.send(frames)
                sent += due
            await asyncio.sleep(0.001)
        rid, fut = link.next_receipt()
        await link.send([send_frame(dest, b"%032d" % ns(), persistent, rid)])
        sent += 1
        t_sent = now()
        await link.wait_receipt(fut, "the last SEND", 60)
        return {
            "sent": sent,
            "t_first": t0,
            "t_sent": t_sent,
            "achieved_rate": sent / (t_sent - t0),
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await close_link(link)


async def latency_consumer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """One subscription; for each message, now - the timestamp in its body."""
    sub = _Sub(params)
    latencies: list[int] = []
    ns = time.monotonic_ns

    def on_bodies(n: int, chunk: bytes) -> None:
        t = ns()
        for b in bodies(chunk):
            latencies.append(t - int(b))

    sub.on_bodies = on_bodies
    try:
        await sub.open(params)
        assert sub.link is not None
        stale = await _quiet([sub], params.get("quiet", 0.0))
        latencies.clear()
        ch.send(ready=True, stale=stale)
        watch = [asyncio.ensure_future(_watch(sub.link))]
        result = await _await_counters(ch, [sub.counter], watch, params["timeout"])
        lat = sorted(latencies[int(params.get("warmup_messages", 0)) :])
        if not lat:
            raise BenchError("no message arrived after the warm-up")

        def q(p: float) -> float:
            return lat[min(len(lat) - 1, int(len(lat) * p))] / 1e9

        result.update(
            stale=stale,
            measured=len(lat),
            latency_p50_s=q(0.50),
            latency_p90_s=q(0.90),
            latency_p99_s=q(0.99),
            latency_max_s=lat[-1] / 1e9,
            latency_mean_s=sum(lat) / len(lat) / 1e9,
        )
        return result
    finally:
        await sub.close()
