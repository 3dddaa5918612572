"""`make run`, as the README tells a newcomer: it starts, says where it listens, and a message
POSTed over HTTP can be pulled and acked over HTTP. Then Ctrl-C stops it cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import requests

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(120)
def test_make_run_then_post_pull_ack(tmp_path: Path) -> None:
    env = {**os.environ, "POLYMQ_DATA_DIR": str(tmp_path / "data")}
    p = subprocess.Popen(
        ["make", "-s", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Ctrl-C goes to the whole group, as in a terminal
    )
    lines: list[str] = []
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 90
        while not any("polymq ready" in line for line in lines):
            line = p.stdout.readline()
            assert line or p.poll() is None, "".join(lines)
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
        out = "".join(lines)
        http = re.search(r"polymq http\s+listening on (http://\S+)", out)
        assert http, out
        for name in ("core", "admin"):
            assert re.search(rf"polymq {name}\s+listening on", out), out
        # one process whatever the machine's CPUs (polymq run's own --workers auto would start
        # a worker per CPU past two): make, then polymq run, and nothing under it
        family = psutil.Process(p.pid).children(recursive=True)
        assert not [c for c in family if "polymq_cli.worker" in " ".join(c.cmdline())], family
        base = http.group(1)
        queue = f"{base}/v1/queue/makerun{os.getpid()}"
        r = requests.post(f"{queue}/messages", json={"body": "hello"}, timeout=10)
        assert r.status_code == 200, r.text
        r = requests.post(f"{queue}/pull", params={"max": 1, "wait": 5}, timeout=10)
        messages = r.json()["messages"]
        assert [m["body"] for m in messages] == ["hello"]
        r = requests.post(f"{base}/v1/ack", json={"receipts": [messages[0]["receipt"]]}, timeout=10)
        assert r.json()["settled"] == 1
        r = requests.post(f"{queue}/pull", params={"max": 1}, timeout=10)
        assert r.json()["messages"] == []  # acked: gone
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
        rest, _ = p.communicate(timeout=30)
    out = "".join(lines) + rest
    # make itself dies by the SIGINT it was sent; polymq under it must have stopped cleanly.
    assert p.returncode in (0, -signal.SIGINT), out
    assert "shutting down" in out and "Traceback" not in out, out
