"""The service's life cycle: ``/readyz`` follows the core connection, which comes back by
itself after the core does; SIGTERM answers long polls at once and exits cleanly."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from ...procs import PolymqProcess
from .conftest import Api, assert_problem, start_run, unique


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_reconnects_to_a_core_that_comes_and_goes(tmp_path: Path) -> None:
    port = free_port()
    http = PolymqProcess("http", tmp_path / "http", "--core", f"127.0.0.1:{port}").start()
    core: PolymqProcess | None = None
    try:
        api, q = Api(http.url("http")), unique()
        # no core yet: alive, not ready, and requests fail fast with 503
        assert api.get("/healthz").status_code == 200
        assert_problem(api.get("/readyz"), 503)
        r = api.post(f"/v1/queue/{q}/messages", json={"body": "x"})
        assert assert_problem(r, 503)["code"] == "unavailable"
        assert r.headers["Retry-After"]

        core = PolymqProcess("core", tmp_path / "core", "--core-port", str(port)).start()
        eventually(lambda: api.get("/readyz").status_code == 200)
        api.publish(f"queue/{q}", {"body": "first", "persistent": True})

        core.kill()  # no goodbye: the frontend must notice by itself
        eventually(lambda: api.get("/readyz").status_code == 503)
        assert_problem(api.post(f"/v1/queue/{q}/messages", json={"body": "x"}), 503)

        core = PolymqProcess("core", tmp_path / "core", "--core-port", str(port)).start()
        eventually(lambda: api.get("/readyz").status_code == 200)
        [msg] = api.pull(q)  # the persistent message survived the core's crash
        assert msg["body"] == "first"
        metrics = api.get("/metrics").text
        assert "polymq_http_core_connects_total 2.0" in metrics
        assert "polymq_http_core_connected 1.0" in metrics
        assert http.alive
        assert http.stop() == 0, http.log()
    finally:
        http.kill()
        if core is not None:
            core.kill()


@pytest.mark.parametrize("waiting", [1, 3])
async def test_sigterm_answers_long_polls_and_exits_cleanly(tmp_path: Path, waiting: int) -> None:
    proc = start_run(tmp_path / "run")
    try:
        async with aiohttp.ClientSession(proc.url("http")) as http:

            async def long_poll() -> object:
                async with http.post(f"/v1/queue/{unique()}/pull", params={"wait": "25"}) as r:
                    assert r.status == 200
                    return await r.json()

            polls = [asyncio.create_task(long_poll()) for _ in range(waiting)]
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            stopped = asyncio.get_running_loop().run_in_executor(None, proc.stop)
            results = await asyncio.wait_for(asyncio.gather(*polls), 10)
            assert results == [{"messages": []}] * waiting
            assert await stopped == 0, proc.log()
            assert time.monotonic() - t0 < 8
    finally:
        proc.kill()


async def test_a_lame_duck_takes_no_connection_and_sends_requests_elsewhere() -> None:
    """The first step of a stop (every listener of a node at once, docs/cluster.md): the
    listener is closed, and a request still coming on an open keep-alive connection gets a
    503 with ``Retry-After`` and ``Connection: close`` (a load balancer's client retries on
    another instance)."""
    from polymq_http.config import HttpSettings
    from polymq_http.service import HttpService

    service = HttpService(HttpSettings(http_port=0, core_port=free_port()))  # (no core)
    url = f"http://127.0.0.1:{(await service.start())['http']}"
    try:
        async with aiohttp.ClientSession(url) as http:
            async with http.get("/healthz") as r:
                assert r.status == 200 and r.headers.get("Connection") != "close"
            await service.lame_duck()
            async with http.get("/healthz") as r:  # on the connection kept alive
                assert r.status == 503
                assert r.headers["Retry-After"] == "1"
                assert r.headers["Connection"] == "close"
                assert "shutting down" in (await r.json())["detail"]
        async with aiohttp.ClientSession(url) as http:
            with pytest.raises(aiohttp.ClientConnectorError):
                await http.get("/healthz")  # a new connection: refused
    finally:
        await service.stop()
