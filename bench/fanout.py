"""Issue 17's many-clients targets: 10k waiting long polls woken by one topic message, and
10k idle STOMP connections, each frontend a process of its own (``polymq core`` plus
``polymq longpoll --core`` / ``polymq stomp --core``) so that its RSS is its own.

``longpoll_fanout_10k``
    ``waiters`` subscriptions to one topic (``POST /v1/subscriptions``), each with one long
    poll held open (``wait`` s), spread over ``client_processes`` aiohttp processes
    (connector ``limit=0``). Once the frontend's ``polymq_longpoll_polls_open`` shows them
    all, one message is published to the topic with the native client; its body holds the
    publish ``time.time()``. value = p99 of publish -> answer read, over every waiter
    (target <= 1 s). The longpoll process's RSS is taken at start, with the subscriptions
    open and with every poll held.
``stomp_connections_10k``
    ``connections`` STOMP 1.2 connections (raw asyncio sockets, ``client_processes``
    processes), each with one SUBSCRIBE to a topic of its own and a receipt. value = RSS of
    the STOMP process with all of them open (no fixed target; the growth per connection in
    ``details``), and the core's RSS as well.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from polymq import Client, Message

from .harness import BenchError, Broker, workers
from .scenario import Context, Result, Scenario

MB = 1_000_000


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# =========================================================================================
# workers (each runs in its own process)
# =========================================================================================
class _HeldPoll(asyncio.Protocol):
    """One long poll on a connection of its own, read by hand: the moment the last byte of
    its answer arrives is all that is done on arrival; the answer is parsed once every poll
    has one. So the load generator's own work does not count as the server's latency: with
    aiohttp's client each answer cost ~50 us of this process's CPU (parser, response object,
    task wake-up, JSON), and the 10,000 answers queued behind each other on the one load CPU
    (0.5 s between the first and the last, more than the frontend's own work)."""

    def __init__(self, request: bytes, arrived: Callable[[], None]) -> None:
        self.request = request
        self.arrived = arrived
        self.data = bytearray()
        self.end = -1  # the length of the whole answer, once its head is in
        self.at = 0.0  # time.time() when the whole answer was in (or the connection ended)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.at:
            return
        self.data += data
        if self.end < 0:
            head = self.data.find(b"\r\n\r\n")
            if head < 0:
                return
            length = _content_length(bytes(self.data[:head]))
            self.end = head + 4 + (length if length is not None else 0)
        if len(self.data) >= self.end:
            self.at = time.time()
            self.arrived()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.at:
            self.at = time.time()
            self.end = -1  # no whole answer
            self.arrived()

    def answer(self) -> tuple[int, float]:
        """``(status, publish time in the message)``; status 0: no whole answer."""
        if self.end < 0 or len(self.data) < self.end:
            return 0, 0.0
        head, _, body = bytes(self.data[: self.end]).partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200 or _content_length(head) is None:
            return status, 0.0
        msgs = json.loads(body)["messages"]
        return status, float(json.loads(msgs[0]["body"])["t"]) if msgs else 0.0


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return None  # (not an answer this bench reads: counted as failed)


async def lp_waiters(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Open ``n`` topic subscriptions (aiohttp), hold one long poll on each (a connection
    each, :class:`_HeldPoll`), time the answers; the connections are held until the parent
    says that every process has its answers (closing them would cost the frontend CPU while
    it still answers the others)."""
    import aiohttp

    _raise_nofile()
    base, n, wait = params["url"], params["n"], params["wait"]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=wait + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        gate = asyncio.Semaphore(100)
        body = {"destination": params["destination"]}

        async def open_one() -> tuple[str, str]:
            async with gate, http.post(f"{base}/v1/subscriptions", json=body) as r:
                if r.status != 201:
                    raise BenchError(f"open: HTTP {r.status} {await r.text()}")
                data = await r.json()
                return str(data["id"]), str(data["cursor"])

        subs = await asyncio.gather(*(open_one() for _ in range(n)))
    ch.send(opened=n)
    await ch.recv()  # poll now

    loop = asyncio.get_running_loop()
    url = urllib.parse.urlsplit(base)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    all_in = loop.create_future()
    cpu_at_first: list[float] = []
    count = 0

    def arrived() -> None:
        nonlocal count
        count += 1
        if count == 1:
            cpu_at_first.append(time.process_time())
        if count == n and not all_in.done():
            all_in.set_result(None)

    async def connect(sub_id: str, cursor: str) -> _HeldPoll:
        path = f"/v1/subscriptions/{sub_id}/poll?cursor={cursor}&wait={wait:g}"
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
        poll = _HeldPoll(request, arrived)
        async with gate:
            await loop.create_connection(lambda: poll, host, port)
        return poll

    polls = await asyncio.gather(*(connect(s, c) for s, c in subs))
    ch.send(polling=n)
    await asyncio.wait_for(all_in, wait + 60)
    cpu = time.process_time() - cpu_at_first[0]
    ch.send(answered=n)
    await ch.recv()  # every process has its answers: let go
    for poll in polls:
        if poll.transport is not None:
            poll.transport.close()
    answers = [(*poll.answer(), poll.at) for poll in polls]
    return {
        "latencies": [t - sent for s, sent, t in answers if s == 200 and sent],
        "failed": sum(1 for s, sent, _ in answers if s != 200 or not sent),
        "statuses": sorted({s for s, _, _ in answers}),
        "cpu_seconds": cpu,
        "first": min(t for _, _, t in answers),
        "last": max(t for _, _, t in answers),
    }


async def one_publisher(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """Publish one message (body: its publish ``time.time()``) when told; return the
    number of subscribers the core reached."""
    client = await Client.connect(params["host"], params["port"])
    try:
        ch.send(ready=True)
        await ch.recv()
        t = time.time()
        body = json.dumps({"t": t}).encode()
        got = await client.publish(params["destination"], [Message(body=body)])
        return {"t": t, "answer": repr(got)[:200]}
    finally:
        await client.close()


async def stomp_idlers(params: dict[str, Any], ch: Any) -> dict[str, Any]:
    """``n`` STOMP connections, each subscribed (with a receipt) to a topic of its own."""
    _raise_nofile()
    host, port, n, offset = params["host"], params["port"], params["n"], params["offset"]
    gate = asyncio.Semaphore(200)
    conns: list[asyncio.StreamWriter] = []

    async def read_frame(reader: asyncio.StreamReader) -> bytes:
        frame = await reader.readuntil(b"\x00")
        return frame.lstrip(b"\r\n")

    async def one(i: int) -> None:
        async with gate:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
            frame = await read_frame(reader)
            if not frame.startswith(b"CONNECTED"):
                raise BenchError(f"connect: {frame[:200]!r}")
            writer.write(
                b"SUBSCRIBE\nid:0\ndestination:/topic/idle.s%d\nreceipt:r\n\n\x00" % (offset + i)
            )
            frame = await read_frame(reader)
            if not frame.startswith(b"RECEIPT"):
                raise BenchError(f"subscribe: {frame[:200]!r}")
            conns.append(writer)

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    ch.send(connected=len(conns), seconds=time.monotonic() - t0)
    await ch.recv()  # measured: let go
    for w in conns:
        w.close()
    return {}


# =========================================================================================
# scenarios (run in the parent)
# =========================================================================================
def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@contextmanager
def _frontend(ctx: Context, core: Broker, command: str) -> Iterator[Broker]:
    with ctx.broker(command, "--core", f"{core.host}:{core.core_port}") as f:
        yield f


def run_longpoll_fanout(ctx: Context) -> Result:
    n = ctx.option("waiters", 1000 if ctx.quick else 10_000)
    n_procs = ctx.option("client_processes", 1 if ctx.quick else 4)
    wait = ctx.option("wait", 25.0)
    dest = "topic/bench.fanout"
    with ctx.broker("core") as core, _frontend(ctx, core, "longpoll") as lp, workers() as pool:
        url = lp.url("longpoll")
        rss_start = lp.rss()
        core_rss_start = core.rss()
        shares = [n // n_procs + (1 if i < n % n_procs else 0) for i in range(n_procs)]
        ws = [
            ctx.spawn(
                pool,
                "bench.fanout:lp_waiters",
                {"url": url, "n": k, "wait": wait, "destination": dest},
            )
            for k in shares
        ]
        for w in ws:
            w.expect("opened", 300)
        time.sleep(0.5)
        rss_open = lp.rss()
        for w in ws:
            w.send(go=True)
        for w in ws:
            w.expect("polling", 60)
        deadline = time.monotonic() + 120
        while (held := _metric(url, "polymq_longpoll_polls_open")) < n:
            if time.monotonic() > deadline:
                raise BenchError(f"only {held:.0f} of {n} polls were held open")
            time.sleep(0.2)
        time.sleep(1.0)  # the last polls reach the core
        rss_held = lp.rss()
        core_rss_held = core.rss()
        pub = ctx.spawn(
            pool,
            "bench.fanout:one_publisher",
            {"host": core.host, "port": core.core_port, "destination": dest},
        )
        pub.expect("ready", 60)
        cpu_lp0, cpu_core0 = lp.cpu_seconds(), core.cpu_seconds()
        sys_lp0 = lp._ps.cpu_times().system
        with lp.profile_window(), core.profile_window():  # --profile: the fan-out only
            pub.send(go=True)
            pr = pub.wait_result(60)
            for w in ws:
                w.expect("answered", wait + 60)
        for w in ws:
            w.send(release=True)
        results = [w.wait_result(60) for w in ws]
        cpu_lp, cpu_core = lp.cpu_seconds() - cpu_lp0, core.cpu_seconds() - cpu_core0
        sys_lp = lp._ps.cpu_times().system - sys_lp0
        rss_after = lp.rss()
        core.check_alive()
        lp.check_alive()
    lat = [x * 1000.0 for r in results for x in r["latencies"]]
    failed = sum(r["failed"] for r in results)
    if not lat:
        raise BenchError(f"no waiter got the message ({failed} failed)")
    p50, p99, mx = _pct(lat, 0.5), _pct(lat, 0.99), max(lat)
    missing = f" {failed} waiter(s) did not get it." if failed else ""
    return Result(
        comparable=n >= 10_000,
        value=p99,
        params={"waiters": n, "client_processes": n_procs, "wait": wait, "destination": dest},
        notes=(
            f"polymq core + polymq longpoll (separate processes, both on CPU(s) "
            f"{ctx.plan.broker}). {n:,} topic subscriptions to {dest}, one long poll (wait="
            f"{wait:g}s) held on each by {n_procs} aiohttp process(es); then one message "
            f"published with the native client. Publish -> answer read: p50 {p50:.0f} ms, "
            f"p99 {p99:.0f} ms, max {mx:.0f} ms over {len(lat):,} waiters.{missing} Longpoll "
            f"RSS: {rss_start / MB:.1f} MB at start, {rss_open / MB:.1f} MB with the "
            f"subscriptions open, {rss_held / MB:.1f} MB with every poll held. CPU-s for the "
            f"fan-out: longpoll {cpu_lp:.2f}, core {cpu_core:.2f}."
        ),
        details={
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": mx,
            "answered": len(lat),
            "failed": failed,
            "statuses": sorted({s for r in results for s in r["statuses"]}),
            "longpoll_rss_start_bytes": rss_start,
            "longpoll_rss_open_bytes": rss_open,
            "longpoll_rss_held_bytes": rss_held,
            "longpoll_rss_after_bytes": rss_after,
            "longpoll_bytes_per_held_poll": (rss_held - rss_start) / n,
            "core_rss_start_bytes": core_rss_start,
            "core_rss_held_bytes": core_rss_held,
            "fanout_cpu_seconds": {
                "longpoll": cpu_lp,
                "longpoll_system": sys_lp,
                "core": cpu_core,
                "clients": [r["cpu_seconds"] for r in results],
            },
            "clients_first_last_ms": [
                ((r["first"] - pr["t"]) * 1000, (r["last"] - pr["t"]) * 1000) for r in results
            ],
            "publish": pr.get("answer"),
        },
    )


def run_stomp_connections(ctx: Context) -> Result:
    n = ctx.option("connections", 1000 if ctx.quick else 10_000)
    n_procs = ctx.option("client_processes", 1 if ctx.quick else 2)
    with ctx.broker("core") as core, _frontend(ctx, core, "stomp") as st, workers() as pool:
        time.sleep(0.5)
        rss_start, core_start = st.rss(), core.rss()
        shares = [n // n_procs + (1 if i < n % n_procs else 0) for i in range(n_procs)]
        ws, offset = [], 0
        for k in shares:
            params = {"host": st.host, "port": st.ports["stomp"], "n": k, "offset": offset}
            ws.append(ctx.spawn(pool, "bench.fanout:stomp_idlers", params))
            offset += k
        done = [w.expect("connected", 300) for w in ws]
        time.sleep(1.0)
        rss_held, core_held = st.rss(), core.rss()
        st.check_alive()
        for w in ws:
            w.send(done=True)
        for w in ws:
            w.wait_result(60)
    connected = sum(d["connected"] for d in done)
    seconds = max(d["seconds"] for d in done)
    if connected != n:
        raise BenchError(f"only {connected} of {n} STOMP connections were made")
    per = (rss_held - rss_start) / n
    return Result(
        comparable=n >= 10_000,
        value=rss_held / MB,
        params={"connections": n, "client_processes": n_procs},
        notes=(
            f"polymq core + polymq stomp (separate processes). {n:,} STOMP 1.2 connections "
            f"over TCP from {n_procs} process(es), each with one SUBSCRIBE (receipt) to a "
            f"topic of its own, made in {seconds:.1f}s. STOMP process RSS {rss_start / MB:.1f} "
            f"MB at start, {rss_held / MB:.1f} MB with all open ({per:,.0f} bytes per "
            f"connection); core RSS {core_start / MB:.1f} -> {core_held / MB:.1f} MB. No fixed "
            f"target."
        ),
        details={
            "stomp_rss_start_bytes": rss_start,
            "stomp_rss_held_bytes": rss_held,
            "stomp_bytes_per_connection": per,
            "core_rss_start_bytes": core_start,
            "core_rss_held_bytes": core_held,
            "connect_seconds": seconds,
        },
    )


SCENARIOS = [
    Scenario(
        "longpoll_fanout_10k",
        1000,
        "ms",
        "max",
        run_longpoll_fanout,
        about="one topic message to 10k waiting long polls (p99 publish -> answer)",
    ),
    Scenario(
        "stomp_connections_10k",
        None,
        "MB",
        None,
        run_stomp_connections,
        about="RSS of one STOMP process holding 10k subscribed connections",
    ),
]
