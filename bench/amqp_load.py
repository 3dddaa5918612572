"""The AMQP scenarios' load: the same three workloads with two clients, one process each.

Two workers, run by :class:`bench.harness.Worker` in their own processes pinned to the load
CPUs, one per client and broker, each running one measurement per command from the parent
(:func:`wire_worker`, :func:`pika_worker`). ``params`` carry the endpoint (``host``,
``port``, ``user``, ``password``, ``vhost``) and, per command, ``queue``, ``count``,
``seconds``:

- ``publish``: publish ``count`` messages (or for ``seconds``) of ``body_bytes`` to ``queue``
  through the default exchange, transient unless ``persistent``. With ``confirms`` the
  channel is in confirm mode and at most ``window`` messages are unconfirmed; the run ends
  when the last is confirmed. Without, the run ends when the broker answers a request sent
  after the last publish on the same channel (a passive queue.declare: the channel has
  handled every publish before it); then the worker also times how long until the queue
  holds them all (``enqueued_seconds``).
- ``consume``: ``basic.qos(prefetch)``, ``basic.consume`` with manual acks, one
  ``basic.ack(multiple)`` every ``ack_every`` deliveries; the run ends at the ``count``-th
  delivery (a ``fill`` command, the fast client publishing with confirms, filled the queue).

``wire`` is :mod:`bench.amqp_wire` (pamqp frames over raw asyncio: templates written in
batches, frames scanned, not parsed); ``pika`` is aio-pika as users write it (``await
exchange.publish`` in ``asyncio.gather`` batches, a consumer callback per message).
Each worker reports ``t_go``/``t_first``/``t_done`` (``time.monotonic``, one clock for every
process) and its own CPU seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .amqp_wire import AmqpError, Link, open_link, publish_template

__all__ = ["admin", "pika_worker", "wire_worker"]


def now() -> float:
    return time.monotonic()


def _body(params: dict[str, Any]) -> bytes:
    return b"x" * int(params.get("body_bytes", 32))


async def _until_enqueued(
    count_fn: Callable[[], Awaitable[int]], want: int, limit: float = 30.0
) -> float | None:
    """Seconds until the queue holds ``want`` messages (polled), or None."""
    t0 = now()
    while now() - t0 < limit:
        if await count_fn() >= want:
            return now() - t0
        await asyncio.sleep(0.005)
    return None


async def _published(
    params: dict[str, Any],
    ch: Any,
    sent: int,
    t0: float,
    cpu0: float,
    depth: Callable[[], Awaitable[int]] | None,
) -> dict[str, Any]:
    """The end of a publish run, whichever the client: the clock stops (and the parent stops
    measuring the broker); then, with ``depth`` (runs without confirms) and unless
    ``check_enqueued`` is false, how long until the queue held all ``sent``."""
    t_done = now()
    ch.send(measured=True)  # the parent stops measuring the broker here
    cpu = time.process_time() - cpu0
    enqueued = None
    if depth is not None and params.get("check_enqueued", True):
        enqueued = await _until_enqueued(depth, sent)
    return {
        "sent": sent,
        "t_go": t0,
        "t_done": t_done,
        "enqueued_seconds": None if enqueued is None else (t_done - t0) + enqueued,
        "cpu_seconds": cpu,
    }


# =========================================================================================
# pamqp frames over raw asyncio
# =========================================================================================
async def _wire_publish(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    link = await open_link(params)
    try:
        queue = params["queue"]
        await link.declare_queue(queue)
        if params.get("purge", True):
            await link.purge(queue)
        confirms = bool(params.get("confirms"))
        if confirms:
            await link.confirm_select()
        tpl = publish_template("", queue, _body(params), bool(params.get("persistent")))
        batch, count = int(params["batch"]), int(params["count"])
        window = int(params.get("window", 1000))
        blob = tpl * batch
        room = asyncio.Event()
        room.set()
        sent = 0

        def on_confirm(confirmed: int) -> None:
            if sent - confirmed <= window // 2:
                room.set()

        link.on_confirm = on_confirm
        ch.send(prepared=True)
        await ch.recv()  # go
        cpu0 = time.process_time()
        t0 = now()
        stop_at = t0 + float(params["seconds"])
        while sent < count and now() < stop_at:
            k = min(batch, count - sent)
            link.write(blob if k == batch else tpl * k)
            sent += k
            await link.drain()
            if confirms and sent - link.confirmed >= window:
                room.clear()
                await room.wait()
                if link.error is not None:
                    raise link.error
            else:
                await asyncio.sleep(0)
        if confirms:
            while link.confirmed < sent:
                room.clear()
                if link.error is not None:
                    raise link.error
                try:
                    await asyncio.wait_for(room.wait(), 0.05)
                except TimeoutError:
                    pass
            if link.nacked:
                raise AmqpError(f"the broker nacked {link.nacked} publishes")
        else:
            await link.declare_queue(queue, passive=True)  # after every publish before it

        async def depth() -> int:
            return int((await link.declare_queue(queue, passive=True)).message_count)

        return await _published(params, ch, sent, t0, cpu0, None if confirms else depth)
    finally:
        await link.close()


async def _wire_consume(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    link = await open_link(params)
    try:
        queue = params["queue"]
        ok = await link.declare_queue(queue)
        depth = int(ok.message_count)
        await link.qos(int(params.get("prefetch", 1000)))
        count = int(params["count"])
        ack_every = int(params.get("ack_every", 100))
        done = asyncio.Event()
        first = [0.0]
        unacked = [0]

        def on_deliveries(n: int, last_tag: int) -> None:
            if not first[0]:
                first[0] = now()
            unacked[0] += n
            if unacked[0] >= ack_every or link.delivered >= count:
                link.write(link.ack_bytes(last_tag, multiple=True))
                unacked[0] = 0
            if link.delivered >= count:
                done.set()

        link.on_deliveries = on_deliveries
        ch.send(prepared=True, depth=depth)
        await ch.recv()  # go
        cpu0 = time.process_time()
        t0 = now()
        await link.consume(queue, no_ack=False)
        closed: asyncio.Future[Any] = asyncio.ensure_future(asyncio.shield(link.closed))
        waiter: asyncio.Future[Any] = asyncio.ensure_future(done.wait())
        try:
            await asyncio.wait(
                {waiter, closed},
                timeout=float(params.get("timeout", 60)),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiter.cancel()
            closed.cancel()
        if link.error is not None:
            raise link.error
        t_done = now()
        ch.send(measured=True)  # the parent stops measuring the broker here
        if link.delivered < count:
            raise AmqpError(f"got {link.delivered} of {count} deliveries (queue held {depth})")
        return {
            "got": link.delivered,
            "depth": depth,
            "t_go": t0,
            "t_first": first[0],
            "t_done": t_done,
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await link.close()


# =========================================================================================
# aio-pika, as users write it
# =========================================================================================
def _url(params: dict[str, Any]) -> str:
    vhost = params.get("vhost", "/")
    vh = "" if vhost == "/" else vhost
    return (
        f"amqp://{params.get('user', 'guest')}:{params.get('password', 'guest')}"
        f"@{params['host']}:{params['port']}/{vh}"
    )


async def _pika_publish(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aio_pika

    conn = await aio_pika.connect(_url(params))
    try:
        confirms = bool(params.get("confirms"))
        chan = await conn.channel(publisher_confirms=confirms)
        queue = params["queue"]
        q = await chan.declare_queue(queue, durable=False)
        if params.get("purge", True):
            await q.purge()
        ex = chan.default_exchange
        body = _body(params)
        mode = (
            aio_pika.DeliveryMode.PERSISTENT
            if params.get("persistent")
            else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        # with confirms every publish awaits its own confirm: a batch is the window
        batch = int(params["window"] if confirms else params["batch"])
        count = int(params["count"])
        ch.send(prepared=True)
        await ch.recv()  # go
        cpu0 = time.process_time()
        t0 = now()
        stop_at = t0 + float(params["seconds"])
        sent = 0
        while sent < count and now() < stop_at:
            k = min(batch, count - sent)
            await asyncio.gather(
                *(
                    ex.publish(aio_pika.Message(body, delivery_mode=mode), routing_key=queue)
                    for _ in range(k)
                )
            )
            sent += k
        if not confirms:
            await chan.declare_queue(queue, passive=True)

        async def depth() -> int:
            d = await chan.declare_queue(queue, passive=True)
            return int(d.declaration_result.message_count or 0)

        return await _published(params, ch, sent, t0, cpu0, None if confirms else depth)
    finally:
        await conn.close()


async def _pika_consume(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aio_pika
    from aio_pika.abc import AbstractIncomingMessage

    conn = await aio_pika.connect(_url(params))
    try:
        chan = await conn.channel()
        await chan.set_qos(prefetch_count=int(params.get("prefetch", 1000)))
        queue = params["queue"]
        q = await chan.declare_queue(queue, durable=False)
        depth = int(q.declaration_result.message_count or 0)
        count = int(params["count"])
        ack_every = int(params.get("ack_every", 100))
        done = asyncio.Event()
        state = {"got": 0, "first": 0.0}

        async def on_message(m: AbstractIncomingMessage) -> None:
            if not state["first"]:
                state["first"] = now()
            state["got"] += 1
            got = int(state["got"])
            if got % ack_every == 0 or got >= count:
                await m.ack(multiple=True)
            if got >= count:
                done.set()

        ch.send(prepared=True, depth=depth)
        await ch.recv()  # go
        cpu0 = time.process_time()
        t0 = now()
        await q.consume(on_message, no_ack=False)
        try:
            await asyncio.wait_for(done.wait(), float(params.get("timeout", 60)))
        except TimeoutError:
            raise AmqpError(
                f"got {state['got']} of {count} deliveries (queue held {depth})"
            ) from None
        t_done = now()
        ch.send(measured=True)  # the parent stops measuring the broker here
        return {
            "got": state["got"],
            "depth": depth,
            "t_go": t0,
            "t_first": state["first"],
            "t_done": t_done,
            "cpu_seconds": time.process_time() - cpu0,
        }
    finally:
        await conn.close()


async def admin(params: dict[str, Any], action: str) -> int:
    """``purge`` or ``delete`` the queue (the parent's housekeeping between runs)."""
    from pamqp import commands

    link: Link = await open_link(params)
    try:
        if action == "delete":
            ok = await link.rpc(
                commands.Queue.Delete(queue=params["queue"]), commands.Queue.DeleteOk
            )
            return int(ok.message_count)
        await link.declare_queue(params["queue"])
        return await link.purge(params["queue"])
    finally:
        await link.close()


# =========================================================================================
# the worker processes: one per client and broker, running one measurement per command
# =========================================================================================
_RUNS = {
    ("wire", "publish"): _wire_publish,
    ("wire", "consume"): _wire_consume,
    ("pika", "publish"): _pika_publish,
    ("pika", "consume"): _pika_consume,
}


async def _worker(client: str, params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Runs measurements until told to stop. Each command is ``{"run": "publish" |
    "consume" | "fill", "params": {...}}``; a run answers ``prepared`` when set up (then
    waits for ``go``), ``measured`` when its clock stops, and ``run_result`` at the end.
    ``fill`` publishes with the fast client and confirms (what a consume run reads)."""
    ch.send(ready=True)
    runs = 0
    while True:
        cmd = await ch.recv()
        if cmd.get("stop"):
            return {"runs": runs}
        p = {**params, **cmd.get("params", {})}
        kind = cmd["run"]
        if kind == "fill":
            # as many as the broker takes in twice the measurement's time, at most count
            seconds = max(3.0, 2 * float(p["seconds"]))
            p.update(confirms=True, seconds=seconds, window=5000, check_enqueued=False)
            fn = _wire_publish
        else:
            fn = _RUNS[(client, kind)]
        ch.send(run_result=await fn(p, ch))
        runs += 1


async def wire_worker(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """The pamqp load generator (:mod:`bench.amqp_wire`)."""
    return await _worker("wire", params, ch)


async def pika_worker(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """aio-pika, as users write it."""
    return await _worker("pika", params, ch)
