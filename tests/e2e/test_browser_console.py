"""The core's console in headless Chromium: an operator follows the console's link to the
reload form, sets a log level, asks for the users files to be read again and lowers a limit,
and submits; the page shows the applied version, and the node and its frontends follow it
(a new password logs in over HTTP, a pull above the new limit is refused). (In a cluster the
form asks for the cluster secret: tests/cluster/test_formation.py.)"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from playwright.async_api import Browser, expect

from polymq_server.auth.provider import hash_password

from ..procs import PolymqProcess
from .conftest import WAIT

pytestmark = pytest.mark.timeout(120)
in_browser = pytest.mark.asyncio(loop_scope="module")
MS = WAIT * 1000


def write_users(path: Path, password: str) -> None:
    grants = [{"pattern": "*", "permissions": ["read", "write", "configure"]}]
    users = {
        "ops": {
            "password_hash": hash_password(password),
            "grants": grants,
            "tags": ["administrator"],  # the console and the admin API (docs/admin-api.md)
        }
    }
    path.write_text(json.dumps({"users": users}))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PolymqProcess, Path]]:
    root = tmp_path_factory.mktemp("console")
    users = root / "users.json"
    write_users(users, "before")
    with PolymqProcess("run", root / "run", "--auth", f"file:{users}") as proc:
        yield proc, users


def http_status(proc: PolymqProcess, password: str, path: str = "messages") -> int:
    r = requests.post(
        f"{proc.url('http')}/v1/queue/console-probe/{path}",
        json={"body": "x"},
        params={"max": 8} if path == "pull" else None,
        auth=("ops", password),
        timeout=WAIT,
    )
    return r.status_code


@in_browser
async def test_a_reload_from_the_console(
    browser: Browser, node: tuple[PolymqProcess, Path]
) -> None:
    proc, users = node
    assert http_status(proc, "before") == 200
    assert http_status(proc, "before", "pull") == 200
    write_users(users, "after")
    page = await browser.new_page(http_credentials={"username": "ops", "password": "before"})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        await page.goto(proc.url("admin") + "/")
        await page.get_by_role("link", name="reload the configuration").click()
        await expect(page.get_by_role("heading", name="Reload the configuration")).to_be_visible(
            timeout=MS
        )
        assert await page.locator("#secret").count() == 0  # one node: no cluster secret
        await page.select_option("#level", "INFO")
        await page.check("#users")
        await page.fill('[data-limit="max_pull"]', "7")
        await page.get_by_role("button", name="Reload").click()
        answer = page.get_by_role("status")
        await expect(answer).to_have_text(re.compile(r"configuration \d+ applied"), timeout=MS)
        version = (await answer.text_content() or "").split()[1]
        assert await page.locator("#version").text_content() == version
        assert errors == []
    finally:
        await page.close()
    for _ in range(50):  # the HTTP frontend hears it from the core (topic system.config)
        if http_status(proc, "after") == 200:
            break
        await asyncio.sleep(0.1)
    assert http_status(proc, "after") == 200
    assert http_status(proc, "before") == 401
    assert http_status(proc, "after", "pull") == 400  # max_pull is 7 now
    assert f"configuration {version} applied: log_level=INFO, users=True" in proc.log()
