"""A reload through the core's admin API reaches the frontends too: ``polymq run --auth
file:users.json`` is told to re-read its users file, and the HTTP, STOMP and AMQP frontends
(each with its own copy of the users) log users in with the new passwords; a limits reload
changes what the core accepts. (In a cluster every node applies it: tests/cluster.)"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import requests
import stomp

from polymq import Client
from polymq_server.auth.provider import hash_password

from ...procs import WAIT, PolymqProcess

REACH = 5.0  # seconds a reload may take to reach every frontend (issue 15: within 5 s)


ADMIN = ("root", "root-password")  # the operator: the admin API needs an administrator


def write_users(path: Path, password: str) -> None:
    grants = [{"pattern": "*", "permissions": ["read", "write", "configure"]}]
    users = {
        "alice": {"password_hash": hash_password(password), "grants": grants},
        ADMIN[0]: {"password_hash": hash_password(ADMIN[1]), "tags": ["administrator"]},
    }
    path.write_text(json.dumps({"users": users}))


def reload(proc: PolymqProcess, change: dict[str, Any]) -> dict[str, Any]:
    r = requests.post(
        f"{proc.url('admin')}/api/config/reload", json=change, auth=ADMIN, timeout=WAIT
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def http_ok(proc: PolymqProcess, password: str) -> bool:
    r = requests.post(
        f"{proc.url('http')}/v1/queue/reload-probe/messages",
        json={"body": "x"},
        auth=("alice", password),
        timeout=WAIT,
    )
    assert r.status_code in (200, 401), r.text
    return r.status_code == 200


def stomp_ok(proc: PolymqProcess, password: str) -> bool:
    conn = stomp.Connection12([("127.0.0.1", proc.ports["stomp"])], vhost="/")
    try:
        conn.connect("alice", password, wait=True)
    except stomp.exception.ConnectFailedException:
        return False
    conn.disconnect()
    return True


def amqp_ok(proc: PolymqProcess, password: str) -> bool:
    params = pika.ConnectionParameters(
        "127.0.0.1", proc.ports["amqp"], credentials=pika.PlainCredentials("alice", password)
    )
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.ProbableAuthenticationError:
        return False
    return True


def eventually(check: Callable[[], bool], within: float = REACH) -> float:
    """Seconds until ``check()`` held; fails after ``within``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within, f"{check} did not hold within {within} s"
        time.sleep(0.1)
    return time.monotonic() - start


def test_a_users_reload_reaches_every_frontend(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    write_users(users, "old-password")
    with PolymqProcess("run", tmp_path / "run", "--auth", f"file:{users}") as proc:
        logins = {"http": http_ok, "stomp": stomp_ok, "amqp": amqp_ok}
        for name, login in logins.items():
            assert login(proc, "old-password"), name
        write_users(users, "new-password")
        # nothing is re-read on its own
        for name, login in logins.items():
            assert not login(proc, "new-password"), name
        answer = reload(proc, {"users": True})
        assert answer["applied_here"] and answer["error"] is None
        for name, login in logins.items():
            eventually(lambda login=login: login(proc, "new-password"))  # type: ignore[misc]
            assert not login(proc, "old-password"), name
        log = proc.log()
        for frontend in ("http", "stomp", "amqp", "longpoll", "avro"):
            assert f"{frontend}: configuration {answer['version']} applied" in log, frontend


def test_a_limits_reload_changes_what_the_core_accepts(tmp_path: Path) -> None:
    with PolymqProcess("run", tmp_path / "run") as proc:
        url = f"{proc.url('http')}/v1/queue/reload-limits/messages"
        assert requests.post(url, json={"body": "y" * 2000}, timeout=WAIT).status_code == 200
        # a limit the core refuses (above max_frame) changes nothing, and says why
        answer = reload(proc, {"limits": {"max_body": 1 << 40}})
        assert not answer["applied_here"] and "POLYMQ_MAX_BODY" in answer["error"]
        assert requests.post(url, json={"body": "y" * 2000}, timeout=WAIT).status_code == 200
        answer = reload(proc, {"limits": {"max_body": 1000}})
        assert answer["applied_here"], answer
        r = requests.post(url, json={"body": "y" * 2000}, timeout=WAIT)
        assert r.status_code == 413, r.text
        assert requests.post(url, json={"body": "y" * 900}, timeout=WAIT).status_code == 200
        r = requests.post(
            f"{proc.url('admin')}/api/config/reload",
            json={"limits": {"max_frame": 10}},
            timeout=WAIT,
        )
        assert r.status_code == 400 and "limits" in r.json()["detail"], r.text


def test_a_frontend_that_may_not_hear_reloads_says_so(tmp_path: Path) -> None:
    """A frontend whose core login may not read topic/system.config logs how to fix it
    and keeps serving."""
    users = tmp_path / "users.json"
    grants = [{"pattern": "queue/*", "permissions": ["read", "write", "configure"]}]
    users.write_text(
        json.dumps({"users": {"svc": {"password_hash": hash_password("pw"), "grants": grants}}})
    )
    with PolymqProcess("core", tmp_path / "core", "--auth", f"file:{users}") as core:
        env = {
            "POLYMQ_CORE_PORT": str(core.ports["core"]),
            "POLYMQ_CORE_USER": "svc",
            "POLYMQ_CORE_PASSWORD": "pw",
        }
        with PolymqProcess("http", tmp_path / "http", env=env) as http:
            eventually(lambda: "will not hear configuration reloads" in http.log(), WAIT)
            assert 'give this frontend\'s core user the tag "administrator"' in http.log()
            r = requests.post(
                f"{http.url('http')}/v1/queue/still-serving/messages", json={"body": "z"},
                timeout=WAIT,
            )  # fmt: skip
            assert r.status_code == 200, r.text


def test_a_reload_reaches_system_config_subscribers_not_every_topics_pattern(
    tmp_path: Path,
) -> None:
    """The reload a node publishes on its topic system.config reaches a subscriber of that
    topic (and of ``system.#``), not one of ``#`` (AMQP's ``amq.topic`` with ``#``, STOMP's
    ``/topic/#``): the broker's own topics are reached only by patterns that name them."""

    async def run(proc: PolymqProcess) -> None:
        async with await Client.connect("127.0.0.1", proc.ports["core"]) as client:
            exact = await client.subscribe("topic/system.config")
            system = await client.subscribe("topic/system.#")
            every = await client.subscribe("topic/#")
            answer = await asyncio.to_thread(reload, proc, {"log_level": "INFO"})
            for sub in (exact, system):
                delivery = await sub.get(WAIT)
                while delivery.message.destination != "topic/system.config":
                    delivery = await sub.get(WAIT)  # system.# hears system.alarms as well
                got = json.loads(delivery.message.body)
                assert got["version"] == answer["version"]
            await client.publish("topic/app.news", b"app")
            assert (await every.get(WAIT)).message.body == b"app"  # (and nothing before it)

    with PolymqProcess("run", tmp_path / "run") as proc:
        asyncio.run(run(proc))
