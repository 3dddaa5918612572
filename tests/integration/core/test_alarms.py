"""The memory alarm's marks on a real ``polymq core``, forced by configuration: with
``POLYMQ_MEMORY_HEADROOM=0.5`` and ``POLYMQ_MEMORY_LOW_WATERMARK=0.1`` and the high watermark
set by reloads to multiples of the memory the core uses, the alarm rises while the memory is
still under the mark (past half of it), stays on while the memory is between the two marks,
and clears only under the low one. Past the low mark, paging queues squeeze their window
(``POLYMQ_QUEUE_WINDOW_MESSAGES=80``: to 10) and keep the rest in the store, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from polymq import Message

from ...procs import PolymqProcess
from .helpers import bodies, collect, connect, eventually, uid

pytestmark = pytest.mark.timeout(60)
WAIT = 10


@pytest.fixture
def core(tmp_path: Path) -> Iterator[PolymqProcess]:
    env = {
        "POLYMQ_MEMORY_HEADROOM": "0.5",
        "POLYMQ_MEMORY_LOW_WATERMARK": "0.1",
        "POLYMQ_QUEUE_WINDOW_MESSAGES": "80",
    }
    with PolymqProcess("core", tmp_path / "core", env=env) as proc:
        yield proc


def api(core: PolymqProcess) -> dict[str, Any]:
    doc: dict[str, Any] = requests.get(f"{core.url('admin')}/api/alarms", timeout=WAIT).json()
    return doc


def set_mark(core: PolymqProcess, mark: int) -> None:
    r = requests.post(
        f"{core.url('admin')}/api/config/reload",
        json={"limits": {"memory_high_watermark": mark}},
        timeout=WAIT,
    )
    assert r.json()["applied_here"], r.text


async def measured_with(core: PolymqProcess, mark: int) -> dict[str, Any]:
    """The alarms once the core has measured against ``mark`` (its detail names it)."""
    await asyncio.to_thread(set_mark, core, mark)
    return await eventually(  # type: ignore[no-any-return]
        lambda: (doc := api(core))["memory"]["limit"] == mark and doc, within=WAIT
    )


async def test_the_memory_alarm_rises_under_the_mark_and_clears_under_the_low_one(
    core: PolymqProcess,
) -> None:
    doc = await asyncio.to_thread(api, core)
    assert doc["alarms"] == [], doc  # (the default mark: 0.4 of the machine's memory)
    mark = doc["memory"]["limit"]
    assert doc["memory"]["rises_at"] == pytest.approx(mark / 2, abs=1)
    assert doc["memory"]["clears_at"] == pytest.approx(mark / 10, abs=1)
    used = doc["memory"]["used"]

    # a mark half again what it uses: under the mark, but past half of it, so the alarm is on
    doc = await measured_with(core, used * 3 // 2)
    await eventually(lambda: api(core)["alarms"] == ["memory"], within=WAIT)
    doc = await asyncio.to_thread(api, core)
    assert doc["memory"]["used"] < doc["memory"]["limit"], doc
    assert "memory alarm on" in core.log() and "rises at" in core.log()

    # four times: under where it rises now (2x), above where it clears (0.4x): still on
    doc = await measured_with(core, used * 4)
    assert doc["alarms"] == ["memory"], doc
    assert doc["memory"]["clears_at"] <= doc["memory"]["used"] < doc["memory"]["rises_at"], doc
    assert "memory alarm cleared" not in core.log()

    # twenty times: it clears under 2x what it used
    doc = await measured_with(core, used * 20)
    await eventually(lambda: api(core)["alarms"] == [], within=WAIT)
    assert "memory alarm cleared" in core.log() and "clears under" in core.log()


async def test_past_the_low_watermark_a_paging_queue_keeps_less_in_memory(
    core: PolymqProcess,
) -> None:
    used = (await asyncio.to_thread(api, core))["memory"]["used"]
    messages = [Message(b"m%02d" % i, persistent=True) for i in range(50)]
    free, pressed = f"queue/{uid()}", f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        for q in (free, pressed):
            await c.declare(q, durable=True)
        await c.publish(free, messages)
        assert (await c.stats(free)).paged == 0  # 50 of a window of 80: all in memory

        # four times what it uses: past the low mark (0.4x), under where the alarm rises (2x)
        doc = await measured_with(core, used * 4)
        assert doc["alarms"] == [] and doc["memory"]["pressure"], doc
        await c.publish(pressed, messages)
        assert (await c.stats(pressed)).paged == 40  # a window of 10 in memory

        await measured_with(core, used * 20)  # no pressure: the pages come back, in order
        sub = await c.subscribe(pressed, prefetch=100)
        assert bodies(await collect(sub, 50)) == [m.body for m in messages]


async def test_a_publisher_held_by_the_alarm_longer_than_its_heartbeat_is_not_cut_off(
    core: PolymqProcess,
) -> None:
    """A held publisher's connection is not read, pings included; the core says a word of
    its own (``Ok`` for request 0) every second meanwhile, so a client whose heartbeat is
    much shorter than the hold keeps its connection, and its publish is answered once the
    alarm clears."""
    used = (await asyncio.to_thread(api, core))["memory"]["used"]
    q = f"queue/{uid()}"
    async with await connect(core.ports["core"], heartbeat=2.0) as c:
        await c.publish(q, [Message(b"first")])  # (a native publisher: held by alarms)
        await measured_with(core, used * 3 // 2)
        await eventually(lambda: api(core)["alarms"] == ["memory"], within=WAIT)
        held = asyncio.ensure_future(c.publish(q, [Message(b"second")]))
        await asyncio.sleep(6.0)  # a core silent after a ping would be left within 4 s
        assert not held.done(), "the publisher was not held by the alarm"
        assert not c.closed, c.close_reason
        await measured_with(core, used * 20)
        assert (await asyncio.wait_for(held, WAIT)).count == 1
        assert not c.closed
