"""The long-polling frontend under ``polymq run``: reading a stream by long poll and by SSE.

The routes are those of ``services/longpoll``::

    POST /v1/subscriptions {"destination": "stream/x", "offset": "first"}  -> {id, cursor}
    GET  /v1/subscriptions/{id}/poll?cursor=&max=&wait=                   -> {cursor, messages}
    GET  /v1/subscriptions/{id}/events?cursor=&max=                       Server-Sent Events

Messages are published with the native :class:`polymq.Client` (to the core port); the HTTP
readers use aiohttp. Every publisher and reader runs in its own process (a harness worker),
apart from the broker.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from polymq import Client, Message

from .harness import BenchError, workers
from .scenario import Context, Result, Scenario

BODY = b"x" * 32


def now() -> float:
    return time.monotonic()


# =========================================================================================
# workers (each runs in its own process)
# =========================================================================================
async def publisher(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Publish ``count`` 32-byte messages in batches of ``batch`` (each batch awaited)."""
    client = await Client.connect(params["host"], params["port"])
    try:
        dest, count, batch = params["destination"], params["count"], params["batch"]
        full = [Message(body=BODY) for _ in range(batch)]
        sent = 0
        t0 = now()
        while sent < count:
            k = min(batch, count - sent)
            await client.publish(dest, full if k == batch else full[:k])
            sent += k
        return {"sent": sent, "t_first": t0, "t_last": now()}
    finally:
        await client.close()


