"""Fixtures for the browser tests: one ``polymq run`` and one headless Debian chromium per
module (Playwright drives it; it never downloads a browser of its own), a fresh page per test
that records every request and WebSocket it makes, and stomp.py clients over TCP."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
import stomp
from playwright.async_api import Browser, Page, async_playwright
from stomp.utils import Frame as StompPyFrame

from ..hashcost import cheap_password_hashes  # noqa: F401 (an autouse fixture, imported)
from ..integration.stomp.conftest import Recorder
from ..procs import PolymqProcess

WAIT = 10.0  # seconds to wait for something that should come at once
ROOT = Path(__file__).resolve().parents[2]
# where the Makefile's `npm ci` in services/stomp/web puts the bundle the page loads
STOMPJS = ROOT / "services/stomp/web/node_modules/@stomp/stompjs/bundles/stomp.umd.min.js"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require_stompjs() -> Path:
    """The stompjs bundle, or a failure (never a skip) that says how to install it."""
    if not STOMPJS.is_file():
        pytest.fail(
            f"@stomp/stompjs is not installed: {STOMPJS.relative_to(ROOT)} is missing. "
            "Run `make install` (or `make test`, which installs it with npm ci in "
            "services/stomp/web) and try again.",
            pytrace=False,
        )
    return STOMPJS


def unique(prefix: str = "e2e") -> str:
    """A destination name no other test uses."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def polymq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """One ``polymq run`` (core and every frontend) for the module."""
    with PolymqProcess("run", tmp_path_factory.mktemp("polymq")) as proc:
        yield proc


def chromium() -> str:
    """Debian's chromium, or a failure that says how to install it (never a browser download)."""
    found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if found is None:
        pytest.fail(
            f"{CHROMIUM} is missing: run `make chromium` (or `make test`), which installs "
            "Debian's chromium with apt",
            pytrace=False,
        )
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium, headless; launch() gives it a fresh user data dir."""
    executable = chromium()
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@dataclass
class BrowserPage:
    """A page on the STOMP frontend's listener and everything it did on the network."""

    page: Page
    origin: str  # http://127.0.0.1:<stomp_ws>
    requests: list[str] = field(default_factory=list)  # every HTTP(S) request URL
    websockets: list[str] = field(default_factory=list)  # every WebSocket URL it opened
    handshakes: list[dict[str, str]] = field(default_factory=list)  # 101 headers, lowercased
    errors: list[str] = field(default_factory=list)  # uncaught exceptions and console errors

    async def open(self) -> None:
        await self.page.goto(self.origin + "/")

    def assert_only_local(self) -> None:
        """The page loaded nothing from anywhere but the frontend that served it."""
        # the page itself, and stompjs from the frontend (not a CDN)
        for path in ("/", "/static/stomp.umd.min.js"):
            assert self.origin + path in self.requests, f"the page did not load {path}"
        port = urlsplit(self.origin).port
        for url in self.requests + self.websockets:
            if url.startswith("data:"):  # inline, never leaves the page
                continue
            parts = urlsplit(url)
            assert (parts.hostname, parts.port) == ("127.0.0.1", port), (
                f"the page reached outside the frontend: {url}"
            )


@pytest_asyncio.fixture(loop_scope="module")
async def browser_page(browser: Browser, polymq: PolymqProcess) -> AsyncIterator[BrowserPage]:
    """A fresh context and page that record their requests, WebSockets and the 101 responses
    (from the DevTools protocol, so not trusting the page's own account)."""
    require_stompjs()
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(WAIT * 1000)
    bp = BrowserPage(page, f"http://127.0.0.1:{polymq.ports['stomp_ws']}")
    page.on("request", lambda r: bp.requests.append(r.url))
    page.on("websocket", lambda ws: bp.websockets.append(ws.url))
    page.on("pageerror", lambda exc: bp.errors.append(f"uncaught: {exc}"))
    page.on("console", lambda m: bp.errors.append(m.text) if m.type == "error" else None)
    cdp = await context.new_cdp_session(page)
    cdp.on(
        "Network.webSocketHandshakeResponseReceived",
        lambda ev: bp.handshakes.append(
            {k.lower(): v for k, v in ev["response"]["headers"].items()}
        ),
    )
    await cdp.send("Network.enable")
    try:
        yield bp
    finally:
        await context.close()


class Collector(Recorder):
    """What stomp.py hands its listener, and a way to wait for it from another thread."""

    def _wait(self, check: Callable[[], bool], what: str, timeout: float) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: check() or bool(self.errors), timeout)
        assert not self.errors, f"stomp.py got an ERROR frame: {self.errors[0]}"
        assert ok, f"stomp.py: {what} not received within {timeout}s"

    async def wait_messages(self, n: int, timeout: float = WAIT) -> list[StompPyFrame]:
        what = f"{n} message(s)"
        await asyncio.to_thread(self._wait, lambda: len(self.messages) >= n, what, timeout)
        return list(self.messages)

    async def wait_receipt(self, receipt: str, timeout: float = WAIT) -> None:
        what = f"RECEIPT {receipt}"
        await asyncio.to_thread(self._wait, lambda: receipt in self.receipts, what, timeout)


@dataclass
class StompPy:
    conn: Any  # stomp.Connection12
    listener: Collector


@pytest.fixture
def stomp_tcp(polymq: PolymqProcess) -> Iterator[Callable[[], StompPy]]:
    """``stomp_tcp()``: a connected stomp.py client (STOMP 1.2 over TCP)."""
    made: list[StompPy] = []

    def make() -> StompPy:
        conn = stomp.Connection12([("127.0.0.1", polymq.ports["stomp"])])
        client = StompPy(conn, Collector())
        conn.set_listener("collector", client.listener)
        made.append(client)
        conn.connect(wait=True)
        return client

    yield make
    for client in made:
        if client.conn.is_connected():
            client.conn.disconnect()
