"""A link's helpers end when the session does, even where Python 3.11's ``wait_for``
swallows the cancellation (a link that waited on one never started again)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from polymq.tasks import check_cancelled
from polymq_bridge.inbound import InboundRunner
from polymq_bridge.link import LinkRunner


class DyingQueue:
    """A queue whose passive declare fails on a dead channel just as the session ends: the
    sampler's cancellation is delivered while the failed declare is already done, so
    ``wait_for`` raises the declare's error, not CancelledError."""

    def __init__(self) -> None:
        self.sampler: asyncio.Task[Any] | None = None
        self.declares = 0

    def declare(self) -> asyncio.Future[Any]:
        self.declares += 1
        loop = asyncio.get_running_loop()
        assert self.sampler is not None
        loop.call_soon(self.sampler.cancel)  # (runs before wait_for's waiter is released)
        failed: asyncio.Future[Any] = loop.create_future()
        failed.set_exception(RuntimeError("channel is closed"))
        return failed


def runner() -> Any:
    lag = SimpleNamespace(set=lambda n: None)
    return SimpleNamespace(
        name="in",
        metrics=SimpleNamespace(lag=lag),
        settings=SimpleNamespace(bridge_stats_interval=0.01),
        _tasks=set(),
    )


async def test_the_queue_depth_sampler_ends_when_a_cancel_meets_a_failed_declare() -> None:
    queue = DyingQueue()
    queue.sampler = asyncio.ensure_future(InboundRunner._sample(runner(), queue))  # type: ignore[arg-type]
    done, _ = await asyncio.wait({queue.sampler}, timeout=2.0)
    assert done and queue.sampler.cancelled()
    assert queue.declares == 1  # it did not sample on


async def test_a_helper_that_outlives_a_cancel_is_cancelled_again() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # as a wait_for on 3.11 may: the loop goes on

    link = runner()
    task = asyncio.ensure_future(stubborn())
    link._tasks.add(task)
    await asyncio.sleep(0)
    cancelling = asyncio.ensure_future(LinkRunner._cancel_helpers(link))
    done, _ = await asyncio.wait({cancelling}, timeout=3.0)  # (a second cancel after 1 s)
    assert done and task.cancelled() and swallowed == 1 and not link._tasks


async def test_check_cancelled_raises_only_for_a_task_asked_to_stop() -> None:
    check_cancelled()  # not asked: nothing

    async def asked() -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass  # swallowed, but still counted
        try:
            check_cancelled()
        except asyncio.CancelledError:
            return "raised"
        return "went on"

    assert await asyncio.ensure_future(asked()) == "raised"
