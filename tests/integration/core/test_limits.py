"""Connection limits of the core's wire port: a connection past the listener's limit, or past
its user's, is told why (an ``unavailable`` Goodbye) instead of being reset, and a place that
frees up is taken again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polymq import Client, ConnectionClosed

from ...procs import PolymqProcess
from .helpers import connect

pytestmark = pytest.mark.timeout(60)


async def connect_once_freed(port: int, within: float = 10.0) -> Client:
    """A connection in the place a closed one freed: the client's close does not wait for
    the core to have seen it, so the first tries may still be refused."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await connect(port)
        except ConnectionClosed:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_connections_past_the_listeners_limit_are_refused_with_a_reason(
    tmp_path: Path,
) -> None:
    with PolymqProcess("core", tmp_path / "core", env={"POLYMQ_MAX_CONNECTIONS": "2"}) as core:
        port = core.ports["core"]
        first, second = await connect(port), await connect(port)
        with pytest.raises(ConnectionClosed, match="2 connections, the most it takes") as info:
            await connect(port)
        assert info.value.code == "unavailable"
        await first.close()
        third = await connect_once_freed(port)  # the place freed is taken again
        await third.ping()
        await second.close()
        await third.close()
        assert "refusing new ones" in core.log()


async def test_connections_past_a_users_limit_are_refused_with_a_reason(tmp_path: Path) -> None:
    env = {"POLYMQ_MAX_CONNECTIONS_PER_USER": "2"}
    with PolymqProcess("core", tmp_path / "core", env=env) as core:
        port = core.ports["core"]
        held = [await connect(port), await connect(port)]
        with pytest.raises(ConnectionClosed, match="'anonymous' has 2 connections") as info:
            await connect(port)
        assert info.value.code == "unavailable"
        await held.pop().close()
        held.append(await connect_once_freed(port))
        for c in held:
            await c.ping()
            await c.close()


async def test_polymq_run_frontends_are_not_counted_against_a_user_limit(tmp_path: Path) -> None:
    """`polymq run`'s six frontends reach the core as its own internal user: a per-user limit
    of 1 leaves every one of them connected and still lets one client in."""
    env = {"POLYMQ_MAX_CONNECTIONS_PER_USER": "1"}
    with PolymqProcess("run", tmp_path / "run", env=env) as run:
        async with await connect(run.ports["core"]) as c:
            await c.ping()
        assert "limit" not in run.log().lower().replace("open files: limit", "")