async def rate_publisher(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Publish ``rate`` messages a second for ``seconds``, each body its ``time.time()``."""
    client = await Client.connect(params["host"], params["port"])
    try:
        ch.send(ready=True)
        await ch.recv()  # go
        dest, rate, seconds = params["destination"], params["rate"], params["seconds"]
        total = max(1, int(rate * seconds))
        t0 = now()
        for i in range(total):
            delay = t0 + i / rate - now()
            if delay > 0:
                await asyncio.sleep(delay)
            body = json.dumps({"t": time.time(), "i": i}).encode()
            client.publish_nowait(dest, [Message(body=body)])
            await client.drain()
        await client.ping()
        return {"sent": total, "t_first": t0, "t_last": now()}
    finally:
        await client.close()


async def _open(http: Any, base: str, destination: str) -> tuple[str, str]:
    body = {"destination": destination, "offset": "first"}
    async with http.post(f"{base}/v1/subscriptions", json=body) as resp:
        if resp.status >= 300:
            raise BenchError(f"open subscription: HTTP {resp.status} {await resp.text()}")
        data = await resp.json()
    return str(data["id"]), str(data["cursor"])


def _latency(msg: dict[str, Any], t: float) -> float:
    return t - float(json.loads(msg["body"])["t"])


async def poll_reader(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Read ``expect`` messages by chained long polls (``max``, ``wait``); with
    ``latency`` set, the latency of each (its body holds the publish ``time.time()``)."""
    import aiohttp

    base, latency = params["url"], params["latency"]
    timeout = aiohttp.ClientTimeout(total=None, sock_read=params["wait"] + 30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        sub_id, cursor = await _open(http, base, params["destination"])
        url = f"{base}/v1/subscriptions/{sub_id}/poll"
        ch.send(ready=True)
        expect = int((await ch.recv())["expect"])
        got, polls = 0, 0
        lat: list[float] = []
        t0 = now()
        stop_at = t0 + params["timeout"]
        while got < expect and now() < stop_at:
            q = {"cursor": cursor, "max": str(params["max"]), "wait": str(params["wait"])}
            async with http.get(url, params=q) as resp:
                if resp.status >= 300:
                    raise BenchError(f"poll: HTTP {resp.status} {await resp.text()}")
                data = await resp.json()
            t = time.time()
            polls += 1
            msgs = data["messages"]
            if latency:
                lat.extend(_latency(m, t) for m in msgs)
            got += len(msgs)
            if data["cursor"] is not None:
                cursor = data["cursor"]
        t1 = now()
    return {"got": got, "polls": polls, "t_first": t0, "t_last": t1, "latencies": lat}


async def sse_reader(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Read ``expect`` messages from the subscription's event stream (``max`` per answer)."""
    import aiohttp

    base, latency = params["url"], params["latency"]
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        sub_id, cursor = await _open(http, base, params["destination"])
        url = f"{base}/v1/subscriptions/{sub_id}/events"
        q = {"cursor": cursor, "max": str(params["max"])}
        headers = {"Accept": "text/event-stream"}
        if latency:  # connected before the publisher starts
            async with http.get(url, params=q, headers=headers) as resp:
                if resp.status >= 300:
                    raise BenchError(f"events: HTTP {resp.status} {await resp.text()}")
                ch.send(ready=True)
                expect = int((await ch.recv())["expect"])
                t0 = now()
                got, lat = await _read_events(resp, expect, t0 + params["timeout"], latency)
                t1 = now()
        else:  # the backlog is there already: the clock starts before the request
            ch.send(ready=True)
            expect = int((await ch.recv())["expect"])
            t0 = now()
            async with http.get(url, params=q, headers=headers) as resp:
                if resp.status >= 300:
                    raise BenchError(f"events: HTTP {resp.status} {await resp.text()}")
                got, lat = await _read_events(resp, expect, t0 + params["timeout"], latency)
                t1 = now()
    return {"got": got, "t_first": t0, "t_last": t1, "latencies": lat}


async def _read_events(
    resp: Any, expect: int, stop_at: float, latency: bool
) -> tuple[int, list[float]]:
    """Parse the event stream until ``expect`` messages or ``stop_at``: (read, latencies)."""
    got = 0
    lat: list[float] = []
    event, data = "message", b""

    async def read() -> None:
        nonlocal got, event, data
        while got < expect:
            line = await resp.content.readline()
            if not line:
                raise BenchError(f"the event stream ended after {got} messages")
            line = line.rstrip(b"\r\n")
            if not line:  # the end of an event
                if data:
                    if event != "message":
                        raise BenchError(f"event {event}: {data[:300]!r}")
                    if latency:
                        lat.append(_latency(json.loads(data), time.time()))
                    got += 1
                event, data = "message", b""
            elif line.startswith(b"data:"):
                data += line[5:].lstrip(b" ")
            elif line.startswith(b"event:"):
                event = line[6:].strip().decode()

    try:
        await asyncio.wait_for(read(), max(0.1, stop_at - now()))
    except TimeoutError:
        pass
    return got, lat


# =========================================================================================
# scenarios (run in the parent)
# =========================================================================================
def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _check_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("polymq_longpoll") is None:
        raise BenchError("the long-polling frontend (services/longpoll) is not installed")


def run_deliveries(ctx: Context) -> Result:
    _check_installed()
    count = ctx.option("count", 20_000 if ctx.quick else 200_000)
    batch = ctx.option("batch", 500)
    pull_max = ctx.option("max", 1000)
    timeout = ctx.option("read_timeout", 15.0 if ctx.quick else 30.0)
    dest = "stream/bench.longpoll"
    out: dict[str, dict[str, Any]] = {}
    with ctx.broker("run") as b, workers() as pool:
        common = {"host": b.host, "port": b.core_port, "destination": dest}
        pub = ctx.spawn(
            pool, "bench.longpoll:publisher", {**common, "count": count, "batch": batch}
        )
        pr = pub.wait_result(120)
        reader = {
            "url": b.url("longpoll"),
            "destination": dest,
            "max": pull_max,
            "wait": 1.0,
            "timeout": timeout,
            "latency": False,
        }
        for mode in ("poll", "sse"):
            w = ctx.spawn(pool, f"bench.longpoll:{mode}_reader", reader)
            w.expect("ready", 60)
            w.send(expect=count)
            out[mode] = w.wait_result(timeout + 60)
            b.check_alive()
    rates = {}
    for mode, r in out.items():
        if not r["got"]:
            raise BenchError(f"{mode}: nothing was read within {timeout:.0f}s")
        rates[mode] = r["got"] / max(1e-9, r["t_last"] - r["t_first"])
    short = [f"{m}: {r['got']:,} of {count:,}" for m, r in out.items() if r["got"] < count]
    partial = f" Stopped after {timeout:.0f}s: {'; '.join(short)}." if short else ""
    pub_rate = pr["sent"] / max(1e-9, pr["t_last"] - pr["t_first"])
    return Result(
        value=rates["poll"],
        params={"messages": count, "publish_batch": batch, "max": pull_max, "body_bytes": 32},
        notes=(
            f"polymq run (core + frontends in one process). {count:,} messages published to "
            f"{dest} with the native client (batches of {batch}, awaited: {pub_rate:,.0f} "
            f"msg/s), then read from offset first by one reader process: value = long poll "
            f"(max={pull_max}, cursor chained) {rates['poll']:,.0f} deliveries/s; SSE "
            f"(max={pull_max}) {rates['sse']:,.0f} deliveries/s.{partial} Readers run in "
            f"their own processes. No topic variant. No fixed target."
        ),
        details={
            "longpoll_deliveries_per_s": rates["poll"],
            "sse_deliveries_per_s": rates["sse"],
            "longpoll_polls": out["poll"]["polls"],
            "longpoll_seconds": out["poll"]["t_last"] - out["poll"]["t_first"],
            "sse_seconds": out["sse"]["t_last"] - out["sse"]["t_first"],
            "longpoll_read": out["poll"]["got"],
            "sse_read": out["sse"]["got"],
            "publish_msg_per_s": pub_rate,
            "reader_cpu_seconds": {m: r["process_cpu_seconds"] for m, r in out.items()},
        },
    )


def run_latency(ctx: Context) -> Result:
    _check_installed()
    rate = ctx.option("rate", 200.0)
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 3.0)
    wait = ctx.option("wait", 10.0)
    timeout = seconds + 10.0
    dest = "stream/bench.longpoll.latency"
    out: dict[str, dict[str, Any]] = {}
    with ctx.broker("run") as b, workers() as pool:
        reader = {
            "url": b.url("longpoll"),
            "destination": dest,
            "max": 1000,
            "wait": wait,
            "timeout": timeout,
            "latency": True,
        }
        readers = {
            m: ctx.spawn(pool, f"bench.longpoll:{m}_reader", reader) for m in ("poll", "sse")
        }
        for w in readers.values():
            w.expect("ready", 60)
        params = {"host": b.host, "port": b.core_port, "destination": dest}
        pub = ctx.spawn(
            pool, "bench.longpoll:rate_publisher", {**params, "rate": rate, "seconds": seconds}
        )
        pub.expect("ready", 60)
        total = max(1, int(rate * seconds))
        for w in readers.values():
            w.send(expect=total)
        pub.send(go=True)
        pr = pub.wait_result(seconds + 60)
        for m, w in readers.items():
            out[m] = w.wait_result(timeout + 60)
        b.check_alive()
    stats: dict[str, dict[str, float]] = {}
    for m, r in out.items():
        lat = [x * 1000.0 for x in r["latencies"]]
        if not lat:
            raise BenchError(f"{m}: nothing was read within {timeout:.0f}s")
        stats[m] = {
            "p50_ms": _pct(lat, 0.50),
            "p99_ms": _pct(lat, 0.99),
            "max_ms": max(lat),
            "received": len(lat),
        }
    short = [f"{m}: {r['got']:,} of {total:,}" for m, r in out.items() if r["got"] < total]
    partial = f" Incomplete: {'; '.join(short)}." if short else ""
    lp, sse = stats["poll"], stats["sse"]
    return Result(
        value=lp["p99_ms"],
        params={"rate": rate, "seconds": seconds, "messages": pr["sent"], "wait": wait},
        notes=(
            f"polymq run. {rate:g} msg/s for {seconds:g}s to {dest} with the native client "
            f"(body = publish time.time()); one long-poll reader (chained, wait={wait:g}s) and "
            f"one SSE reader, each in its own process, subscribed from the start. value = "
            f"long-poll p99 {lp['p99_ms']:.2f} ms (p50 {lp['p50_ms']:.2f}); SSE p50 "
            f"{sse['p50_ms']:.2f} ms, p99 {sse['p99_ms']:.2f} ms.{partial} No fixed target."
        ),
        details={"longpoll": lp, "sse": sse},
    )


SCENARIOS = [
    Scenario(
        "longpoll_deliveries",
        None,
        "msg/s",
        None,
        run_deliveries,
        about="stream read by long poll and by SSE (long-polling frontend)",
    ),
    Scenario(
        "longpoll_latency_fixed_rate",
        None,
        "ms",
        None,
        run_latency,
        about="publish-to-delivery latency over long poll and SSE at a fixed rate",
    ),
]
