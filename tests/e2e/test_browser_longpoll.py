"""The long-polling frontend's demo page in headless Chromium: a person opens ``/``, subscribes
through Server-Sent Events and through long polling (the page's JavaScript client, served by
the frontend, never a CDN), and receives what stomp.py over STOMP and requests over the JSON
HTTP frontend publish, while the ``polymq longpoll`` process is restarted under it: nothing
is lost, and topics and streams see nothing twice.

The processes are separate (``polymq core``, ``polymq http``, ``polymq stomp``, ``polymq
longpoll``) so that the longpoll one alone can be restarted, on the same port."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
import requests
import stomp
from playwright.async_api import Browser, Page, expect

from ..procs import PolymqProcess
from .conftest import WAIT, Collector, unique

pytestmark = pytest.mark.timeout(180)
in_browser = pytest.mark.asyncio(loop_scope="module")
MS = WAIT * 1000
LEASE = 3  # seconds a queue message is leased to the page's long poll


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _longpoll(workdir: Path, core: PolymqProcess, port: int) -> PolymqProcess:
    address = f"127.0.0.1:{core.ports['core']}"
    return PolymqProcess(
        "longpoll", workdir, "--core", address, "--longpoll-port", str(port)
    ).start()


@dataclass
class Cluster:
    workdir: Path
    core: PolymqProcess
    http: PolymqProcess
    stomp: PolymqProcess
    longpoll_port: int
    longpolls: list[PolymqProcess] = field(default_factory=list)  # the last one is running

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.longpoll_port}"

    @property
    def longpoll(self) -> PolymqProcess:
        return self.longpolls[-1]

    def start_longpoll(self) -> None:
        workdir = self.workdir / f"longpoll-{len(self.longpolls) + 1}"
        self.longpolls.append(_longpoll(workdir, self.core, self.longpoll_port))

    def restart_longpoll(self) -> None:
        """SIGTERM (it must exit 0), then a new process on the same port."""
        assert self.longpoll.stop() == 0, self.longpoll.log()
        self.start_longpoll()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = Path(tmp_path_factory.mktemp("longpoll-browser"))
    procs: list[PolymqProcess] = []
    longpolls: list[PolymqProcess] = []
    try:
        core = PolymqProcess("core", workdir / "core").start()
        procs.append(core)
        address = f"127.0.0.1:{core.ports['core']}"
        for name in ("http", "stomp"):
            procs.append(PolymqProcess(name, workdir / name, "--core", address).start())
        c = Cluster(workdir, core, procs[1], procs[2], _free_port(), longpolls)
        c.start_longpoll()
        yield c
        assert c.longpoll.stop() == 0, c.longpoll.log()
        for proc in reversed(procs):
            assert proc.alive, proc.log()
            assert proc.stop() == 0, proc.log()
    finally:
        for proc in procs + longpolls:
            proc.kill()


@dataclass
class DemoPage:
    page: Page
    origin: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def subscribe(self, destination: str, transport: str, **fields: str) -> None:
        """Fill the form and press Subscribe, as a person would; wait until connected."""
        page = self.page
        await page.fill("#sub-dest", destination)
        await page.select_option("#sub-transport", transport)
        await page.fill("#sub-offset", fields.get("offset", ""))
        await page.fill("#sub-visibility", fields.get("visibility", ""))
        await page.click("#subscribe")
        item = page.locator(
            f'#subscriptions li[data-destination="{destination}"][data-transport="{transport}"]'
        )
        await expect(item).to_have_class("connected", timeout=MS)

    async def received(self) -> dict[str, list[str]]:
        """What each subscription handed the page, in order: {destination: [body, ...]}."""
        rows: list[list[str]] = await self.page.evaluate(
            "polymqDemo.received.map(r => [r.destination, r.message.body])"
        )
        out: dict[str, list[str]] = {}
        for dest, body in rows:
            out.setdefault(dest, []).append(body)
        return out

    async def wait_for(self, want: dict[str, set[str]], timeout: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            got = await self.received()
            missing = {d: sorted(w - set(got.get(d, []))) for d, w in want.items()}
            if not any(missing.values()):
                return
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"the page never received: {missing}")
            await asyncio.sleep(0.1)

    def assert_only_local(self) -> None:
        port = urlsplit(self.origin).port
        for path in ("/", "/polymq-longpoll.js"):
            assert self.origin + path in self.requests, f"the page did not load {path}"
        for url in self.requests:
            parts = urlsplit(url)
            assert (parts.hostname, parts.port) == ("127.0.0.1", port), f"left the frontend: {url}"


@pytest_asyncio.fixture(loop_scope="module")
async def demo(browser: Browser, cluster: Cluster) -> AsyncIterator[DemoPage]:
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(MS)
    dp = DemoPage(page, cluster.origin)
    page.on("request", lambda r: dp.requests.append(r.url))
    page.on("pageerror", lambda exc: dp.errors.append(f"uncaught: {exc}"))
    page.on("console", lambda m: dp.errors.append(m.text) if m.type == "error" else None)
    try:
        await page.goto(cluster.origin + "/")
        await expect(page.locator("#status")).to_have_text("ready")
        yield dp
    finally:
        await context.close()


class Publishers:
    """stomp.py over TCP and requests over the JSON HTTP frontend, taking turns."""

    def __init__(self, cluster: Cluster) -> None:
        self.http = f"{cluster.http.url('http')}/v1"
        self.listener = Collector()
        self.conn = stomp.Connection12([("127.0.0.1", cluster.stomp.ports["stomp"])])
        self.conn.set_listener("collector", self.listener)
        self.conn.connect(wait=True)
        self.n = 0

    async def publish(self, destination: str, body: str) -> None:
        self.n += 1
        if self.n % 2:
            receipt = f"r-{uuid.uuid4().hex[:8]}"
            self.conn.send(
                f"/{destination}", body, content_type="text/plain", headers={"receipt": receipt}
            )
            await self.listener.wait_receipt(receipt)
        else:
            r = await asyncio.to_thread(
                requests.post,
                f"{self.http}/{destination}/messages",
                json={"body": body},
                timeout=10,
            )
            assert r.status_code == 200, r.text

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect()


def test_the_javascript_client_is_served_as_a_module(cluster: Cluster) -> None:
    r = requests.get(cluster.origin + "/polymq-longpoll.js", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/javascript")
    assert "export class PolymqLongpoll" in r.text and "EventSource" in r.text
    page = requests.get(cluster.origin + "/", timeout=10).text
    assert 'from "./polymq-longpoll.js"' in page and "https://" not in page.split("<script")[1]


@in_browser
async def test_the_page_receives_over_sse_and_long_polling_across_a_restart(
    demo: DemoPage, cluster: Cluster
) -> None:
    name = unique("lp")
    topic, stream, queue = f"topic/{name}.news", f"stream/{name}", f"queue/{name}"
    await demo.subscribe(f"topic/{name}.*", "sse")
    await demo.subscribe(stream, "poll", offset="next")
    await demo.subscribe(queue, "poll", visibility=str(LEASE))
    publishers = Publishers(cluster)
    sent: dict[str, list[str]] = {topic: [], stream: [], queue: []}

    async def publish(phase: str, count: int) -> None:
        for i in range(count):
            for dest in sent:
                body = f"{phase}-{i}-{dest.split('/')[0]}"
                await publishers.publish(dest, body)
                sent[dest].append(body)

    try:
        await publish("before", 10)
        await demo.wait_for({f"topic/{name}.*": set(sent[topic]), stream: set(sent[stream]),
                             queue: set(sent[queue])})  # fmt: skip
        # the longpoll process goes away (SIGTERM) while publishing goes on, and comes back
        stop = asyncio.create_task(asyncio.to_thread(cluster.restart_longpoll))
        await publish("during", 10)
        await stop
        await publish("after", 10)
        # and a message from the page itself, through the same frontend
        await demo.page.fill("#pub-dest", topic)
        await demo.page.fill("#pub-body", "from the page")
        await demo.page.click("#publish")
        await expect(demo.page.locator("#pub-status")).to_have_text(f"sent to {topic}")
        sent[topic].append("from the page")
        await demo.wait_for(
            {
                f"topic/{name}.*": set(sent[topic]),
                stream: set(sent[stream]),
                queue: set(sent[queue]),
            },
            timeout=LEASE + 30,
        )
    finally:
        publishers.close()
    got = await demo.received()
    # topic (SSE) and stream (long polling): everything, in order, once
    assert got[f"topic/{name}.*"] == sent[topic]
    assert got[stream] == sent[stream]
    # queue (long polling, acked by the page): everything; a lease cut by the restart may
    # come back once more (at least once), so duplicates are allowed, losses are not
    assert set(got[queue]) == set(sent[queue])
    # every subscription resumed from its cursor and is connected again
    states: list[dict[str, Any]] = await demo.page.evaluate(
        "polymqDemo.subscriptions.map(s => ({dest: s.destination, status: s.status, "
        "reconnects: s.reconnects, transport: s.transport}))"
    )
    assert [s["status"] for s in states] == ["connected"] * 3, states
    assert all(s["reconnects"] >= 1 for s in states), states
    for li in await demo.page.locator("#subscriptions li").all():
        await expect(li).to_have_class("connected")
    metrics = (await asyncio.to_thread(requests.get, cluster.origin + "/metrics", timeout=10)).text
    assert 'polymq_longpoll_reconnects_total{transport="sse"}' in metrics
    assert 'polymq_longpoll_reconnects_total{transport="poll"}' in metrics
    demo.assert_only_local()
    # while the process was down the browser logged its refused connections; nothing else
    unexpected = [e for e in demo.errors if "ERR_CONNECTION_REFUSED" not in e]
    assert not unexpected, unexpected


@in_browser
async def test_a_plain_event_source_reads_a_subscription(demo: DemoPage, cluster: Cluster) -> None:
    """The endpoint is plain SSE: the browser's own EventSource, no client library."""
    dest = f"stream/{unique('es')}"
    lp = cluster.origin

    def prepare() -> str:
        sub = requests.post(
            f"{lp}/v1/subscriptions", json={"destination": dest, "offset": "first"}, timeout=10
        ).json()
        for i in range(3):
            requests.post(f"{lp}/v1/{dest}/messages", json={"body": f"m{i}"}, timeout=10)
        return str(sub["id"])

    sub_id = await asyncio.to_thread(prepare)
    got = await demo.page.evaluate(
        """(url) => new Promise((resolve, reject) => {
             const seen = [];
             const source = new EventSource(url);
             source.onmessage = (e) => {
               seen.push([e.lastEventId, JSON.parse(e.data).body]);
               if (seen.length === 3) { source.close(); resolve(seen); }
             };
             setTimeout(() => { source.close(); reject(new Error("timeout")); }, 10000);
           })""",
        f"{lp}/v1/subscriptions/{sub_id}/events",
    )
    assert got == [["1", "m0"], ["2", "m1"], ["3", "m2"]]


