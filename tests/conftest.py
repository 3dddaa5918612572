from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from polymq import Client

from .procs import PolymqProcess


@pytest.fixture
def core(tmp_path: Path) -> Iterator[PolymqProcess]:
    """A fresh ``polymq core`` process (own data dir, ephemeral ports)."""
    with PolymqProcess("core", tmp_path / "core") as proc:
        yield proc


@pytest.fixture
def run_proc(tmp_path: Path) -> Iterator[PolymqProcess]:
    """A fresh ``polymq run`` process: core + every frontend."""
    with PolymqProcess("run", tmp_path / "run") as proc:
        yield proc


@pytest.fixture
async def client(core: PolymqProcess) -> AsyncIterator[Client]:
    c = await Client.connect("127.0.0.1", core.ports["core"])
    try:
        yield c
    finally:
        await c.close()
