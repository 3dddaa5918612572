"""The ``cluster`` scenario's load: persistent messages with confirms, published and consumed
at once; and the failover prober. Each function runs in its own process
(:class:`bench.harness.Worker`, pinned to the load CPUs).

A cell is one producer process and one consumer process on the same node (``host``,
``port``), the queue durable and fresh (``queue``; ``x-queue-type: quorum`` over AMQP, which
polymq accepts too). The consumer subscribes first (prefetch ``prefetch``, manual acks, one
cumulative ack every ``ack_every`` deliveries) and says ``ready``; the producer says
``ready``, waits for ``go``, then publishes ``body_bytes`` persistent messages for
``seconds`` (or ``count``) with at most ``window`` unconfirmed, and ends when the last is
confirmed. The parent then tells the consumer how many to expect; it says ``measured`` at the
last delivery, deletes the queue and sends its result.

- ``native``: :class:`polymq.Client`; ``window / batch`` awaited ``publish(batch)`` calls in
  flight (each answers once its messages are committed: fsynced on one node, or on a
  majority of the shard's JetStream replicas in a cluster); ``subscribe(ack_mode=client)``.
- ``amqp``: the pamqp load generator (:mod:`bench.amqp_wire`): publisher confirms, publishes
  written ``batch`` at a time, at most ``window`` unconfirmed; ``basic.qos`` +
  ``basic.consume`` + ``basic.ack(multiple)``.

Confirm latency is per message: from the write (native: the call) of its batch to the
confirm that covers it; ``latency_p50_s`` / ``latency_p99_s`` weigh each batch by the
messages it confirmed.

:func:`failover_prober` publishes one persistent message every ``interval`` seconds, each
awaited apart (up to ``attempt_timeout``), reconnecting if its connection drops; told
``killed_at`` (a ``time.monotonic()``), it reports the first confirm of a publish begun after
it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Any

from pamqp import commands

from polymq import Client, Message

from .amqp_wire import AmqpError, Link, open_link, publish_template
from .harness import BenchError
from .native import _await_counters, _Counter

__all__ = [
    "amqp_consumer",
    "amqp_producer",
    "failover_prober",
    "native_consumer",
    "native_producer",
]


def now() -> float:
    return time.monotonic()


def _percentiles(samples: list[tuple[float, int]]) -> dict[str, float | None]:
    """p50 and p99 of latencies, each sample ``(seconds, messages it stands for)``."""
    total = sum(n for _, n in samples)
    out: dict[str, float | None] = {"latency_p50_s": None, "latency_p99_s": None}
    if not total:
        return out
    ordered = sorted(samples)
    for key, q in (("latency_p50_s", 0.5), ("latency_p99_s", 0.99)):
        want, seen = q * total, 0
        for lat, n in ordered:
            seen += n
            if seen >= want:
                out[key] = round(lat, 6)
                break
    return out


def _body(params: dict[str, Any]) -> bytes:
    return b"x" * int(params["body_bytes"])


# =========================================================================================
# native
# =========================================================================================
async def native_producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    client = await Client.connect(params["host"], params["port"])
    try:
        dest = f"queue/{params['queue']}"
        await client.declare(dest, durable=True)
        batch = int(params["batch"])
        inflight = max(1, int(params["window"]) // batch)
        count = int(params["count"])
        msgs = [Message(body=_body(params), persistent=True) for _ in range(batch)]
        samples: list[tuple[float, int]] = []
        started = confirmed = 0
        ch.send(ready=True)
        await ch.recv()  # go
        cpu0 = time.process_time()
        t0 = now()
        stop_at = t0 + float(params["seconds"])

        async def one() -> None:
            nonlocal started, confirmed
            while started < count and now() < stop_at:
                k = min(batch, count - started)
                started += k
                t = now()
                r = await client.publish(dest, msgs if k == batch else msgs[:k])
                samples.append((now() - t, k))
                if r.count != k:
                    raise BenchError(f"publish receipt counts {r.count}, not {k}")
                confirmed += k

        await asyncio.gather(*(one() for _ in range(inflight)))
        t_done = now()
        return {
            "sent": confirmed,
            "t_go": t0,
            "t_done": t_done,
            "cpu_seconds": time.process_time() - cpu0,
            **_percentiles(samples),
        }
    finally:
        await client.close()


async def _drain_acking(sub: Any, counter: _Counter, ack_every: int, last: list[Any]) -> None:
    clock = time.monotonic
    unacked = 0
    async for d in sub:
        if counter.got == 0:
            counter.first = clock()
        counter.got += 1
        counter.last = clock()
        unacked += 1
        last[0] = d
        if unacked >= ack_every or counter.got >= counter.target:
            d.ack()  # cumulative: ack_mode=client
            unacked = 0
        if counter.got >= counter.target:
            counter.done.set()
            return


async def native_consumer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    client = await Client.connect(params["host"], params["port"])
    try:
        dest = f"queue/{params['queue']}"
        await client.declare(dest, durable=True)
        sub = await client.subscribe(dest, ack_mode="client", prefetch=int(params["prefetch"]))
        counter = _Counter()
        last: list[Any] = [None]
        task = asyncio.ensure_future(_drain_acking(sub, counter, int(params["ack_every"]), last))
        ch.send(ready=True)
        r = await _await_counters(ch, [counter], [task], float(params["timeout"]))
        ch.send(measured=True)
        if last[0] is not None:
            last[0].ack()
        r["delete_error"] = None
        try:
            await asyncio.wait_for(client.delete(dest), 30)
        except Exception as exc:
            r["delete_error"] = f"{type(exc).__name__}: {exc}"
        return r
    finally:
        await client.close()


# =========================================================================================
# AMQP (the pamqp load generator)
# =========================================================================================
async def _declare(link: Link, queue: str) -> Any:
    return await link.rpc(
        commands.Queue.Declare(queue=queue, durable=True, arguments={"x-queue-type": "quorum"}),
        commands.Queue.DeclareOk,
    )


async def amqp_producer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    link = await open_link(params)
    try:
        queue = params["queue"]
        await _declare(link, queue)
        await link.confirm_select()
        tpl = publish_template("", queue, _body(params), True)
        batch, count = int(params["batch"]), int(params["count"])
        window = int(params["window"])
        blob = tpl * batch
        room = asyncio.Event()
        room.set()
        sent = 0
        # written batches not yet wholly confirmed: [first tag, last tag, time written]
        pending: collections.deque[list[Any]] = collections.deque()
        samples: list[tuple[float, int]] = []

        def on_confirm(confirmed: int) -> None:
            t = now()
            while pending and pending[0][0] <= confirmed:
                first, last_tag, tw = pending[0]
                hi = min(last_tag, confirmed)
                samples.append((t - tw, hi - first + 1))
                if hi == last_tag:
                    pending.popleft()
                else:
                    pending[0][0] = hi + 1
            if sent - confirmed <= window // 2:
                room.set()

        link.on_confirm = on_confirm
        ch.send(ready=True)
        await ch.recv()  # go
        cpu0 = time.process_time()
        t0 = now()
        stop_at = t0 + float(params["seconds"])
        while sent < count and now() < stop_at:
            k = min(batch, count - sent)
            pending.append([sent + 1, sent + k, now()])
            link.write(blob if k == batch else tpl * k)
            sent += k
            await link.drain()
            if sent - link.confirmed >= window:
                room.clear()
                await room.wait()
                if link.error is not None:
                    raise link.error
            else:
                await asyncio.sleep(0)
        deadline = now() + float(params["timeout"])
        while link.confirmed < sent:
            room.clear()
            if link.error is not None:
                raise link.error
            if now() > deadline:
                raise AmqpError(f"{link.confirmed} of {sent} publishes confirmed in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), 0.05)
        t_done = now()
        if link.nacked:
            raise AmqpError(f"the broker nacked {link.nacked} publishes")
        return {
            "sent": sent,
            "t_go": t0,
            "t_done": t_done,
            "cpu_seconds": time.process_time() - cpu0,
            **_percentiles(samples),
        }
    finally:
        await link.close()


async def amqp_consumer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    link = await open_link(params)
    try:
        queue = params["queue"]
        await _declare(link, queue)
        await link.qos(int(params["prefetch"]))
        ack_every = int(params["ack_every"])
        state = {"first": 0.0, "last": 0.0, "unacked": 0, "target": float("inf")}
        done = asyncio.Event()

        def on_deliveries(n: int, last_tag: int) -> None:
            t = now()
            if not state["first"]:
                state["first"] = t
            state["last"] = t
            state["unacked"] += n
            if state["unacked"] >= ack_every or link.delivered >= state["target"]:
                link.write(link.ack_bytes(last_tag, multiple=True))
                state["unacked"] = 0
            if link.delivered >= state["target"]:
                done.set()

        link.on_deliveries = on_deliveries
        await link.consume(queue, no_ack=False)
        ch.send(ready=True)
        cpu0 = time.process_time()
        expect = int((await ch.recv())["expect"])
        state["target"] = expect
        if link.delivered >= expect:
            done.set()
        closed: asyncio.Future[Any] = asyncio.ensure_future(asyncio.shield(link.closed))
        waiter: asyncio.Future[Any] = asyncio.ensure_future(done.wait())
        try:
            await asyncio.wait(
                {waiter, closed},
                timeout=float(params["timeout"]),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiter.cancel()
            closed.cancel()
        ch.send(measured=True)
        if link.error is not None:
            raise link.error
        if state["unacked"] and link.last_tag:
            link.write(link.ack_bytes(link.last_tag, multiple=True))
        out: dict[str, Any] = {
            "expect": expect,
            "complete": link.delivered >= expect,
            "got": [link.delivered],
            "t_first": state["first"] or None,
            "t_last": state["last"] or None,
            "cpu_seconds": time.process_time() - cpu0,
            "delete_error": None,
        }
        try:
            await link.rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        except Exception as exc:
            out["delete_error"] = f"{type(exc).__name__}: {exc}"
        return out
    finally:
        await link.close()


# =========================================================================================
# failover
# =========================================================================================
async def failover_prober(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    host, port = params["host"], int(params["port"])
    dest = f"queue/{params['queue']}"
    interval = float(params.get("interval", 0.02))
    attempt_timeout = float(params.get("attempt_timeout", 20.0))
    limit = float(params.get("limit", 60.0))
    batch = [Message(body=b"x" * 32, persistent=True)]
    client: Client | None = None
    reconnects = 0

    async def connect() -> Client:
        nonlocal client, reconnects
        while True:
            try:
                client = await asyncio.wait_for(Client.connect(host, port), 5)
                return client
            except Exception:
                reconnects += 1
                await asyncio.sleep(0.1)

    c = await connect()
    await c.declare(dest, durable=True)
    for _ in range(5):  # warm: the session's link to the leader is up
        await asyncio.wait_for(c.publish(dest, batch), attempt_timeout)

    attempts: list[list[Any]] = []  # [started, ended, outcome]
    killed_at: list[float | None] = [None]
    first: list[list[Any] | None] = [None]
    stop = asyncio.Event()
    found = asyncio.Event()

    async def one(cl: Client) -> None:
        rec: list[Any] = [now(), None, "pending"]
        attempts.append(rec)
        try:
            await asyncio.wait_for(cl.publish(dest, batch), attempt_timeout)
            rec[1], rec[2] = now(), "confirmed"
            k = killed_at[0]
            if k is not None and rec[0] >= k and first[0] is None:
                first[0] = rec
                found.set()
        except Exception as exc:
            rec[1], rec[2] = now(), f"{type(exc).__name__}: {exc}"[:160]

    async def control() -> None:
        while True:
            msg = await ch.recv()
            if "killed_at" in msg:
                killed_at[0] = float(msg["killed_at"])
            if msg.get("stop"):
                stop.set()
                return

    ctl = asyncio.ensure_future(control())
    tasks: set[asyncio.Task[None]] = set()
    ch.send(ready=True)
    reported = False
    try:
        while not stop.is_set():
            if c.closed:
                c = await connect()
            t = asyncio.ensure_future(one(c))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            await asyncio.sleep(interval)
            k = killed_at[0]
            if k is not None and not reported:
                if found.is_set() and first[0] is not None:
                    ch.send(recovered=True, first_start=first[0][0], first_end=first[0][1])
                    reported = True
                elif now() - k > limit:
                    ch.send(recovered=False)
                    reported = True
    finally:
        ctl.cancel()
        for t in list(tasks):
            t.cancel()
        with contextlib.suppress(Exception):
            await c.close()
    k = killed_at[0] or 0.0
    after = [a for a in attempts if a[0] >= k]
    any_confirm = min((a[1] for a in attempts if a[2] == "confirmed" and a[1] >= k), default=None)
    return {
        "attempts": len(attempts),
        "attempts_after_kill": len(after),
        "outcomes_after_kill": dict(collections.Counter(a[2] for a in after).most_common(6)),
        "first_confirm_of_any_publish": any_confirm,
        "reconnects": reconnects,
    }
