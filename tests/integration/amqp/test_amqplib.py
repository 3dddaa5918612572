"""amqplib (Node.js) against polymq and RabbitMQ (issue 16): ``node/patterns.js`` runs
amqplib's direct reply-to example, an exchange-to-exchange binding from ``amq.topic``, a
FIFO queue with priorities, consumer priorities and update-secret, and prints what it saw;
both brokers must show the same. amqplib comes from npm (``make install``: ``npm ci`` in
``tests/integration/amqp/node``); without it or without node the test is skipped."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import Target

pytestmark = pytest.mark.timeout(90)

NODE_DIR = Path(__file__).with_name("node")


def test_rabbitmq_patterns_with_amqplib(target: Target) -> None:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "amqplib").is_dir():
        pytest.skip(
            "node or amqplib missing (make install runs npm ci in tests/integration/amqp/node)"
        )
    run = subprocess.run(
        [node, str(NODE_DIR / "patterns.js"), target.url()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    caps = seen["capabilities"]
    for cap in (
        "exchange_exchange_bindings",
        "connection.blocked",
        "consumer_priorities",
        "direct_reply_to",
    ):
        assert caps[cap] is True, cap
    assert seen["reply"] == ["PING", "c1"]
    (e2e,) = seen["e2e"]  # of three keys, the one amq.topic's pattern matches
    assert e2e.endswith(".a")
    assert seen["fifo"] == [["a", 0], ["b", 7], ["c", None]]
    assert seen["consumer_priorities"] == {"high": ["1"], "low": ["2", "3"]}
    assert seen["update_secret"] == "ok"
