"""The memory alarm's marks (polymq_core.alarms.ResourceMonitor), against a resident size
given by the test instead of measured: it rises at ``1 - POLYMQ_MEMORY_HEADROOM`` of the high
watermark, stays on until the memory is under ``POLYMQ_MEMORY_LOW_WATERMARK`` of it, and is
measured after every MiB read from the connections as well as on its clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from polymq.types import Message
from polymq_core import alarms as core_alarms
from polymq_core.alarms import ResourceMonitor
from polymq_core.config import CoreSettings
from polymq_server import alarms
from polymq_server.config import ConfigError, from_env

MARK = 100_000_000  # bytes (a number above 1 is bytes)


class Sensors:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()


class Publisher:
    def __init__(self) -> None:
        self.announced: list[frozenset[str]] = []

    def publish_topic(self, topic: str, messages: list[Message]) -> None:
        assert topic == alarms.TOPIC
        self.announced.extend(alarms.decode(m.body) for m in messages)


class Broker:
    """What the monitor uses of the broker: settings, the metrics registry, the topic
    publisher and the hook that holds (or lets go) the publishers."""

    def __init__(self, settings: CoreSettings) -> None:
        self.settings = settings
        self.sensors = Sensors()
        self.publisher = Publisher()
        self.changes: list[frozenset[str]] = []
        self.monitor: ResourceMonitor | None = None

    def alarms_changed(self) -> None:
        assert self.monitor is not None
        self.changes.append(self.monitor.alarms)


class Memory:
    """The resident size the monitor reads, and the trims it asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.used = 0
        self.trims = 0
        monkeypatch.setattr(core_alarms, "resident_bytes", lambda: self.used)
        monkeypatch.setattr(core_alarms, "give_back_memory", self.trim)

    def trim(self) -> None:
        self.trims += 1


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Memory:
    return Memory(monkeypatch)


def monitor(tmp_path: Path, **settings: Any) -> tuple[ResourceMonitor, Broker]:
    s = CoreSettings(data_dir=tmp_path, memory_high_watermark=MARK, disk_free_limit=0)
    s = dataclasses.replace(s, **settings)
    s.check()
    broker = Broker(s)
    m = broker.monitor = ResourceMonitor(broker)  # type: ignore[arg-type]
    return m, broker


def test_the_alarm_rises_at_the_headroom_below_the_mark(tmp_path: Path, memory: Memory) -> None:
    m, broker = monitor(tmp_path)  # defaults: headroom 0.1, low watermark 0.85
    assert m.memory_marks() == (MARK, 90_000_000, 85_000_000)
    memory.used = 90_000_000 - 1
    assert not m.check() and m.alarms == frozenset()
    memory.used = 90_000_000  # still 10 MB under the mark: the old alarm waited for it
    assert m.check() and m.alarms == {"memory"}
    assert broker.changes == [{"memory"}]
    assert m.detail["memory"] == {
        "used": 90_000_000,
        "limit": MARK,
        "rises_at": 90_000_000,
        "clears_at": 85_000_000,
        "pressure": True,
    }


def test_the_alarm_clears_only_under_the_low_watermark(tmp_path: Path, memory: Memory) -> None:
    m, broker = monitor(tmp_path, memory_headroom=0.2, memory_low_watermark=0.5)
    memory.used = 80_000_000
    assert m.check() and m.alarms == {"memory"}
    memory.used = 79_000_000  # under where it rose, above where it clears: it stays on
    assert not m.check() and m.alarms == {"memory"}
    assert memory.trims == 1  # (while on, freed memory goes back before judging)
    memory.used = 50_000_000
    assert not m.check() and m.alarms == {"memory"}
    memory.used = 50_000_000 - 1
    assert m.check() and m.alarms == frozenset()
    assert broker.changes == [{"memory"}, frozenset()]
    memory.used = 79_000_000  # off again: it rises at 80 MB, not before
    assert not m.check() and m.alarms == frozenset()


def test_reads_measure_the_memory_between_two_ticks(tmp_path: Path, memory: Memory) -> None:
    m, broker = monitor(tmp_path)
    memory.used = MARK  # grown since the last measure, which found it low
    m.read(core_alarms._READ_EVERY - 1)
    assert m.alarms == frozenset()  # not measured yet
    m.read(1)  # a MiB read since the last measure: measured now, raised, announced
    assert m.alarms == {"memory"}
    assert broker.publisher.announced == [{"memory"}]


def test_past_the_low_watermark_memory_is_under_pressure(tmp_path: Path, memory: Memory) -> None:
    m, _broker = monitor(tmp_path)
    memory.used = 85_000_000 - 1
    m.check()
    assert not m.pressure.on
    memory.used = 85_000_000  # no alarm yet, but paging queues squeeze their window
    m.check()
    assert m.pressure.on and m.alarms == frozenset()
    memory.used = 1  # (measured after a MiB read as well)
    m.read(core_alarms._READ_EVERY)
    assert not m.pressure.on


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("POLYMQ_MEMORY_HEADROOM", "1"),
        ("POLYMQ_MEMORY_HEADROOM", "-0.1"),
        ("POLYMQ_MEMORY_LOW_WATERMARK", "0"),
        ("POLYMQ_MEMORY_LOW_WATERMARK", "0.95"),  # above where the alarm rises (0.9)
    ],
)
def test_bad_memory_alarm_marks_are_start_up_errors(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var):
        from_env(CoreSettings, env={var: value}).check()
