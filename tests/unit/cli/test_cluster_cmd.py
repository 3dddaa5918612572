"""``polymq cluster list`` and ``reload`` against a tiny HTTP server on 127.0.0.1 with a
canned ``/api/cluster`` and ``/api/config/reload``."""

from __future__ import annotations

import argparse
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from polymq_cli.cluster_cmd import add_arguments, format_table, run
from polymq_cli.main import main

NODES: list[dict[str, Any]] = [
    {
        "id": "node-a",
        "self": True,
        "state": "ready",
        "addresses": {"core": "10.0.0.1:7400", "http": "10.0.0.1:7480"},
        "admin_url": "http://10.0.0.1:7401",
        "shards_led": [0, 2],
        "applied": {"0": 12, "1": 3},
        "last_heard_seconds_ago": 0.0,
        "version": "0.1.0",
        "started": 1700000000.0,
        "config_version": 1700000000123,
    },
    {
        "id": "node-b",
        "self": False,
        "state": "unreachable",
        "addresses": {"core": "10.0.0.2:7400"},
        "admin_url": "http://10.0.0.2:7401",
        "shards_led": [],
        "applied": {},
        "last_heard_seconds_ago": 7.25,
        "version": "0.1.0",
        "started": 1700000001.0,
    },
]


class Canned(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes]] = {}
    posted: list[tuple[str, str, bytes]] = []  # (path, Authorization, body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.posted.append((self.path, self.headers.get("Authorization", ""), body))
        self.do_GET()

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def admin() -> Iterator[tuple[str, dict[str, tuple[int, bytes]]]]:
    routes: dict[str, tuple[int, bytes]] = {}
    handler = type("Handler", (Canned,), {"routes": routes, "posted": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        _SERVERS[url] = handler
        yield url, routes
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="polymq")
    add_arguments(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def test_table(
    admin: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, routes = admin
    routes["/api/cluster"] = (200, json.dumps({"nodes": NODES}).encode())
    assert run(parse("cluster", "list", "--admin", url + "/")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "STATE", "SHARDS", "LED", "LAST", "HEARD", "CONFIG",
                                "ADMIN", "URL", "CORE"]  # fmt: skip
    assert lines[1].split() == [
        "node-a", "*", "ready", "0,2", "0.0s", "ago", "1700000000123", "http://10.0.0.1:7401",
        "10.0.0.1:7400"
    ]  # fmt: skip
    assert lines[2].split() == [
        "node-b", "unreachable", "-", "7.2s", "ago", "-", "http://10.0.0.2:7401",
        "10.0.0.2:7400"
    ]  # fmt: skip
    # columns line up
    assert lines[0].index("STATE") == lines[1].index("ready") == lines[2].index("unreachable")


def test_json(
    admin: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, routes = admin
    routes["/api/cluster"] = (200, json.dumps({"nodes": NODES}).encode())
    # a bare host:port is taken as http://
    assert run(parse("cluster", "list", "--admin", url.removeprefix("http://"), "--json")) == 0
    assert json.loads(capsys.readouterr().out) == {"nodes": NODES}


def test_through_polymq_main(
    admin: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, routes = admin
    routes["/api/cluster"] = (200, json.dumps({"nodes": NODES[:1]}).encode())
    assert main(["cluster", "list", "--admin", url, "--timeout", "5"]) == 0
    assert "node-a *" in capsys.readouterr().out


def test_not_200(
    admin: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, routes = admin
    routes["/api/cluster"] = (503, b'{"status": "starting"}')
    assert run(parse("cluster", "list", "--admin", url)) == 1
    err = capsys.readouterr().err
    assert "HTTP 503" in err
    assert "starting" in err
    assert run(parse("cluster", "list", "--admin", url + "/nothing-here")) == 1
    assert "HTTP 404" in capsys.readouterr().err


@pytest.mark.parametrize("body", [b"<html>", b'{"nodes": 3}', b"[]"])
def test_not_the_answer(
    admin: tuple[str, dict[str, tuple[int, bytes]]],
    capsys: pytest.CaptureFixture[str],
    body: bytes,
) -> None:
    url, routes = admin
    routes["/api/cluster"] = (200, body)
    assert run(parse("cluster", "list", "--admin", url)) == 1
    assert "did not answer" in capsys.readouterr().err


def test_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert run(parse("cluster", "list", "--admin", f"127.0.0.1:{port}", "--timeout", "2")) == 1
    err = capsys.readouterr().err
    assert "cannot reach the admin API" in err
    assert f"http://127.0.0.1:{port}/api/cluster" in err


def test_format_table_tolerates_sparse_nodes() -> None:
    # e.g. a single node's /api/cluster before membership: a name and little else
    text = format_table([{"name": "solo", "self": True}])
    assert text.splitlines()[1].split() == ["solo", "*", "-", "-", "-", "-", "-", "-"]


def test_list_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("cluster")
    assert exit_.value.code == 2


def test_reload_posts_the_change_with_the_secret(
    admin: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, routes = admin
    routes["/api/config/reload"] = (200, b'{"version": 42, "applied_here": true, "error": null}')
    args = parse("cluster", "reload", "--admin", url, "--level", "DEBUG", "--users",
                 "--secret", "s" * 32)  # fmt: skip
    assert run(args) == 0
    assert "configuration 42 sent to every node" in capsys.readouterr().out
    handler_posted = _posted(url)
    assert handler_posted == [
        ("/api/config/reload", "Bearer " + "s" * 32, {"log_level": "DEBUG", "users": True})
    ]


def test_reload_sets_limits_given_as_numbers(
    admin: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, routes = admin
    routes["/api/config/reload"] = (200, b'{"version": 43, "applied_here": true, "error": null}')
    args = parse("cluster", "reload", "--admin", url, "--limit", "max_body=1024",
                 "--limit", "max_wait=2.5")  # fmt: skip
    assert run(args) == 0
    assert _posted(url)[-1][2] == {"limits": {"max_body": 1024, "max_wait": 2.5}}
    for bad in ("max_frame=1", "max_body", "max_body=big"):
        with pytest.raises(SystemExit) as exit_:
            parse("cluster", "reload", "--admin", url, "--limit", bad)
        assert exit_.value.code == 2
        assert "--limit" in capsys.readouterr().err


def test_reload_says_what_failed_and_needs_a_change(
    admin: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, routes = admin
    routes["/api/config/reload"] = (200, b'{"version": 7, "error": "users: no users file"}')
    assert run(parse("cluster", "reload", "--admin", url, "--users")) == 1
    assert "no users file" in capsys.readouterr().err
    assert run(parse("cluster", "reload", "--admin", url)) == 2
    assert "nothing to change" in capsys.readouterr().err
    routes["/api/config/reload"] = (401, b'{"detail": "send the cluster secret"}')
    assert run(parse("cluster", "reload", "--admin", url, "--level", "INFO")) == 1
    assert "HTTP 401" in capsys.readouterr().err


_SERVERS: dict[str, Any] = {}


def _posted(url: str) -> list[tuple[str, str, Any]]:
    handler = _SERVERS[url]
    return [(path, auth, json.loads(body)) for path, auth, body in handler.posted]
