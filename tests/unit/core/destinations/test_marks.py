"""A replicated shard's delivery marks (``Shard.delivered``): gathered for ``MARK_AFTER``
seconds, written only for the deliveries not settled by then (one write per queue), written
at once by a planned hand-over and dropped by a demotion that writes nothing more."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from polymq.types import Message
from polymq_core.destinations import shard as shard_module
from polymq_core.destinations.shard import Shard
from polymq_core.store.writes import MarkDelivered, Remove, Write

AFTER = 0.05


class RecordingStore:
    """Takes every write at once and keeps it."""

    def __init__(self) -> None:
        self.writes: list[Write] = []

    def write(self, write: Write) -> asyncio.Future[None]:
        self.writes.append(write)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def demote(self) -> None:
        pass


def _leading_shard(store: RecordingStore) -> Shard:
    host = SimpleNamespace(
        drop_cursors=lambda shard: None,
        bindings=SimpleNamespace(bound_queues=lambda: []),
    )
    sensors = SimpleNamespace(on_leadership=lambda what: None, on_destinations=lambda n: None)
    shard = Shard(host, 0, store, sensors, replicated=True)  # type: ignore[arg-type]
    shard.loop = asyncio.get_running_loop()
    shard.leading = True
    return shard


def _deliver(shard: Shard, key: str, seq: int, count: int = 1) -> None:
    queue: Any = SimpleNamespace(key=key)
    shard.delivered(queue, Message(b"m", persistent=True, seq=seq, delivery_count=count))


def _marks(store: RecordingStore) -> list[tuple[str, list[tuple[int, int]]]]:
    return [(w.destination, list(w.marks)) for w in store.writes if isinstance(w, MarkDelivered)]


@pytest.fixture(autouse=True)
def _short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_module, "MARK_AFTER", AFTER)


async def test_only_deliveries_still_unsettled_after_the_wait_are_marked() -> None:
    store = RecordingStore()
    shard = _leading_shard(store)
    for seq in (1, 2, 3):
        _deliver(shard, "queue/a", seq)
    _deliver(shard, "queue/b", 7, count=3)
    shard.forget("queue/a", [1, 3])  # acked within the wait: no mark for them
    await asyncio.sleep(AFTER / 5)
    assert _marks(store) == []  # nothing before the wait is over
    await asyncio.sleep(AFTER * 2)
    assert sorted(_marks(store)) == [("queue/a", [(2, 1)]), ("queue/b", [(7, 3)])]
    assert any(isinstance(w, Remove) and w.seqs == [1, 3] for w in store.writes)


async def test_every_delivery_settled_in_time_costs_no_write() -> None:
    store = RecordingStore()
    shard = _leading_shard(store)
    _deliver(shard, "queue/a", 1)
    shard.forget("queue/a", [1])
    await asyncio.sleep(AFTER * 3)
    assert _marks(store) == []
    _deliver(shard, "queue/a", 2)  # a later delivery starts another wait
    await asyncio.sleep(AFTER * 3)
    assert _marks(store) == [("queue/a", [(2, 1)])]


async def test_a_planned_hand_over_writes_its_marks_at_once_a_loss_drops_them() -> None:
    store = RecordingStore()
    shard = _leading_shard(store)
    _deliver(shard, "queue/a", 1)
    shard.demote("handing its lead on", writes_go_on=True)
    assert _marks(store) == [("queue/a", [(1, 1)])]  # before the lead is let go

    store = RecordingStore()
    shard = _leading_shard(store)
    _deliver(shard, "queue/a", 1)
    shard.demote("deposed")
    await asyncio.sleep(AFTER * 3)
    assert _marks(store) == []  # a node that no longer leads writes no mark
