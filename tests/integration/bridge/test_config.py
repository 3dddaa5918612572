"""The bridge's command line: a bad links file (or none) is a clear error and exit code 2;
a RabbitMQ that is not there is waited for, and ``/readyz`` says so meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ...procs import PolymqProcess
from ...rabbit import free_port
from .conftest import BridgeProcess

pytestmark = pytest.mark.timeout(60)


def run_bridge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymq_bridge.main", "--bridge-port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not valid JSON"),
        ('{"links": []}', '"links" must be a non-empty list'),
        ('{"links": [{"name": "a"}]}', 'links[0] (a): "direction" is missing'),
        (
            json.dumps(
                {
                    "links": [
                        {
                            "name": "x",
                            "direction": "rabbitmq-to-polymq",
                            "queue": "q",
                            "destination": "queue/d",
                            "prefetch": 0,
                        }
                    ]
                }
            ),
            'links[0] (x): "prefetch" must be 1..10000, not 0',
        ),
        (
            json.dumps(
                {"links": [{"name": "x", "direction": "polymq-to-rabbitmq", "source": "topic/t"}]}
            ),
            '"source" must be a polymq queue/<name> or stream/<name>',
        ),
        (
            json.dumps({"links": [{"name": "x", "direction": "sideways"}]}),
            '"direction" must be "polymq-to-rabbitmq" or "rabbitmq-to-polymq"',
        ),
        (
            json.dumps(
                {
                    "links": [
                        {
                            "name": "x",
                            "direction": "rabbitmq-to-polymq",
                            "queue": "q",
                            "destination": "queue/d",
                            "colour": 1,
                        }
                    ]
                }
            ),
            'unknown key(s) "colour"',
        ),
    ],
)
def test_a_bad_links_file_is_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "links.json"
    path.write_text(text)
    r = run_bridge("--config", str(path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "polymq bridge: configuration error: " in r.stderr
    assert str(path) in r.stderr
    assert expected in r.stderr, r.stderr


def test_no_links_file(tmp_path: Path) -> None:
    r = run_bridge()
    assert r.returncode == 2
    assert "no links file: set POLYMQ_BRIDGE_CONFIG or pass --config FILE" in r.stderr
    r = run_bridge("--config", str(tmp_path / "nope.json"))
    assert r.returncode == 2
    assert "nope.json: no such file" in r.stderr


def test_bad_settings(tmp_path: Path) -> None:
    path = tmp_path / "links.json"
    path.write_text(json.dumps({"links": [{"name": "a", "direction": "rabbitmq-to-polymq",
                                           "queue": "q", "destination": "queue/d"}]}))  # fmt: skip
    r = run_bridge("--config", str(path), "--rabbitmq-url", "http://example.com/")
    assert r.returncode == 2
    assert "POLYMQ_BRIDGE_RABBITMQ_URL='http://example.com:5672/' must look like amqp://" in (
        r.stderr
    )
    r = run_bridge("--config", str(path), "--core", "localhost:notaport")
    assert r.returncode == 2
    assert "--core 'localhost:notaport'" in r.stderr and "expected HOST:PORT" in r.stderr


def test_waits_for_a_rabbitmq_that_is_not_there(tmp_path: Path, core: PolymqProcess) -> None:
    bridge = BridgeProcess(
        tmp_path / "b",
        [
            {
                "name": "in",
                "direction": "rabbitmq-to-polymq",
                "queue": "q",
                "destination": "queue/d",
            }
        ],
        rabbit_url=f"amqp://guest:guest@127.0.0.1:{free_port()}/",
        core_port=core.ports["core"],
    ).start()
    try:
        bridge.wait_metric("polymq_bridge_connect_failures_total", 2, side="rabbitmq")
        status, body = bridge.get("/readyz")
        assert status == 503
        doc = json.loads(body)
        assert doc["rabbitmq"]["connected"] is False and doc["core"]["connected"] is True
        assert "not connected to rabbitmq" in doc["problems"][0]
        assert doc["links"][0]["state"] == "waiting for RabbitMQ"
        assert bridge.metric("polymq_bridge_connected", side="rabbitmq") == 0
        assert bridge.stop() == 0, bridge.log()
        assert "Traceback" not in bridge.log()
    finally:
        bridge.kill()
