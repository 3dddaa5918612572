"""``polymq_server.sessions.frontend``: what the STOMP and AMQP frontends share (no sockets are
opened)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, cast

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from polymq.addresses import Address
from polymq.client import Client
from polymq_server.link.corelink import CORE_FAILOVER, CoreLink
from polymq_server.sessions.frontend import (
    FrontendMetrics,
    FrontendSession,
    add_admin_routes,
    admin_runner,
    core_link,
    not_ready,
    shutdown_sessions,
    tls_context,
)
from polymq_server.web.requestmetrics import PROMETHEUS


class _Metrics(FrontendMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.declare_shared(registry, "demo", "DEMO")


@dataclass
class _Settings:
    host: str = "127.0.0.1"
    core_host: str = "core.example"
    core_port: int = 7400
    auth: str = "anonymous"
    core_user: str | None = "fe"
    core_password: str | None = "pw"
    core_token: str | None = None
    core_tls: bool = False
    core_tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def check(self) -> None:
        pass


class _Client:
    closed = False


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


# ---- metrics and the core link -----------------------------------------------------------
def test_the_shared_metrics_are_declared_under_the_services_name() -> None:
    registry = CollectorRegistry()
    metrics = _Metrics(registry)
    metrics.bytes_in.inc(3)
    metrics.bytes_out.inc(5)
    assert _value(registry, "polymq_demo_bytes_total", direction="in") == 3
    assert _value(registry, "polymq_demo_bytes_total", direction="out") == 5
    assert _value(registry, "polymq_demo_core_connected") == 0
    assert _value(registry, "polymq_demo_core_connects_total") == 0
    helps = {m.name: m.documentation for m in registry.collect()}
    assert helps["polymq_demo_bytes"] == "Bytes received (in) and sent (out) over DEMO connections"
    assert list(helps) == [
        "polymq_demo_bytes",
        "polymq_demo_core_connected",
        "polymq_demo_core_connects",
    ]


def test_the_core_link_keeps_the_metrics_then_calls_on_lost() -> None:
    registry = CollectorRegistry()
    metrics = _Metrics(registry)
    seen: list[tuple[str, float | None]] = []

    def on_lost(client: Client, reason: str) -> None:
        seen.append((reason, _value(registry, "polymq_demo_core_connected")))

    link = core_link(_Settings(), "demo", metrics, on_lost=on_lost)
    assert (link.address, link.service, link.user, link.password) == (
        "core.example:7400",
        "demo",
        "fe",
        "pw",
    )
    client = cast(Client, _Client())
    assert link.on_connect is not None and link.on_lost is not None
    link.on_connect(client)
    link.on_connect(client)
    assert _value(registry, "polymq_demo_core_connected") == 1
    assert _value(registry, "polymq_demo_core_connects_total") == 2
    link.on_lost(client, "gone")
    assert seen == [("gone", 0.0)]  # the gauge dropped first


def test_no_tls_context_without_a_certificate() -> None:
    assert tls_context(_Settings()) is None


# ---- the admin app -------------------------------------------------------------------------
def _json(response: web.Response | None) -> tuple[int, Any]:
    assert response is not None and isinstance(response.body, bytes)
    return response.status, json.loads(response.body)


def test_not_ready_while_stopping_or_away_from_the_core() -> None:
    link = CoreLink("core.example", 7400, service="demo")
    link.last_error = "connection refused"
    assert _json(not_ready(True, link)) == (503, {"status": "shutting down"})
    detail = "not connected to the core at core.example:7400: connection refused"
    assert _json(not_ready(False, link)) == (503, {"status": "unavailable", "detail": detail})
    link.client = cast(Client, _Client())
    assert not_ready(True, link) is not None
    assert not_ready(False, link) is None


def test_the_core_link_knows_every_address_and_starts_after_the_one_it_lost() -> None:
    link = CoreLink("n1:7401,n2,n3:7403", 7400, service="demo")
    assert link.addresses == ["n1:7401", "n2:7400", "n3:7403"]
    assert link._order() == link.addresses
    assert link.address == "n1:7401,n2:7400,n3:7403"  # (not connected: every one)
    gone = cast(Client, _Lost(Address("10.0.0.2", 7400, "n2")))  # n2, as DNS resolved it
    link._passed(gone)
    assert link._order() == ["n3:7403", "n1:7401", "n2:7400"]
    link._passed(cast(Client, _Lost(Address("n3", 7403))))
    assert link._order() == ["n1:7401", "n2:7400", "n3:7403"]


def test_a_core_link_given_several_cores_or_a_name_fails_over() -> None:
    """Several addresses, or a name (a headless Service's stands for every core): the
    client fails over; one IP address (or localhost: one core) ends the sessions on loss."""
    assert CoreLink("n1:7401,n2", service="demo").failover == CORE_FAILOVER
    assert CoreLink("core-headless:7400", service="demo").failover == CORE_FAILOVER
    assert CoreLink("127.0.0.1:7400,127.0.0.1:7401", service="demo").failover == CORE_FAILOVER
    assert CoreLink("127.0.0.1", 7400, service="demo").failover is None
    assert CoreLink("[::1]:7400", service="demo").failover is None
    assert CoreLink("localhost", 7400, service="demo").failover is None
    assert CoreLink("core", 7400, service="demo", failover=None).failover is None


class _Lost:
    def __init__(self, address: Address) -> None:
        self.address = address


def test_the_admin_routes_and_runner() -> None:
    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    registry = CollectorRegistry()
    add_admin_routes(app, registry, readyz)
    assert app[PROMETHEUS] is registry
    paths = [r.canonical for r in app.router.resources()]
    assert paths == ["/metrics", "/healthz", "/readyz"]
    runner = admin_runner(app)
    assert runner.app is app


class _Slow:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.graces: list[float] = []

    async def shutdown(self, grace: float) -> None:
        self.graces.append(grace)
        await asyncio.sleep(self.seconds)


async def test_shutdown_sessions_waits_twice_the_grace_then_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test.frontend")
    quick, stuck = _Slow(0), _Slow(10)
    with caplog.at_level(logging.WARNING, "test.frontend"):
        await shutdown_sessions([quick, quick], 0.01, log, "demo: %d sessions are late")
        assert caplog.messages == []
        await shutdown_sessions([quick, stuck], 0.01, log, "demo: %d sessions are late")
    assert caplog.messages == ["demo: 2 sessions are late"]
    assert quick.graces == [0.01, 0.01, 0.01] and stuck.graces == [0.01]
    await shutdown_sessions([], 0.01, log, "never")


# ---- the session ---------------------------------------------------------------------------
class _Transport:
    peer = "peer:1"

    def __init__(self) -> None:
        self.writable = True
        self.writes: list[bytes] = []
        self.calls: list[str] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def close(self) -> None:
        self.calls.append("close")

    def abort(self) -> None:
        self.calls.append("abort")


class _Session(FrontendSession):
    def __init__(self, transport: _Transport) -> None:
        super().__init__(transport)
        self.metrics = _Metrics(CollectorRegistry())
        self.events: list[Any] = []
        self.hold = False  # update_reading pauses while True

    def _tick(self) -> None:
        self._tick_scheduled = False
        self.events.append("tick")
        self._flush()

    def update_reading(self) -> None:
        self._set_reading(self.hold or self._busy is not None)

    def _teardown(self) -> None:
        self.events.append("teardown")
        self._cancel_tasks()

    def _written(self, force: bool) -> None:
        self.events.append(("written", force))


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_writes_of_one_iteration_go_out_in_one_write() -> None:
    transport = _Transport()
    session = _Session(transport)
    session._write(b"ab")
    session._write(b"cd")
    await _settle()
    assert transport.writes == [b"abcd"]
    assert session.events == ["tick", ("written", False)]
    assert session.metrics.bytes_out._value.get() == 4


async def test_output_waits_while_the_transport_does_not_drain() -> None:
    transport = _Transport()
    session = _Session(transport)
    transport.writable = False
    session.hold = True
    session._write(b"x")
    await _settle()
    assert transport.writes == [] and transport.calls == ["pause"]
    transport.writable = True
    session.hold = False
    session.resume_writing()
    assert transport.writes == [b"x"] and transport.calls == ["pause", "resume"]


async def test_the_busy_task_pauses_reading_and_reports_its_end() -> None:
    transport = _Transport()
    session = _Session(transport)
    ended: list[BaseException | None] = []
    gate = asyncio.Event()

    async def work() -> None:
        await gate.wait()

    session._run_busy(work(), ended.append)
    assert session._busy is not None and transport.calls == ["pause"]
    gate.set()
    await _settle()
    assert ended == [None] and session._busy is None and session._tasks == set()

    async def boom() -> None:
        raise ValueError("boom")

    session._run_busy(boom(), ended.append)
    await _settle()
    assert isinstance(ended[1], ValueError)


async def test_tasks_report_failures_and_are_cancelled_on_close() -> None:
    transport = _Transport()
    session = _Session(transport)
    failed: list[BaseException] = []

    async def boom() -> None:
        raise ValueError("boom")

    def forever() -> Coroutine[Any, Any, None]:
        return asyncio.sleep(60)

    session._run_task(boom(), failed.append)
    session._run_task(forever(), failed.append)
    ended: list[BaseException | None] = []
    session._run_busy(forever(), ended.append)
    await _settle()
    assert [str(e) for e in failed] == ["boom"]
    session._write(b"bye")
    session._close()
    await _settle()
    assert session.closing
    assert transport.writes == [b"bye"]
    # (the tick _write scheduled finds nothing left to write)
    assert session.events == [("written", True), "teardown", "tick"]
    assert transport.calls[-1] == "close"
    assert session._tasks == set() and failed[1:] == [] and ended == []  # cancelled: no calls


async def test_wait_busy_gives_the_busy_task_its_grace() -> None:
    session = _Session(_Transport())
    await session._wait_busy(1.0)  # none: at once
    ended: list[BaseException | None] = []
    session._run_busy(asyncio.sleep(60), ended.append)
    await session._wait_busy(0.01)
    assert session._busy is not None and ended == []
    session._cancel_tasks()
    await _settle()


def test_a_core_link_holds_the_cores_alarms_and_its_own_forced_one_as_one_set() -> None:
    """Every frontend reads its alarms from its core link: the core's as announced and a
    forced one (a test switch) together; the hooks hear each change of the set, once."""
    link = CoreLink("127.0.0.1", 7400, service="demo")
    heard: list[frozenset[str]] = []
    link.alarm_hooks.append(heard.append)
    link.on_alarms(frozenset({"memory"}))
    link.on_alarms(frozenset({"memory"}))  # (announced again: no change)
    link.force_alarm("forced", True)
    link.on_alarms(frozenset())
    assert link.alarms == {"forced"}  # the core's cleared, the forced one holds
    link.force_alarm("forced", False)
    link.force_alarm("forced", False)
    assert heard == [
        frozenset({"memory"}),
        frozenset({"memory", "forced"}),
        frozenset({"forced"}),
        frozenset(),
    ]
    assert link.alarms == frozenset()
