"""The STOMP frontend's page in headless Chromium: a person opens ``/`` on the WebSocket
listener, connects with @stomp/stompjs (served by the frontend, never a CDN), subscribes and
publishes; stomp.py over TCP is on the other end of each message."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from polymq_stomp import page as stomp_page

from ..procs import PolymqProcess
from .conftest import STOMPJS, WAIT, BrowserPage, StompPy, require_stompjs, unique

pytestmark = pytest.mark.timeout(120)
in_browser = pytest.mark.asyncio(loop_scope="module")
MS = WAIT * 1000


async def connect(bp: BrowserPage) -> None:
    """Open the page and press Connect, as a person would; wait until it says connected."""
    await bp.open()
    page = bp.page
    await expect(page.locator("#status")).to_have_text("not connected")
    await page.click("#connect")
    await expect(page.locator("#status")).to_have_text("connected (STOMP 1.2)", timeout=MS)
    # the browser offered v12/v11/v10.stomp; the frontend must have picked one (Chrome closes
    # the socket otherwise), and the page shows the one it got
    assert len(bp.websockets) == 1
    assert bp.websockets[0] == bp.origin.replace("http://", "ws://") + "/ws"
    assert [h.get("sec-websocket-protocol") for h in bp.handshakes] == ["v12.stomp"]
    await expect(page.locator("#subprotocol")).to_have_text("v12.stomp")


async def subscribe(bp: BrowserPage, destination: str) -> None:
    """Type a destination, press Subscribe, wait for the frontend's RECEIPT to show."""
    await bp.page.fill("#sub-dest", destination)
    await bp.page.click("#subscribe")
    item = bp.page.locator(f'#subscriptions li[data-destination="{destination}"]')
    await expect(item).to_have_class("active", timeout=MS)


async def publish(bp: BrowserPage, destination: str, body: str, content_type: str) -> None:
    """Fill the publish form, press Publish, wait for the frontend's RECEIPT to show."""
    page = bp.page
    await page.fill("#pub-dest", destination)
    await page.fill("#pub-content-type", content_type)
    await page.fill("#pub-body", body)
    await page.click("#publish")
    await expect(page.locator("#pub-status")).to_contain_text(f"sent to {destination}", timeout=MS)


def finish(bp: BrowserPage) -> None:
    bp.assert_only_local()
    assert not bp.errors, f"the page logged errors: {bp.errors}"


def test_stompjs_bundle_is_installed() -> None:
    """The page needs @stomp/stompjs from npm (the Makefile installs it); fail, never skip."""
    path = require_stompjs()
    assert path.stat().st_size > 10_000
    assert "StompJs" in path.read_text(encoding="utf-8", errors="replace")
    # and it is the file the frontend serves at /static/stomp.umd.min.js by default
    assert stomp_page.STOMPJS == STOMPJS


@in_browser
async def test_stomp_py_message_reaches_the_browser(
    browser_page: BrowserPage, stomp_tcp: Callable[[], StompPy]
) -> None:
    bp = browser_page
    q = f"/queue/{unique()}"
    await connect(bp)
    await subscribe(bp, q)

    sender = await asyncio.to_thread(stomp_tcp)
    body = "hello from stomp.py — ünïcode\nsecond line"
    sender.conn.send(
        q, body, content_type="text/plain", headers={"receipt": "r1", "x-trace": "abc-123"}
    )
    await sender.listener.wait_receipt("r1")

    message = bp.page.locator(f'#messages .message[data-destination="{q}"]')
    await expect(message).to_have_count(1, timeout=MS)
    assert await message.locator(".body").text_content() == body
    headers = await message.locator(".headers .header").all_text_contents()
    assert f"destination: {q}" in headers
    assert "content-type: text/plain" in headers
    assert "x-trace: abc-123" in headers
    assert await bp.page.evaluate("window.polymq.received") == [body]
    finish(bp)


@in_browser
async def test_browser_message_reaches_stomp_py(
    browser_page: BrowserPage, stomp_tcp: Callable[[], StompPy]
) -> None:
    bp = browser_page
    q = f"/queue/{unique()}"
    receiver = await asyncio.to_thread(stomp_tcp)
    receiver.conn.subscribe(q, id="s1", ack="auto", headers={"receipt": "sub"})
    await receiver.listener.wait_receipt("sub")

    await connect(bp)
    body = json.dumps({"from": "the browser", "n": 1, "text": "ünïcode ✓"})
    await publish(bp, q, body, "application/json")

    [msg] = await receiver.listener.wait_messages(1)
    assert msg.body == body
    assert msg.headers["destination"] == q
    assert msg.headers["content-type"] == "application/json"
    assert msg.headers["subscription"] == "s1"
    finish(bp)


@in_browser
async def test_a_person_on_a_topic_sees_both_sides(
    browser_page: BrowserPage, stomp_tcp: Callable[[], StompPy], tmp_path: Path
) -> None:
    """The page and stomp.py on one topic: each sees what the other publishes, and the page
    sees its own message too. Ends with a screenshot of the page for a person to look at."""
    bp = browser_page
    topic = f"/topic/{unique('demo')}"
    peer = await asyncio.to_thread(stomp_tcp)
    peer.conn.subscribe(topic, id="s1", headers={"receipt": "sub"})
    await peer.listener.wait_receipt("sub")

    await connect(bp)
    await subscribe(bp, topic)
    await publish(bp, topic, "hello from the browser", "text/plain")
    [got] = await peer.listener.wait_messages(1)
    assert (got.body, got.headers["content-type"]) == ("hello from the browser", "text/plain")

    peer.conn.send(topic, "hello from stomp.py", content_type="text/plain", headers={"x-n": "2"})
    bodies = bp.page.locator(f'#messages .message[data-destination="{topic}"] .body')
    await expect(bodies).to_have_text(["hello from the browser", "hello from stomp.py"], timeout=MS)
    await expect(bp.page.locator("#messages .message").last).to_contain_text("x-n: 2")

    shot = tmp_path / "stomp-page.png"
    await bp.page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert re.fullmatch(r"v1[012]\.stomp", await bp.page.text_content("#subprotocol") or "")
    finish(bp)


@in_browser
async def test_page_says_so_when_stompjs_is_not_served(browser: Browser, tmp_path: Path) -> None:
    """A frontend pointed at a missing bundle: the page tells the person, instead of a dead
    Connect button."""
    missing = tmp_path / "missing" / "stomp.umd.min.js"
    proc = PolymqProcess("run", tmp_path / "run", env={"POLYMQ_STOMP_STOMPJS": str(missing)})
    await asyncio.to_thread(proc.start)
    context = await browser.new_context()
    try:
        page = await context.new_page()
        origin = f"http://127.0.0.1:{proc.ports['stomp_ws']}"
        response = await page.request.get(origin + "/static/stomp.umd.min.js")
        assert response.status == 404
        assert "make install" in await response.text()
        await page.goto(origin + "/")
        status = page.locator("#status")
        await expect(status).to_have_text(re.compile("stomp.umd.min.js did not load"))
        await expect(status).to_have_class("error")
    finally:
        await context.close()
        await asyncio.to_thread(proc.kill)
