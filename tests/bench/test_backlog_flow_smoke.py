"""The ``backlog`` and ``fast_producer`` scenarios run end to end at a tiny size (20,000
messages; 8 seconds) and write their figures and verdicts.

Like ``test_bench_smoke.py`` this checks the harness, not the figures: the performance targets
are read from ``make bench``. What is asserted is what must hold at any size: the backlog is
delivered whole and in order across a restart, and the held producer loses no confirmed
message and keeps its connection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_backlog_and_fast_producer_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [
        sys.executable, "-m", "bench", "--quick", "--no-pin", "--out", str(out),
        "--only", "backlog,fast_producer",
        "--backlog-messages", "20000", "--set", "backlog.memory_messages=10000",
        "--set", "backlog.window=5000",  # (20,000 of 1 KB fit the default window)
        "--fast-producer-seconds", "8",
    ]  # fmt: skip
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout + r.stderr
    by_name = {s["name"]: s for s in json.loads(out.read_text())["scenarios"]}

    b = by_name["backlog"]
    assert b["status"] == "ok", (b.get("error"), b.get("traceback"))
    d = b["details"]
    assert d["queue_stats_when_full"]["paged"] > 0  # past the window: it paged
    assert d["drain_deliveries"] >= 20_000 and d["drain_out_of_order"] == 0
    assert d["restart_readyz_status"] == 200 and d["restart_first_delivery_seconds"] > 0
    assert d["in_memory"]["drain_msg_per_s"] > 0
    assert set(b["targets"]) == {
        "rss_le_1gb",
        "drain_ge_half_in_memory",
        "restart_first_delivery_le_5s",
    }
    assert all(isinstance(t["met"], bool) and t["at_scale"] is False for t in b["targets"].values())

    f = by_name["fast_producer"]
    assert f["status"] == "ok", (f.get("error"), f.get("traceback"))
    assert f["details"]["producer_confirmed"] > 0
    assert f["targets"]["no_message_lost"]["met"], f["targets"]["no_message_lost"]
    assert f["targets"]["producer_not_disconnected"]["met"], f["details"]["producer_disconnected"]
    assert all(isinstance(t["met"], bool) for t in f["targets"].values())
