"""The core's admin HTTP: metrics that parse and move, health, the cluster view, the console."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from polymq import Message

from ...procs import PolymqProcess
from .helpers import collect, connect, uid


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


async def test_metrics_parse_and_move_with_traffic(core: PolymqProcess) -> None:
    admin = core.url("admin")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{admin}/metrics") as r:
            assert r.status == 200
            before = _samples(await r.text())
        q = f"queue/{uid()}"
        async with await connect(core.ports["core"]) as c:
            await c.publish(q, [Message(b"m", persistent=True) for _ in range(10)])
            sub = await c.subscribe(q, ack_mode="client-individual")
            for d in await collect(sub, 10):
                d.ack()
            await c.stats(q)  # a round trip after the acks: they have been applied
            async with http.get(f"{admin}/metrics") as r:
                after = _samples(await r.text())
            await c.publish(f"queue/{uid()}", [Message(b"waiting") for _ in range(3)])
            async with http.get(f"{admin}/metrics") as r:
                waiting = _samples(await r.text())
    assert waiting[("polymq_ready_messages", (("kind", "queue"),))] == 3
    key = ("polymq_published_messages_total", (("kind", "queue"), ("protocol", "native")))
    assert after[key] - before.get(key, 0) == 10
    for name in ("polymq_delivered_messages_total", "polymq_acked_messages_total"):
        assert _total(after, name) - _total(before, name) == 10, name
    assert after[("polymq_connections", (("protocol", "native"),))] == 1
    assert _total(after, "polymq_store_commit_seconds_count") > _total(
        before, "polymq_store_commit_seconds_count"
    )  # the persistent publish was fsynced


async def test_health_cluster_view_and_console(core: PolymqProcess) -> None:
    admin = core.url("admin")
    q = uid("console")
    async with await connect(core.ports["core"]) as c:
        await c.publish(f"queue/{q}", b"waiting")
        async with aiohttp.ClientSession() as http:
            for path, status in (("/healthz", 200), ("/readyz", 200)):
                async with http.get(admin + path) as r:
                    assert r.status == status
            async with http.get(f"{admin}/api/cluster") as r:
                nodes = (await r.json())["nodes"]
            assert len(nodes) == 1 and nodes[0]["self"] and nodes[0]["connections"] == 1
            async with http.get(f"{admin}/api/destinations/queue/{q}") as r:
                assert (await r.json())["messages"] == 1
            async with http.get(f"{admin}/api/destinations/queue/bad%20name") as r:
                assert r.status == 400
                assert r.content_type == "application/problem+json"
            async with http.get(f"{admin}/") as r:
                page = await r.text()
            assert r.content_type == "text/html"
            # the console is a page that reads the JSON API (tests/e2e/test_console.py
            # drives it in Chromium); its scripts and the chart library are served here
            assert "/static/console.js" in page and "/metrics" in page
            for asset in ("console.js", "console.css", "uPlot.iife.min.js", "uPlot.min.css"):
                async with http.get(f"{admin}/static/{asset}") as r:
                    assert r.status == 200, (asset, await r.text())
            async with http.get(f"{admin}/static/..%2fadmin.py") as r:
                assert r.status == 404
