"""The memory alarm's marks on a real ``polymq core``, forced by configuration: with
``POLYMQ_MEMORY_HEADROOM=0.5`` and ``POLYMQ_MEMORY_LOW_WATERMARK=0.1`` and the high watermark
set by reloads to multiples of the memory the core uses, the alarm rises while the memory is
still under the mark (past half of it), stays on while the memory is between the two marks,
and clears only under the low one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from ...procs import PolymqProcess
from .helpers import eventually

pytestmark = pytest.mark.timeout(60)
WAIT = 10


@pytest.fixture
def core(tmp_path: Path) -> Iterator[PolymqProcess]:
    env = {"POLYMQ_MEMORY_HEADROOM": "0.5", "POLYMQ_MEMORY_LOW_WATERMARK": "0.1"}
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
