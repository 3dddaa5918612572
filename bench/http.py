"""The JSON over HTTP frontend under ``polymq run``: batch publish, then pull + ack, over aiohttp.

The routes are those of the README::

    POST /v1/queue/<name>/messages          a message, or a batch
    POST /v1/queue/<name>/pull?max=N&wait=S  leases, each with a receipt
    POST /v1/ack  {"receipts": [...]}

The batch form of the publish body is found by trying, in order, ``{"messages": [...]}`` and
a bare JSON array with the first batch; the one the frontend accepted (and counted as a
batch) is used for the rest and reported in ``params``. Two phases, each with ``connections``
concurrent requests: publish for ``seconds`` (or ``count`` messages), then pull + ack until
everything published has been acked.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from typing import Any

from .harness import BenchError, workers
from .scenario import Context, Result, Scenario

BODY = "x" * 32


def now() -> float:
    return time.monotonic()


_SHAPES: dict[str, Any] = {
    "object": lambda msgs: {"messages": msgs},
    "array": lambda msgs: msgs,
}


def _accepted_count(data: Any) -> int | None:
    """How many messages a publish answer says were accepted, when it says."""
    if isinstance(data, dict):
        for key in ("count", "published", "accepted"):
            if isinstance(data.get(key), int):
                return int(data[key])
        for key in ("ids", "messages", "receipts", "seqs"):
            if isinstance(data.get(key), list):
                return len(data[key])
    if isinstance(data, list):
        return len(data)
    return None


def _leases(data: Any) -> list[str]:
    """The receipts in a pull answer (a list of leases, or an object holding one)."""
    items: Any = data
    if isinstance(data, dict):
        if "receipt" in data:
            items = [data]
        else:
            items = next(
                (
                    data[k]
                    for k in ("messages", "leases", "items", "deliveries")
                    if isinstance(data.get(k), list)
                ),
                None,
            )
    if not isinstance(items, list):
        raise BenchError(f"cannot find leases in a pull answer: {str(data)[:200]}")
    receipts = []
    for it in items:
        r = it.get("receipt") if isinstance(it, dict) else None
        if not isinstance(r, str):
            raise BenchError(f"a pulled message without a receipt: {str(it)[:200]}")
        receipts.append(r)
    return receipts


async def publisher(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aiohttp

    base, queue, batch = params["url"], params["queue"], params["batch"]
    url = f"{base}/v1/queue/{queue}/messages"
    msgs = [{"body": BODY} for _ in range(batch)]
    conn = aiohttp.TCPConnector(limit=params["connections"])
    async with aiohttp.ClientSession(connector=conn) as http:
        shape = None
        probe_errors = []
        for name, make in _SHAPES.items():
            async with http.post(url, json=make(msgs)) as resp:
                text = await resp.text()
                if resp.status < 300:
                    n = _accepted_count(await resp.json(content_type=None))
                    if n is None or n == batch:
                        shape = name
                        break
                    probe_errors.append(f"{name}: accepted {n} of {batch}")
                else:
                    probe_errors.append(f"{name}: HTTP {resp.status} {text[:200]}")
        if shape is None:
            raise BenchError("no batch publish form was accepted: " + "; ".join(probe_errors))
        make = _SHAPES[shape]
        body = make(msgs)
        ch.send(ready=True, shape=shape)
        await ch.recv()  # go
        sent = 0
        t0 = now()
        stop_at = t0 + params["seconds"]
        limit = params["count"]

        async def one() -> None:
            nonlocal sent
            while now() < stop_at and sent < limit:
                sent += batch
                async with http.post(url, json=body) as resp:
                    if resp.status >= 300:
                        raise BenchError(f"publish: HTTP {resp.status} {await resp.text()}")
                    await resp.read()

        await asyncio.gather(*(one() for _ in range(params["connections"])))
        t1 = now()
    return {"sent": sent, "probe": batch, "t_first": t0, "t_last": t1, "shape": shape}


async def puller(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    import aiohttp

    base, queue = params["url"], params["queue"]
    pull_url = f"{base}/v1/queue/{queue}/pull"
    ack_url = f"{base}/v1/ack"
    conn = aiohttp.TCPConnector(limit=params["connections"])
    async with aiohttp.ClientSession(connector=conn) as http:
        ch.send(ready=True)
        expect = int((await ch.recv())["expect"])
        acked = 0
        t0 = now()
        stop_at = t0 + params["timeout"]

        async def one() -> None:
            nonlocal acked
            while acked < expect and now() < stop_at:
                q = {"max": str(params["max"]), "wait": "1"}
                async with http.post(pull_url, params=q) as resp:
                    if resp.status >= 300:
                        raise BenchError(f"pull: HTTP {resp.status} {await resp.text()}")
                    receipts = _leases(await resp.json(content_type=None))
                if not receipts:
                    continue
                async with http.post(ack_url, json={"receipts": receipts}) as resp:
                    if resp.status >= 300:
                        raise BenchError(f"ack: HTTP {resp.status} {await resp.text()}")
                    await resp.read()
                acked += len(receipts)

        await asyncio.gather(*(one() for _ in range(params["connections"])))
        t1 = now()
    return {"acked": acked, "t_first": t0, "t_last": t1}


def run_http(ctx: Context) -> Result:
    if importlib.util.find_spec("polymq_http") is None or (
        importlib.util.find_spec("polymq_http.service") is None
    ):
        raise BenchError(
            "the HTTP frontend (services/http: polymq_http.service) is not installed yet, "
            "so `polymq run` cannot start"
        )
    batch = ctx.option("batch", 100)
    n_conn = ctx.option("connections", 4)
    pull_max = ctx.option("max", 100)
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 4.0)
    count = ctx.option("count", 20_000 if ctx.quick else 400_000)
    timeout = ctx.option("pull_timeout", 15.0 if ctx.quick else 30.0)
    queue = "bench.http"
    with ctx.broker("run") as b, workers() as pool:
        params = {
            "url": b.url("http"),
            "queue": queue,
            "batch": batch,
            "connections": n_conn,
            "seconds": seconds,
            "count": count,
            "max": pull_max,
            "timeout": timeout,
        }
        pub = ctx.spawn(pool, "bench.http:publisher", params)
        shape = pub.expect("ready", 60)["shape"]
        pub.send(go=True)
        pr = pub.wait_result(seconds + 60)
        pull = ctx.spawn(pool, "bench.http:puller", params)
        pull.expect("ready", 60)
        total = pr["sent"] + pr["probe"]
        pull.send(expect=total)
        rr = pull.wait_result(timeout + 60)
    if not rr["acked"]:
        raise BenchError(f"nothing was pulled and acked within {timeout:.0f}s")
    partial = (
        f" (stopped after {timeout:.0f}s with {rr['acked']:,} of {total:,} acked)"
        if rr["acked"] < total
        else ""
    )
    pub_rate = pr["sent"] / (pr["t_last"] - pr["t_first"])
    pull_rate = rr["acked"] / (rr["t_last"] - rr["t_first"])
    return Result(
        value=pub_rate,
        params={
            "batch": batch,
            "connections": n_conn,
            "pull_max": pull_max,
            "publish_body_form": shape,
            "messages": total,
            "body_bytes": len(BODY),
        },
        notes=(
            f"polymq run (core + HTTP frontend in one process). value = batch publish rate: "
            f"{n_conn} concurrent POSTs of {batch} messages ({pub_rate:,.0f} msg/s). Then "
            f"pull (max={pull_max}) + ack of the whole backlog with {n_conn} concurrent "
            f"loops: {pull_rate:,.0f} msg/s{partial}. No fixed target."
        ),
        details={
            "publish_msg_per_s": pub_rate,
            "pull_ack_msg_per_s": pull_rate,
            "publish_seconds": pr["t_last"] - pr["t_first"],
            "pull_ack_seconds": rr["t_last"] - rr["t_first"],
        },
    )


SCENARIOS = [Scenario("http_batch_publish_pull", None, "msg/s", None, run_http)]