@in_browser
async def test_the_fetch_stream_reader_and_a_dead_subscription(
    demo: DemoPage, cluster: Cluster
) -> None:
    """With credentials the client reads SSE through fetch(); a subscription removed at the
    core is final (status "failed"), not retried forever."""
    dest = f"topic/{unique('fx')}"
    result = await demo.page.evaluate(
        """async (dest) => {
             const { PolymqLongpoll } = await import("/polymq-longpoll.js");
             const client = new PolymqLongpoll({ token: "anything" });  // anonymous mode
             const seen = [];
             const sub = await client.subscribe(dest, { transport: "sse",
                                                        onMessage: (m) => seen.push(m.body),
                                                        onError: () => {} });
             for (let i = 0; i < 300 && sub.status !== "connected"; i++)
               await new Promise((r) => setTimeout(r, 100));
             await client.publish(dest, "via fetch");
             for (let i = 0; i < 300 && seen.length < 1; i++)
               await new Promise((r) => setTimeout(r, 100));
             const usedFetch = sub._useFetch;
             // removed behind its back: the next connection learns it is gone
             await client.request("DELETE", `/v1/subscriptions/${sub.id}`);
             for (let i = 0; i < 300 && sub.status !== "failed"; i++)
               await new Promise((r) => setTimeout(r, 100));
             return { seen, usedFetch, status: sub.status };
           }""",
        dest,
    )
    assert result["seen"] == ["via fetch"]
    assert result["usedFetch"] is True
    assert result["status"] == "failed", result
