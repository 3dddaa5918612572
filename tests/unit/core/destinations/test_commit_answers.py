"""What a durable write's failure tells the client (``DurableWrites.commit``): in a cluster,
"not committed" only where the store knows the entry is not in the log, "may not have been
committed" where it cannot know."""

from __future__ import annotations

import asyncio

import pytest

from polymq.errors import Unavailable
from polymq_core.destinations.shardwrites import DurableWrites
from polymq_core.store.contract import StoreError
from polymq_core.store.logentry import (
    Deposed,
    LogError,
    LogUnavailable,
    NoLeader,
    NotAppended,
)
from polymq_core.store.writes import SaveValue


class FailingStore:
    """A store whose every write fails with ``cause`` behind its StoreError."""

    def __init__(self, cause: LogError) -> None:
        self.cause = cause

    def write(self, write: object) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        error = StoreError(f"failed: {self.cause}")
        error.__cause__ = self.cause
        fut.set_exception(error)
        return fut


def writes(cause: LogError, replicated: bool = True) -> DurableWrites:
    w = DurableWrites()
    w.store = FailingStore(cause)  # type: ignore[assignment]
    w.loop = asyncio.get_running_loop()
    w.replicated = replicated
    return w


@pytest.mark.parametrize(
    ("cause", "answer"),
    [
        (NotAppended("this node no longer leads the shard"), "not committed"),
        (Deposed("wrong last sequence: 7", last=7), "not committed"),
        (NoLeader("no responders"), "not committed"),
        (LogUnavailable("timeout"), "may not have been committed"),
        (LogError("closed with the entry on its way"), "may not have been committed"),
    ],
)
async def test_a_failed_write_says_what_is_known_of_the_log(cause: LogError, answer: str) -> None:
    with pytest.raises(Unavailable) as failed:
        await writes(cause).commit(SaveValue("k", b"v"))
    assert str(failed.value).startswith(f"{answer}: "), str(failed.value)


async def test_one_node_says_not_written() -> None:
    with pytest.raises(Unavailable, match=r"^not written: "):
        await writes(LogError("disk full"), replicated=False).commit(SaveValue("k", b"v"))
