"""The Avro frontend under ``polymq run``: records/s ingested from Avro object containers.

One scenario, ``avro``, in two parts on one fresh ``polymq run``:

(a) raw ingest, the scenario's value: ``procs`` load-generator processes, each with
    ``connections`` concurrent aiohttp loops, POST the same pre-encoded container of
    ``batch`` records (``codec``) to ``POST /v1/stream/<name>/records?persistent=false``,
    each POST under its own ``Idempotency-Key`` (as the Spark writer sends them), for
    ``seconds``. Target: 100,000 records/s.
(b) Spark: a local Spark (``spark_master``, in its own process on the load CPUs) writes
    ``spark_rows`` rows of the same shape through ``format("polymq")`` (``batchSize``
    ``spark_batch``) to another transient stream (``--set avro.spark=false`` leaves it out),
    after a small warm-up write (a first write pays for Spark's Python workers and code
    generation), so this is the steady rate; ``--quick`` skips the warm-up.
    Reported as ``spark_records_per_s`` and in ``details``; no target. Recorded as skipped
    (with the reason) where PySpark or Java is missing; the entry keeps part (a).

Both parts check the stream's message count afterwards (HTTP frontend stats): a rate counted
from answers that did not all land would be no rate at all.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import BenchError, Worker, workers
from .scenario import Context, Result, Scenario

__all__ = ["SCENARIOS"]

SCHEMA = {
    "type": "record",
    "name": "Reading",
    "namespace": "bench.avro",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "value", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "maybe", "type": ["null", "long"], "default": None},
    ],
}
T0_US = 1_700_000_000_000_000


def now() -> float:
    return time.monotonic()


def container(batch: int, codec: str) -> bytes:
    """One Avro object container of ``batch`` records shaped like the Spark part's rows."""
    import fastavro

    records = [
        {
            "id": i,
            "name": f"row-{i}",
            "value": i * 0.25,
            "at": T0_US + i * 1_000_003,
            "maybe": None if i % 7 == 0 else i * 3,
        }
        for i in range(batch)
    ]
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(SCHEMA), records, codec=codec)
    return buf.getvalue()


