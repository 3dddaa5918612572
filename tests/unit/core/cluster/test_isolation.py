"""``polymq_core.cluster.isolation``: a node that reaches fewer than a majority of the nodes for a
while stops its nats-server, and starts it again once it reaches a majority (the network
itself is cut in ``tests/cluster/test_partition.py``; here the probes are faked)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from polymq_core.cluster import isolation
from polymq_core.cluster.isolation import Isolation


class FakeNats:
    def __init__(self) -> None:
        self.paused = False
        self.calls: list[str] = []

    async def pause(self) -> None:
        self.paused = True
        self.calls.append("pause")

    async def resume(self) -> None:
        self.paused = False
        self.calls.append("resume")


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Probes answered from a dict (host -> answers?), and short periods."""
    answers: dict[str, bool] = {}

    async def reaches(host: str, port: int) -> bool:
        return answers.get(host, True)

    monkeypatch.setattr(isolation, "_reaches", reaches)
    monkeypatch.setattr(isolation, "_EVERY", 0.01)
    monkeypatch.setattr(isolation, "_ISOLATED_AFTER", 0.1)
    monkeypatch.setattr(isolation, "_BACK_AFTER", 0.05)
    return answers


async def _until(check: Callable[[], bool], seconds: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not check():
        assert loop.time() < deadline, "not within the time"
        await asyncio.sleep(0.01)


async def test_cut_off_from_the_majority_it_pauses_and_resumes_when_back(
    fast: dict[str, bool],
) -> None:
    nats = FakeNats()
    changes: list[bool] = []
    watch = Isolation(
        nats,  # type: ignore[arg-type]
        lambda: ["http://10.0.0.2:7401/", "http://10.0.0.3:7401/"],
        changes.append,
    )
    watch.start()
    try:
        fast["10.0.0.2"] = False  # one of two others: still a majority (2 of 3)
        await asyncio.sleep(0.3)
        assert nats.calls == []
        fast["10.0.0.3"] = False  # both: cut off
        await _until(lambda: nats.paused)
        assert watch.isolated_since is not None
        fast["10.0.0.2"] = True  # one back: a majority again
        await _until(lambda: not nats.paused)
        assert nats.calls == ["pause", "resume"]
        assert changes == [True, False]
    finally:
        await watch.stop()


async def test_not_armed_it_pauses_nothing_until_a_majority_has_answered_once(
    fast: dict[str, bool],
) -> None:
    """``polymq nats`` starts it so: at a cluster's first start its peers may have no
    address yet; once a majority has answered, a cut pauses as ever."""
    nats = FakeNats()
    fast["10.0.0.2"] = fast["10.0.0.3"] = False
    watch = Isolation(
        nats,  # type: ignore[arg-type]
        lambda: ["tcp://10.0.0.2:7401", "tcp://10.0.0.3:7401"],
        armed=False,
    )
    watch.start()
    try:
        await asyncio.sleep(0.4)  # (4x the wait before a pause)
        assert nats.calls == [] and not watch.armed
        fast["10.0.0.3"] = True  # 2 of 3: a majority
        await _until(lambda: watch.armed)
        assert nats.calls == []
        fast["10.0.0.3"] = False
        await _until(lambda: nats.paused)
        fast["10.0.0.2"] = True
        await _until(lambda: not nats.paused)
        assert nats.calls == ["pause", "resume"]
    finally:
        await watch.stop()


async def test_a_blip_shorter_than_the_wait_pauses_nothing(fast: dict[str, bool]) -> None:
    nats = FakeNats()
    watch = Isolation(nats, lambda: ["http://10.0.0.2:7401/"])  # type: ignore[arg-type]
    watch.start()
    try:
        fast["10.0.0.2"] = False
        await asyncio.sleep(0.03)
        fast["10.0.0.2"] = True
        await asyncio.sleep(0.3)
        assert nats.calls == []
    finally:
        await watch.stop()


async def test_a_peer_that_refuses_is_reachable_and_one_listening_too() -> None:
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        assert await isolation._reaches("127.0.0.1", listening.getsockname()[1])
        assert await isolation._reaches("127.0.0.1", closed.getsockname()[1])


async def test_a_peer_reached_while_this_nodes_loop_is_busy_is_reachable() -> None:
    """A probe timed out on the event loop asks the kernel: with every step of the loop
    taking longer than a probe may (a leader paging a large backlog on a loaded machine), a
    peer that listens is still reached (timed on the loop alone, every such probe failed)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        busy = True

        def hold() -> None:
            time.sleep(isolation._PROBE + 0.1)  # the loop is held, as a slow step holds it

        async def hog() -> None:
            while busy:
                hold()
                await asyncio.sleep(0)

        task = asyncio.create_task(hog())
        await asyncio.sleep(0)  # (it holds the loop from the next step on)
        try:
            assert await isolation._reaches("127.0.0.1", port)
        finally:
            busy = False
            await task
