"""Helpers for tasks that must stop when asked.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that meets its inner call just
as that call completes: it returns (or raises) the call's outcome instead, while the task's
cancellation request stays counted. A loop that catches exceptions and goes on would then
never end, and whoever waits for it after cancelling it waits for ever. Every such loop asks
:func:`check_cancelled` first. Seen twice: a stopping node's shard follower ran on (and the
node's stop, which waits for it, with it); after a RabbitMQ restart, a bridge link's
queue-depth sampler, cancelled as its passive declare failed on the dead channel, sampled
on, so the link never started again and its messages stayed in RabbitMQ."""

from __future__ import annotations

import asyncio

__all__ = ["cancelling", "check_cancelled"]


def cancelling() -> bool:
    """Has the current task been asked to stop (a cancellation pending, or one swallowed
    on the way)?"""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def check_cancelled() -> None:
    """Raise CancelledError if the current task has been asked to stop."""
    if cancelling():
        raise asyncio.CancelledError
