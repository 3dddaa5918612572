"""The core's operator console (``/`` on the admin port) in headless Chromium: its pages load
without console errors, show what the test published (the overview's ready count, the
destination's depth), receive the overview's samples by SSE, and fit a phone's screen.
Screenshots of every page, at a laptop's and a phone's size, go to /tmp/console-shots/."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import requests
import stomp
from playwright.async_api import Browser, Page, expect

from polymq_core.admin.overview import LISTING_EVERY

from ..procs import PolymqProcess
from .conftest import WAIT, unique

pytestmark = pytest.mark.timeout(180)
in_browser = pytest.mark.asyncio(loop_scope="module")
MS = WAIT * 1000
SHOTS = Path("/tmp/console-shots")
LAPTOP = {"width": 1366, "height": 768}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """``polymq run`` sampling its overview every second (instead of 5)."""
    env = {"POLYMQ_OVERVIEW_INTERVAL": "1"}
    with PolymqProcess("run", tmp_path_factory.mktemp("console"), env=env) as proc:
        yield proc


@dataclass
class Console:
    page: Page
    admin: str
    errors: list[str] = field(default_factory=list)

    async def show(self, route: str) -> None:
        await self.page.goto(f"{self.admin}/#/{route}")

    async def shoot(self, name: str) -> None:
        size = self.page.viewport_size or LAPTOP
        kind = "phone" if size["width"] < 600 else "laptop"
        # (playwright makes the directory)
        await self.page.screenshot(path=str(SHOTS / f"{name}-{kind}.png"), full_page=True)

    async def no_horizontal_scroll(self) -> None:
        wide = await self.page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert wide[0] <= wide[1], f"the page is {wide[0]}px wide in a {wide[1]}px viewport"


async def open_console(browser: Browser, node: PolymqProcess, viewport: Any) -> Console:
    context = await browser.new_context(viewport=viewport)
    page = await context.new_page()
    page.set_default_timeout(MS)
    console = Console(page, node.url("admin"))
    page.on("pageerror", lambda exc: console.errors.append(f"uncaught: {exc}"))
    page.on("console", lambda m: console.errors.append(m.text) if m.type == "error" else None)
    return console


@pytest_asyncio.fixture(loop_scope="module")
async def console(browser: Browser, node: PolymqProcess) -> AsyncIterator[Console]:
    c = await open_console(browser, node, LAPTOP)
    try:
        yield c
    finally:
        await c.page.context.close()


def publish(node: PolymqProcess, destination: str, n: int) -> None:
    """``n`` messages through the HTTP frontend, each one acknowledged."""
    for i in range(n):
        r = requests.post(
            f"{node.url('http')}/v1/{destination}/messages", json={"body": f"m{i}"}, timeout=WAIT
        )
        assert r.status_code == 200, r.text


def api(node: PolymqProcess, path: str) -> Any:
    r = requests.get(f"{node.url('admin')}{path}", timeout=WAIT)
    assert r.status_code == 200, r.text
    return r.json()


@in_browser
async def test_the_overview_counts_what_was_published_and_charts_live_samples(
    console: Console, node: PolymqProcess
) -> None:
    before = api(node, "/api/overview")["messages"]["ready"]
    await console.show("overview")
    chart = console.page.locator('[data-chart="messages"]')
    await expect(chart).to_have_attribute("data-received", re.compile(r"^[1-9]"))
    shown = int(await chart.get_attribute("data-points") or 0)
    publish(node, f"queue/{unique('overview')}", 7)
    await expect(console.page.locator('[data-metric="ready"]')).to_have_text(str(before + 7))
    assert api(node, "/api/overview")["messages"]["ready"] == before + 7
    # more samples came by SSE, and went into the chart: no reload of the page
    await expect(chart).to_have_attribute("data-received", re.compile(r"^([3-9]|\d\d+)$"))
    assert int(await chart.get_attribute("data-points") or 0) > shown
    # clients per protocol (as /api/connections lists them, polymq's own links left out)
    client = stomp.Connection12([("127.0.0.1", node.ports["stomp"])])
    client.connect(wait=True)
    try:
        client.subscribe(f"/queue/{unique('overview')}", id="1")
        row = console.page.locator('#per-protocol [data-protocol="stomp"] td')
        await expect(row).to_have_text(["stomp", "1", "1"], timeout=(LISTING_EVERY + 10) * 1000)
        await expect(console.page.locator(".live.on")).to_be_visible()
        await console.shoot("overview")
    finally:
        client.disconnect()
    assert console.errors == []


@in_browser
async def test_a_destination_shows_its_depth_in_the_list_and_on_its_page(
    console: Console, node: PolymqProcess
) -> None:
    q = unique("depth")
    publish(node, f"queue/{q}", 5)
    await console.show("destinations")
    await console.page.fill("#filter", q)
    row = console.page.locator(f'[data-destination="queue/{q}"]')
    await expect(row.locator('[data-field="ready"]')).to_have_text("5")
    await expect(console.page.locator("#destinations tbody tr")).to_have_count(1)  # filtered
    await console.shoot("destinations")
    await row.get_by_role("link", name=f"queue/{q}").click()
    await expect(console.page.get_by_role("heading", name=f"queue/{q}")).to_be_visible()
    await expect(console.page.locator('#details [data-field="ready"]')).to_have_text("5")
    await expect(console.page.locator('#details [data-field="unacked"]')).to_have_text("0")
    await console.shoot("destination")
    assert console.errors == []


@in_browser
async def test_destinations_sort_by_their_depth_both_ways(
    console: Console, node: PolymqProcess
) -> None:
    prefix = unique("sort")
    for suffix, n in (("a", 2), ("b", 3), ("c", 1)):
        publish(node, f"queue/{prefix}{suffix}", n)
    await console.show("destinations")
    await console.page.fill("#filter", prefix)
    depths = console.page.locator('#destinations [data-field="ready"]')
    await expect(depths).to_have_text(["2", "3", "1"])  # by name first
    await console.page.click('button[data-sort="ready"]')
    await expect(depths).to_have_text(["1", "2", "3"])
    await console.page.click('button[data-sort="ready"]')
    await expect(depths).to_have_text(["3", "2", "1"])
    assert console.errors == []


@in_browser
async def test_the_cluster_page_shows_this_node_as_the_api_does(
    console: Console, node: PolymqProcess
) -> None:
    (me,) = api(node, "/api/cluster")["nodes"]
    await console.show("cluster")
    row = console.page.locator(f'[data-node-row="{me["id"]}"]')
    await expect(row).to_contain_text("(this node)")
    await expect(row).to_contain_text(me["state"])
    await console.shoot("cluster")
    assert console.errors == []


@in_browser
async def test_every_page_fits_a_phone(browser: Browser, node: PolymqProcess) -> None:
    q = unique("phone")
    publish(node, f"queue/{q}", 3)
    phone = await open_console(browser, node, PHONE)
    try:
        for route, name, ready in (
            ("overview", "overview", '[data-chart="rates (messages/s)"]'),
            ("destinations", "destinations", f'[data-destination="queue/{q}"]'),
            (f"destinations/queue/{q}", "destination", "#details"),
            ("cluster", "cluster", "#nodes"),
        ):
            await phone.show(route)
            await expect(phone.page.locator(ready)).to_be_visible()
            await phone.no_horizontal_scroll()
            await phone.shoot(name)
        assert phone.errors == []
    finally:
        await phone.page.context.close()


@in_browser
async def test_an_alarm_is_a_banner_and_a_lost_node_is_said(
    browser: Browser, tmp_path: Path
) -> None:
    env = {"POLYMQ_MEMORY_HIGH_WATERMARK": "2", "POLYMQ_OVERVIEW_INTERVAL": "1"}
    with PolymqProcess("core", tmp_path / "alarm", env=env) as core:
        c = await open_console(browser, core, LAPTOP)
        try:
            await c.show("overview")
            banner = c.page.locator('.alarm[data-alarm="memory"]')
            await expect(banner).to_contain_text("memory alarm is on")
            await expect(banner).to_contain_text("high watermark 2 B")
            await expect(c.page.locator('[data-gauge="memory"] .bar.over')).to_be_visible()
            await c.shoot("alarm")
            assert c.errors == []
            core.kill()
            await c.show("destinations")  # its fetch fails: the console says why
            await expect(c.page.locator("#problem")).to_contain_text("cannot be reached")
            await expect(c.page.locator(".live.off")).to_have_count(0)  # (not on this page)
        finally:
            await c.page.context.close()
