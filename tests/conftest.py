from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from polymq import Client

from .procs import PolymqProcess, serving


@pytest.fixture
def fresh_core(tmp_path: Path) -> Iterator[PolymqProcess]:
    """A fresh ``polymq core`` process (own data dir, ephemeral ports): ``core``, unless a
    module shares one; a test there that stops or kills its core, or counts everything in
    it, takes this one by name."""
    with PolymqProcess("core", tmp_path / "core") as proc:
        yield proc


@pytest.fixture
def core(fresh_core: PolymqProcess) -> PolymqProcess:
    return fresh_core


@pytest.fixture(scope="module")
def module_core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    """One ``polymq core`` process for a whole module whose tests use names of their own and
    leave it running (a module binds it to ``core``; tests that stop or kill their core take
    ``fresh_core``)."""
    with serving("core", tmp_path_factory.mktemp("core")) as proc:
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
