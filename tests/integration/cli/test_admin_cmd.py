"""The operator's commands (``polymq destinations list``, ``connections list``, ``peek``,
``publish``, ``purge``, ``consume``) as a user runs them, against a ``polymq run``: tables,
``--json``, and clear errors with exit code 1 (2 for bad arguments)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import stomp

from polymq import Client

from ...cluster.harness import eventually, free_ports
from ...procs import PolymqProcess, serving


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    with serving("run", tmp_path_factory.mktemp("admin-cmd")) as proc:
        yield proc


def polymq(
    run: PolymqProcess | None, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "polymq_cli", *args]
    if run is not None:
        argv += ["--admin", run.url("admin")]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, input=stdin, env=dict(os.environ)
    )


def test_publish_peek_list_purge_and_consume(run: PolymqProcess) -> None:
    q = f"queue/cli-{uuid.uuid4().hex[:10]}"

    async def declare() -> None:  # (declared, it stays when emptied)
        async with await Client.connect("127.0.0.1", run.ports["core"]) as c:
            await c.declare(q, durable=True)

    asyncio.run(declare())
    done = polymq(run, "publish", q, "first", "--priority", "2", "--header", "k=v")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("published ") and "(seq 1)" in done.stdout
    assert polymq(run, "publish", q, "-", "--json", stdin="from stdin").returncode == 0
    table = polymq(run, "peek", q)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["SEQ", "PRIORITY", "CONTENT", "TYPE", "BODY"]
    assert lines[1].split()[:2] == ["2", "4"] and lines[1].endswith("from stdin")
    assert lines[2].split()[:2] == ["1", "2"] and lines[2].endswith("first")
    shown = json.loads(polymq(run, "peek", q, "--json", "--count", "1").stdout)["messages"]
    assert [m["body"] for m in shown] == ["from stdin"]
    listed = polymq(run, "destinations", "list", "--q", q.removeprefix("queue/"))
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[1].split()[:4] == [q, "2", "0", "0"]
    ranked = polymq(run, "destinations", "list", "--sort", "ready", "--desc", "--json")
    readies = [d["ready"] for d in json.loads(ranked.stdout)["destinations"]]
    assert readies == sorted(readies, reverse=True) and readies[0] >= 2
    consumed = polymq(
        None, "consume", q, "--count", "1", "--core", f"127.0.0.1:{run.ports['core']}"
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines()[1].endswith("from stdin")
    purged = polymq(run, "purge", q)
    assert (purged.returncode, purged.stdout.strip()) == (0, f"purged 1 messages from {q}")
    assert json.loads(polymq(run, "peek", q, "--json").stdout) == {"messages": []}


def test_connections_are_listed_and_closed(run: PolymqProcess) -> None:
    conn = stomp.Connection([("127.0.0.1", run.ports["stomp"])])
    conn.connect("cli-user", "pw", wait=True)
    try:
        table = polymq(run, "connections", "list")
        assert table.returncode == 0, table.stderr
        mine = [line.split() for line in table.stdout.splitlines() if " cli-user " in line]
        assert len(mine) == 1 and mine[0][1] == "stomp"
        closed = polymq(run, "connections", "close", mine[0][0])
        assert (closed.returncode, closed.stdout.strip()) == (0, f"closed {mine[0][0]}")
        again = polymq(run, "connections", "close", mine[0][0])
        assert again.returncode == 1 and "HTTP 404" in again.stderr
    finally:
        if conn.is_connected():
            conn.disconnect()


def test_errors_say_what_went_wrong(run: PolymqProcess) -> None:
    missing = polymq(run, "peek", f"queue/none-{uuid.uuid4().hex[:8]}")
    assert (
        missing.returncode == 1
        and "HTTP 404" in missing.stderr
        and "does not exist" in missing.stderr
    )
    assert missing.stdout == ""
    bad = polymq(run, "peek", "orders")
    assert bad.returncode == 1 and "a destination is kind/name" in bad.stderr
    topic = polymq(run, "purge", "topic/news")
    assert topic.returncode == 1 and "HTTP 409" in topic.stderr
    away = polymq(None, "destinations", "list", "--admin", "http://127.0.0.1:9", "--timeout", "2")
    assert away.returncode == 1 and "cannot reach the admin API" in away.stderr
    wrong = polymq(run, "peek", "queue/x", "--count", "many")
    assert wrong.returncode == 2


def test_connections_list_hides_polymqs_own_links_unless_all(run: PolymqProcess) -> None:
    """As the console's Connections page: the frontends' links to the core (user
    ``polymq-internal``; five in ``polymq run``) are hidden and counted; ``--all`` shows them."""
    conn = stomp.Connection([("127.0.0.1", run.ports["stomp"])])
    conn.connect("cli-own", "pw", wait=True)
    try:
        default = polymq(run, "connections", "list")
        everything = polymq(run, "connections", "list", "--all")
        as_json = json.loads(polymq(run, "connections", "list", "--json").stdout)
        all_json = json.loads(polymq(run, "connections", "list", "--all", "--json").stdout)
    finally:
        conn.disconnect()
    assert default.returncode == 0 and everything.returncode == 0, default.stderr
    rows = [line.split() for line in default.stdout.splitlines()[1:] if line[:1] != "("]
    users = [row[3] for row in rows]
    assert "cli-own" in users and "polymq-internal" not in users
    assert "5 of polymq's own links hidden: --all shows them" in default.stdout
    own = [line for line in everything.stdout.splitlines() if " polymq-internal " in line]
    assert len(own) == 5 and " cli-own " in everything.stdout
    assert "hidden" not in everything.stdout
    assert {c["user"] for c in as_json["connections"]} >= {"cli-own"}
    assert all(c["user"] != "polymq-internal" for c in as_json["connections"])
    assert sum(c["user"] == "polymq-internal" for c in all_json["connections"]) == 5


def test_without_a_login_the_commands_use_the_cluster_secret_of_the_environment(
    tmp_path: Path,
) -> None:
    """Two nodes of a replicated core run with ``--auth`` (a JetStream cluster answers once
    two servers are in it): with ``POLYMQ_CLUSTER_SECRET`` exported as the nodes have it, the
    operator's commands and ``cluster list`` need no other login, as ``cluster reload``."""
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": {"nobody": {"grants": []}}}))
    secret = uuid.uuid4().hex
    env = {"POLYMQ_CLUSTER_SECRET": secret}
    one, two = free_ports(2)
    peers = f"127.0.0.1:{one},127.0.0.1:{two}"
    nodes = []
    for name, port in (("one", one), ("two", two)):
        args = ["--node-id", name, "--peers", peers, "--cluster-port", str(port)]
        args += ["--auth", f"file:{users}"]
        nodes.append(PolymqProcess("core", tmp_path / name, *args, env=env))
    try:
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(n.start, 60) for n in nodes]:
                started.result()
        admin = nodes[0].url("admin")
        eventually(
            lambda: requests.get(f"{admin}/readyz", timeout=5).status_code == 200, 60, "ready"
        )
        # Ready means the core answers; node two shows in node one's list once its first
        # heartbeat is in (a CI run listed only "one" here).
        bearer = {"Authorization": f"Bearer {secret}"}

        def both_listed() -> bool:
            listed = requests.get(f"{admin}/api/cluster", headers=bearer, timeout=5).json()
            return {n["id"] for n in listed["nodes"]} == {"one", "two"}

        eventually(both_listed, 60, "node two in node one's list")
        commands = (
            ("cluster", "list"),
            ("destinations", "list"),
            ("connections", "list"),
            ("publish", "queue/cli-secret", "hi"),
            ("peek", "queue/cli-secret"),
        )
        with_secret = {**os.environ, "POLYMQ_CLUSTER_SECRET": secret}
        without = {k: v for k, v in with_secret.items() if k != "POLYMQ_CLUSTER_SECRET"}
        shown = {}
        for command in commands:
            argv = [sys.executable, "-m", "polymq_cli", *command, "--admin", admin]
            refused = subprocess.run(argv, capture_output=True, text=True, env=without, timeout=60)
            assert refused.returncode == 1 and "HTTP 401" in refused.stderr, (command, refused)
            done = subprocess.run(argv, capture_output=True, text=True, env=with_secret, timeout=60)
            assert done.returncode == 0, (command, done.stderr)
            shown[command[0]] = done.stdout.splitlines()
        assert {row.split()[0] for row in shown["cluster"][1:]} == {"one", "two"}
        assert shown["peek"][1].endswith("hi")  # what publish put there
    finally:
        for node in nodes:
            node.kill()
