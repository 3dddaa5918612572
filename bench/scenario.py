"""A scenario, what it is given (:class:`Context`) and what it gives back (:class:`Result`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .harness import Broker, CpuPlan, Worker, broker

__all__ = ["Context", "Result", "Scenario", "Skipped"]


class Skipped(Exception):
    """The scenario cannot run here (a missing server or library); the message says why."""


@dataclass
class Context:
    name: str
    quick: bool
    plan: CpuPlan
    overrides: dict[str, Any] = field(default_factory=dict)
    used: dict[str, Any] = field(default_factory=dict)
    profile_dir: Path | None = None
    profiles: list[Path] = field(default_factory=list)

    @contextlib.contextmanager
    def broker(self, command: str = "core", *args: str, **kw: Any) -> Iterator[Broker]:
        """A fresh broker for this scenario (see :func:`bench.harness.broker`)."""
        profile = None
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            profile = self.profile_dir / f"{self.name}-{command}-{len(self.profiles)}.pstats"
            self.profiles.append(profile)
        with broker(command, *args, plan=self.plan, profile=profile, **kw) as b:
            yield b

    def spawn(self, pool: list[Worker], target: str, params: dict[str, Any]) -> Worker:
        """Start a load generator (``"module:function"``) on the load CPUs; it joins ``pool``
        (see :func:`bench.harness.workers`), which stops it when the scenario ends."""
        profile = None
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            func = target.rpartition(":")[2]
            profile = self.profile_dir / f"{self.name}-{func}-{len(self.profiles)}.pstats"
            self.profiles.append(profile)
        w = Worker(target, params, self.plan.load, profile=profile)
        pool.append(w)
        return w

    def option(self, key: str, default: Any) -> Any:
        """A parameter of the scenario: ``--set NAME.KEY=VALUE`` on the command line, or
        ``default`` (which already depends on ``--quick``)."""
        value = self.overrides.get(key, default)
        if key in self.overrides and default is not None and type(default) is not type(value):
            value = type(default)(value)
        self.used[key] = value
        return value


@dataclass
class Result:
    value: float | None
    params: dict[str, Any]
    notes: str
    details: dict[str, Any] = field(default_factory=dict)
    # False when the run was too small for the target to apply (e.g. --quick at 1/10 scale):
    # the value is reported, ratio_to_target and met are left null.
    comparable: bool = True
    # A target measured by the scenario itself (e.g. RabbitMQ's figure in the same run),
    # used instead of the Scenario's fixed one for ratio_to_target and met.
    target: float | None = None
    # verdict=True: ``met`` is the entry's verdict (None: none), instead of value vs target
    # (a comparison with more than one criterion, e.g. throughput and CPU per message).
    met: bool | None = None
    verdict: bool = False
    # Part of the scenario failed (one broker of a comparison): the entry is "failed" with
    # this error but keeps the value and details measured.
    error: str | None = None
    # Keys added at the top level of the entry (next to value and unit).
    extra: dict[str, Any] = field(default_factory=dict)
    # CPU-seconds spent meanwhile by processes the scenario drove but did not start (a
    # system RabbitMQ): not "other processes" in other_cpu_share.
    external_cpu_seconds: float = 0.0


@dataclass(frozen=True)
class Scenario:
    name: str
    target: float | None
    unit: str
    # "min": the target is a floor (value >= target is met); "max": a ceiling (value < target)
    bound: Literal["min", "max"] | None
    run: Callable[[Context], Result]
    about: str = ""
