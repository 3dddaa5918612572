"""What an operator does from the core's console, in headless Chromium, under a login
(``--auth``, HTTP Basic: the page's same-origin fetches and its EventSource carry it): peek,
publish, purge and delete on a destination's page, close a STOMP client's connection, and a
monitoring user told why a purge is refused. Every change is checked through the API."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import requests
import stomp
from playwright.async_api import Browser, Dialog, expect

from polymq_core.admin.auth import REMEMBER
from polymq_server.auth.provider import hash_password

from ..procs import PolymqProcess
from .conftest import WAIT, Collector, unique
from .test_console import LAPTOP, PHONE, Console

pytestmark = pytest.mark.timeout(180)
in_browser = pytest.mark.asyncio(loop_scope="module")
MS = WAIT * 1000
ADMIN = ("admin", "admin-password")
WATCHER = ("watcher", "watcher-password")


LEAVER = ("leaver", "leaver-password")  # a monitoring user whose password changes


def write_users(path: Path, leaver_password: str) -> None:
    grants = [{"pattern": "*", "permissions": ["read", "write", "configure"]}]
    logins = ((ADMIN, "administrator"), (WATCHER, "monitoring"))
    users = {
        name: {"password_hash": hash_password(password), "grants": grants, "tags": [tag]}
        for (name, password), tag in (*logins, ((LEAVER[0], leaver_password), "monitoring"))
    }
    path.write_text(json.dumps({"users": users}))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    root = tmp_path_factory.mktemp("console-actions")
    write_users(root / "users.json", LEAVER[1])
    env = {"POLYMQ_OVERVIEW_INTERVAL": "1"}
    auth = f"file:{root / 'users.json'}"
    with PolymqProcess("run", root / "run", "--auth", auth, env=env) as proc:
        yield proc


async def login(browser: Browser, node: PolymqProcess, who: tuple[str, str], size: Any) -> Console:
    context = await browser.new_context(
        viewport=size, http_credentials={"username": who[0], "password": who[1]}
    )
    page = await context.new_page()
    page.set_default_timeout(MS)
    console = Console(page, node.url("admin"))
    page.on("pageerror", lambda exc: console.errors.append(f"uncaught: {exc}"))
    page.on("console", lambda m: console.errors.append(m.text) if m.type == "error" else None)

    async def accept(dialog: Dialog) -> None:  # the console confirms what it changes
        await dialog.accept()

    page.on("dialog", accept)
    return console


@pytest_asyncio.fixture(loop_scope="module")
async def admin(browser: Browser, node: PolymqProcess) -> AsyncIterator[Console]:
    c = await login(browser, node, ADMIN, LAPTOP)
    try:
        yield c
    finally:
        await c.page.context.close()


def api(node: PolymqProcess, method: str, path: str, **kw: Any) -> requests.Response:
    return requests.request(method, f"{node.url('admin')}{path}", auth=ADMIN, timeout=WAIT, **kw)


def declare(node: PolymqProcess, q: str) -> None:
    r = requests.put(f"{node.url('http')}/v1/queue/{q}", auth=ADMIN, timeout=WAIT)
    assert r.status_code == 200, r.text


def publish(node: PolymqProcess, q: str, n: int) -> None:
    for i in range(n):
        r = requests.post(
            f"{node.url('http')}/v1/queue/{q}/messages",
            json={"body": f"m{i}"},
            auth=ADMIN,
            timeout=WAIT,
        )
        assert r.status_code == 200, r.text


def ready(node: PolymqProcess, q: str) -> int:
    r = api(node, "GET", f"/api/destinations/queue/{q}")
    assert r.status_code == 200, r.text
    return int(r.json()["ready"])


@in_browser
async def test_peek_publish_purge_and_delete_from_a_destinations_page(
    admin: Console, node: PolymqProcess
) -> None:
    q = unique("actions")
    # declared: a queue made by a publish alone is forgotten by the core as soon as it is
    # empty (after the purge below), and the page would then find it gone
    declare(node, q)
    publish(node, q, 4)
    page = admin.page
    await admin.show("overview")
    await expect(page.locator('[data-chart="messages"]')).to_have_attribute(
        "data-received", re.compile(r"^[1-9]")
    )  # the stream, too, logged in
    await admin.show(f"destinations/queue/{q}")
    await expect(page.locator('#details [data-field="ready"]')).to_have_text("4")
    await page.click("#peek")
    await expect(page.locator("#peeked tbody tr")).to_have_count(4)
    await expect(page.locator("#peeked pre.body")).to_have_text(["m0", "m1", "m2", "m3"])
    assert ready(node, q) == 4  # peeking consumed nothing
    await page.fill("#body", "from the console")
    await page.get_by_role("button", name="Publish").click()
    await expect(page.get_by_role("status")).to_contain_text("published message")
    assert ready(node, q) == 5
    await expect(page.locator('#details [data-field="ready"]')).to_have_text("5")
    await admin.shoot("destination-actions")
    await page.click("#purge")
    await expect(page.get_by_role("status")).to_have_text(f"purged 5 message(s) from queue/{q}")
    assert ready(node, q) == 0
    assert admin.errors == []
    await page.click("#delete")
    await expect(page).to_have_url(re.compile(r"#/destinations$"))
    # (a DELETE the browser sent again by itself, its kept-alive connection closed before
    # the answer, finds the queue gone: the console says so)
    await expect(page.get_by_role("status")).to_have_text(
        re.compile(rf"^deleted queue/{q}( \(it was already gone\))?$")
    )
    assert api(node, "GET", f"/api/destinations/queue/{q}").status_code == 404
    # from the delete on, only the browser's own line for a 404 (the page's refresh, or a
    # DELETE sent again, finding the queue gone)
    assert [e for e in admin.errors if "status of 404 (Not Found)" not in e] == []


@in_browser
async def test_the_close_button_closes_a_stomp_connection(
    admin: Console, node: PolymqProcess
) -> None:
    conn = stomp.Connection12([("127.0.0.1", node.ports["stomp"])])
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect(*ADMIN, wait=True)
    conn.subscribe(f"/queue/{unique('closeme')}", id="1")
    try:
        here = conn.transport.socket.getsockname()
        peer = f"{here[0]}:{here[1]}"
        await admin.show("connections")
        row = admin.page.locator("#connections tbody tr", has_text=peer)
        await expect(row).to_contain_text("stomp")
        await expect(row).to_contain_text("admin")  # its user
        await admin.shoot("connections")
        await row.get_by_role("button", name="Close").click()
        await expect(admin.page.get_by_role("status")).to_contain_text("closed connection")
        await expect(row).to_have_count(0)
        for _ in range(100):
            if not conn.is_connected():
                break
            await asyncio.sleep(0.1)
        assert not conn.is_connected()
        listed = api(node, "GET", "/api/connections").json()["connections"]
        assert peer not in [c["peer"] for c in listed]
        assert admin.errors == []
    finally:
        if conn.is_connected():
            conn.disconnect()


@in_browser
async def test_a_monitoring_user_sees_everything_and_is_told_why_a_purge_is_refused(
    browser: Browser, node: PolymqProcess
) -> None:
    q = unique("watched")
    publish(node, q, 2)
    watcher = await login(browser, node, WATCHER, PHONE)
    try:
        await watcher.show(f"destinations/queue/{q}")
        await expect(watcher.page.locator('#details [data-field="ready"]')).to_have_text("2")
        await watcher.page.click("#purge")
        status = watcher.page.get_by_role("status")
        await expect(status).to_contain_text("Not allowed (403)")
        await expect(status).to_contain_text("administrator")
        assert ready(node, q) == 2
        await watcher.show("connections")
        await expect(watcher.page.locator("#connections")).to_be_visible()
        await watcher.no_horizontal_scroll()
        await watcher.shoot("connections")
    finally:
        await watcher.page.context.close()


def test_without_a_login_the_console_is_refused(node: PolymqProcess) -> None:
    r = requests.get(f"{node.url('admin')}/", timeout=WAIT)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
    assert requests.get(f"{node.url('admin')}/", auth=ADMIN, timeout=WAIT).status_code == 200


@in_browser
async def test_a_login_that_stops_working_is_said(browser: Browser, node: PolymqProcess) -> None:
    leaver = await login(browser, node, LEAVER, LAPTOP)
    try:
        await leaver.show("destinations")
        await expect(leaver.page.locator("#destinations")).to_be_visible()
        # the leaver's password changes: a reload of the users file
        write_users(node.workdir.parent / "users.json", "another-password")
        r = await asyncio.to_thread(api, node, "POST", "/api/config/reload", json={"users": True})
        assert r.status_code == 200 and r.json()["applied_here"], r.text
        # the page's next reading (every 5 s; a login is remembered REMEMBER s) is refused
        problem = leaver.page.locator("#problem")
        await expect(problem).to_contain_text("Not logged in (401)", timeout=(REMEMBER + 10) * 1000)
        await leaver.shoot("unauthorized")
    finally:
        await leaver.page.context.close()
