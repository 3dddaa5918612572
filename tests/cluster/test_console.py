"""Each node's console, in headless Chromium: its Cluster page links every node's console
(the ``admin_url`` each announces), marks the node it is on, and names each shard's leader:
what ``/api/cluster`` says, which the page reads."""

from __future__ import annotations

import pytest
from playwright.async_api import async_playwright, expect

from ..e2e.conftest import CHROMIUM_ARGS, WAIT, chromium
from .harness import Cluster

pytestmark = pytest.mark.timeout(180)


async def test_each_console_links_every_node_and_names_each_shards_leader(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    # once balanced: right after the cluster formed, the balancer may still be moving leads
    # (seen: shard 2 moved from n1 to n2 while the pages were read)
    leaders = cluster.wait_balanced()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1366, "height": 768})
        page.set_default_timeout(WAIT * 1000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        try:
            for node in cluster.nodes:
                await page.goto(f"{node.admin}/#/cluster")
                for other in cluster.nodes:
                    link = page.locator(f'#nodes a[data-node="{other.id}"]')
                    await expect(link).to_have_attribute("href", f"{other.admin}/")
                    row = page.locator(f'[data-node-row="{other.id}"]')
                    await expect(row).to_contain_text("ready")
                    if other is node:
                        await expect(row).to_contain_text("(this node)")
                    else:
                        await expect(row).not_to_contain_text("(this node)")
                rows = page.locator("#shards tbody tr")
                await expect(rows).to_have_count(len(leaders))
                for shard, leader in leaders.items():
                    cells = rows.nth(shard).locator("td")
                    await expect(cells.nth(0)).to_have_text(str(shard))
                    await expect(cells.nth(1)).to_have_text(leader.id)
            await page.screenshot(path="/tmp/console-shots/cluster-3-nodes-laptop.png")
            # a node's link leads to that node's own console
            other = cluster.nodes[1]
            await page.goto(f"{cluster.nodes[0].admin}/#/cluster")
            await page.locator(f'#nodes a[data-node="{other.id}"]').click()
            await expect(page.locator("#node")).to_contain_text(other.id)
            assert errors == []
        finally:
            await browser.close()