# =========================================================================================
# workers (each runs in its own process)
# =========================================================================================
async def poster(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """POST one container over and over from ``connections`` loops for ``seconds``."""
    import aiohttp

    batch, n_conn = params["batch"], params["connections"]
    body = container(batch, params["codec"])
    url = f"{params['url']}/v1/stream/{params['stream']}/records?persistent=false"
    headers = {"Content-Type": "avro/binary", "Accept": "application/json"}
    conn = aiohttp.TCPConnector(limit=n_conn)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def post(key: str) -> None:
            async with http.post(url, data=body, headers={**headers, "Idempotency-Key": key}) as r:
                text = await r.text()
                if r.status != 200:
                    raise BenchError(f"POST: HTTP {r.status} {text[:300]}")
                answer = json.loads(text)
                if answer.get("count") != batch or answer.get("duplicate"):
                    raise BenchError(f"POST: unexpected answer {text[:300]}")

        await post(f"{params['worker']}-probe")  # checks the route before the clock starts
        ch.send(ready=True, body_bytes=len(body))
        await ch.recv()  # go
        sent = 0
        t0 = now()
        stop_at = t0 + params["seconds"]

        async def one(k: int) -> None:
            nonlocal sent
            i = 0
            while now() < stop_at:
                await post(f"{params['worker']}-{k}-{i}")
                i += 1
                sent += batch

        await asyncio.gather(*(one(k) for k in range(n_conn)))
        t1 = now()
    return {"sent": sent, "probe": batch, "t_first": t0, "t_last": t1}


async def spark_writer(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """A local Spark writing ``rows`` rows with format("polymq"), after a warm-up write."""
    from pyspark.sql import functions as F

    from polymq_spark.session import local_session

    t_start = now()
    spark = local_session(params["master"], app_name="polymq-bench")
    tmp = Path(tempfile.mkdtemp(prefix="polymq-bench-spark-"))
    try:

        def frame(n: int) -> Any:
            return spark.range(n, numPartitions=params["partitions"]).select(
                F.col("id"),
                F.concat(F.lit("row-"), F.col("id").cast("string")).alias("name"),
                (F.col("id") * 0.25).alias("value"),
                F.timestamp_micros(F.lit(T0_US) + F.col("id") * 1_000_003).alias("at"),
                F.when(F.col("id") % 7 == 0, F.lit(None)).otherwise(F.col("id") * 3).alias("maybe"),
            )

        def write(n: int, summary: Path) -> float:
            t = now()
            (
                frame(n)
                .write.format("polymq")
                .option("url", params["url"])
                .option("destination", f"stream/{params['stream']}")
                .option("persistent", "false")
                .option("batchSize", str(params["batch"]))
                .option("codec", params["codec"])
                .option("summaryFile", str(summary))
                .mode("append")
                .save()
            )
            return now() - t

        session_seconds = now() - t_start
        warm_seconds = write(params["warmup"], tmp / "warmup.jsonl") if params["warmup"] else None
        ch.send(ready=True)
        await ch.recv()  # go
        seconds = write(params["rows"], tmp / "run.jsonl")
        [commit] = [json.loads(ln) for ln in (tmp / "run.jsonl").read_text().splitlines()]
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "rows": commit["rows"],
        "batches": commit["batches"],
        "bytes": commit["bytes"],
        "seconds": seconds,
        "task_seconds_max": commit["task_seconds_max"],
        "task_seconds": commit["task_seconds"],
        "encode_seconds": commit["encode_seconds"],
        "post_seconds": commit["post_seconds"],
        "session_seconds": session_seconds,
        "warmup_seconds": warm_seconds,
    }


# =========================================================================================
# the scenario (runs in the parent)
# =========================================================================================
def _messages(url: str, stream: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/stream/{stream}", timeout=30) as r:
        return int(json.loads(r.read())["messages"])


def _spark_missing() -> str | None:
    if (
        importlib.util.find_spec("pyspark") is None
        or importlib.util.find_spec("polymq_spark") is None
    ):
        return "PySpark is not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None:
        return "no java on PATH (PySpark needs Java 17)"
    return None


def _spark_part(ctx: Context, b: Any, pool: list[Worker]) -> dict[str, Any]:
    rows = ctx.option("spark_rows", 20_000 if ctx.quick else 500_000)
    params = {
        "url": b.url("avro"),
        "stream": "bench.avro.spark",
        "rows": rows,
        # --quick leaves the warm-up out: its timed write then pays Spark's first-write costs
        "warmup": ctx.option("spark_warmup_rows", 0 if ctx.quick else 1000),
        "partitions": ctx.option("spark_partitions", 4),
        "batch": ctx.option("spark_batch", 5000),
        "codec": ctx.option("spark_codec", "deflate"),
        "master": ctx.option("spark_master", "local[2]"),
    }
    if not ctx.option("spark", True):
        return {"status": "skipped", "why": "turned off (--set avro.spark=false)"}
    missing = _spark_missing()
    if missing is not None:
        return {"status": "skipped", "why": missing}
    w = ctx.spawn(pool, "bench.avro:spark_writer", params)
    w.expect("ready", 180)
    cpu0 = b.cpu_seconds()
    w.send(go=True)
    r = w.wait_result(600)
    broker_cpu = b.cpu_seconds() - cpu0
    landed = _messages(b.url("http"), params["stream"])
    if landed != rows + params["warmup"]:
        raise BenchError(
            f"Spark wrote {rows:,} + {params['warmup']:,} rows, the stream holds {landed:,}"
        )
    return {
        "status": "ok",
        "records_per_s": rows / r["seconds"],
        "rows": rows,
        "batches": r["batches"],
        "write_seconds": r["seconds"],
        "task_seconds_max": r["task_seconds_max"],
        # summed over tasks: encoding (Arrow -> records -> containers), waiting for the
        # frontend's answers, and the rest (Spark computing and handing over the rows)
        "task_seconds": r["task_seconds"],
        "task_encode_seconds": r["encode_seconds"],
        "task_post_seconds": r["post_seconds"],
        "spark_cpus": ctx.plan.load,
        "container_bytes": r["bytes"],
        "session_start_seconds": r["session_seconds"],
        "first_write_seconds": r["warmup_seconds"],
        "broker_cpu_seconds": broker_cpu,
        "params": params,
    }


def run_avro(ctx: Context) -> Result:
    if importlib.util.find_spec("polymq_avro.service") is None:
        raise BenchError("the Avro frontend (services/avro: polymq_avro.service) is not installed")
    procs = ctx.option("procs", 1)
    n_conn = ctx.option("connections", 8)
    batch = ctx.option("batch", 1000)
    codec = ctx.option("codec", "deflate")
    seconds = ctx.option("seconds", 1.0 if ctx.quick else 5.0)
    stream = "bench.avro.raw"
    error = None
    with ctx.broker("run") as b, workers() as pool:
        params = {"url": b.url("avro"), "stream": stream, "batch": batch, "codec": codec,
                  "connections": n_conn, "seconds": seconds}  # fmt: skip
        ws = [ctx.spawn(pool, "bench.avro:poster", {**params, "worker": i}) for i in range(procs)]
        readies = [w.expect("ready", 60) for w in ws]
        body_bytes = readies[0]["body_bytes"]
        cpu0 = b.cpu_seconds()
        for w in ws:
            w.send(go=True)
        results = [w.wait_result(seconds + 120) for w in ws]
        broker_cpu = b.cpu_seconds() - cpu0
        sent = sum(r["sent"] for r in results)
        elapsed = max(r["t_last"] for r in results) - min(r["t_first"] for r in results)
        landed = _messages(b.url("http"), stream)
        expected = sent + sum(r["probe"] for r in results)
        if landed != expected:
            raise BenchError(f"{expected:,} records were accepted, the stream holds {landed:,}")
        try:
            spark = _spark_part(ctx, b, pool)
        except BenchError as exc:
            spark = {"status": "failed", "error": str(exc)}
            error = f"the Spark part failed: {exc}"
    rate = sent / elapsed
    spark_rate = spark.get("records_per_s")
    spark_note = (
        f"Spark (format polymq, {spark['params']['master']} on CPUs "
        f"{spark['spark_cpus'] or 'any'}, {spark['rows']:,} rows in "
        f"{spark['batches']} batches of {spark['params']['batch']:,}): {spark_rate:,.0f} "
        f"records/s over {spark['write_seconds']:.1f}s "
        + (
            f"after a warm-up write (the first write of a session took "
            f"{spark['first_write_seconds']:.1f}s)"
            if spark["first_write_seconds"] is not None
            else "with no warm-up write first (so with Spark's first-write costs)"
        )
        + f"; its tasks spent "
        f"{spark['task_encode_seconds']:.1f}s encoding and {spark['task_post_seconds']:.1f}s "
        f"waiting for answers of {spark['task_seconds']:.1f}s."
        if spark_rate is not None
        else f"Spark part {spark['status']}: {spark.get('why') or spark.get('error')}."
    )
    return Result(
        value=rate,
        params={
            "procs": procs,
            "connections": n_conn,
            "batch": batch,
            "codec": codec,
            "container_bytes": body_bytes,
            "records": sent,
            "persistent": False,
            "max_seconds": seconds,
        },
        notes=(
            f"polymq run (core + every frontend in one process). value = raw ingest: {procs} "
            f"process(es) x {n_conn} concurrent aiohttp POSTs of one {codec} container of "
            f"{batch:,} records ({body_bytes:,} bytes), each under its own Idempotency-Key, "
            f"into a transient stream: {rate:,.0f} records/s; the broker spent "
            f"{broker_cpu / sent * 1e6:.1f} CPU-us per record. " + spark_note
        ),
        details={
            "seconds": elapsed,
            "posts_per_s": rate / batch,
            "broker_cpu_seconds": broker_cpu,
            "broker_cpu_us_per_record": broker_cpu / sent * 1e6,
            "spark": spark,
        },
        comparable=not ctx.quick,
        error=error,
        extra={"spark_records_per_s": round(spark_rate, 1) if spark_rate is not None else None},
    )


SCENARIOS = [
    Scenario(
        "avro",
        100_000,
        "records/s",
        "min",
        run_avro,
        about="Avro containers into a transient stream (raw POSTs, then Spark format polymq)",
    )
]
