"""Configuration reloads, without a restart: the log level, the users and grants (re-read
from the ``POLYMQ_AUTH`` file), and the core's limits.

A reload is a small JSON object, ``{"version": N, "log_level": "DEBUG", "users": true,
"limits": {"max_body": 1048576}}`` (each change optional). :func:`new_change` makes one from
a request and checks it. The core applies it (in a cluster, every node does: it is broadcast
on ``system.config``) and then publishes it on its topic ``system.config``, where every
frontend connected to it hears it (:meth:`polymq_server.link.corelink.CoreLink.follow_config`) and
applies the same change to itself: its own users file and log level (limits are the core's).

Versions are the unix time in microseconds of the request (an integer JSON readers such as
a browser's keep exact, unlike nanoseconds): a process ignores a reload older than the one
it applied (a late or repeated message changes nothing), and refuses one dated more than
:data:`MAX_AHEAD` seconds after its own clock (a version from no real request, which would
make it ignore every reload after it). Only polymq's own links and administrators may
publish on ``system.config`` (:mod:`polymq_server.auth.principals`).

A users reload reaches the open sessions too: each :attr:`Reloader.users_hooks` is called
once the file is re-read (the sessions of a frontend through its
:class:`~polymq_server.link.connections.ConnectionTable`, the core's wire clients through its own),
and each session asks :meth:`~polymq_server.auth.provider.AuthProvider.refresh` whether its login
still holds and with which grants.

Errors: :class:`ReloadError` for a change that cannot be applied (an unknown log level, a
users file that no longer reads, limits the core refuses), raised before anything of it is
applied where it can be checked first; the users file is checked by re-reading it, and a bad
one keeps the users there were.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .auth.provider import AuthProvider, FileProvider

__all__ = ["LEVELS", "LIMITS", "MAX_AHEAD", "TOPIC", "ReloadError", "Reloader", "new_change"]

log = logging.getLogger(__name__)

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TOPIC = "system.config"  # the core's topic that carries every reload it applied
MAX_AHEAD = 86400.0  # seconds a reload's version may be ahead of this process's clock
# the core's limits a reload may change: each one's type and least value
LIMITS: dict[str, tuple[type[int] | tuple[type[int], type[float]], float]] = {
    "max_body": (int, 1),
    "max_pull": (int, 1),
    "max_wait": ((int, float), 0),
    "max_subscriptions_per_connection": (int, 1),
    "memory_high_watermark": ((int, float), 0),
    "memory_headroom": ((int, float), 0),
    "memory_low_watermark": ((int, float), 0),
    "disk_free_limit": (int, 0),
}
_FIELDS = {"log_level", "users", "limits"}


class ReloadError(ValueError):
    """A reload that cannot be applied; the message says why."""


def new_change(request: Any) -> dict[str, Any]:
    """A reload from a request's JSON (``{"log_level"?, "users"?, "limits"?}``), checked,
    with its version; ReloadError if it is not one."""
    if not isinstance(request, dict) or set(request) - _FIELDS:
        raise ReloadError(
            'a reload is {"log_level": "INFO", "users": true, "limits": {"max_body": 1048576}}'
            ", each optional"
        )
    change: dict[str, Any] = {"version": time.time_ns() // 1000}
    level = request.get("log_level")
    if level is not None:
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise ReloadError(f"log_level must be one of {', '.join(LEVELS)}")
        change["log_level"] = level.upper()
    users = request.get("users", False)
    if not isinstance(users, bool):
        raise ReloadError("users must be true or false")
    if users:
        change["users"] = True
    limits = request.get("limits")
    if limits is not None:
        change["limits"] = _limits(limits)
    return change


def _limits(limits: Any) -> dict[str, int | float]:
    if not isinstance(limits, dict) or not limits or set(limits) - set(LIMITS):
        raise ReloadError(f"limits is an object of one or more of {', '.join(LIMITS)}")
    for name, value in limits.items():
        kind, least = LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, kind) or value < least:
            what = "an integer" if kind is int else "a number"
            raise ReloadError(f"limits.{name} must be {what} of at least {least:g}")
    return dict(limits)


class Reloader:
    """Applies reloads to this process: ``version`` is the last one applied (0: none).

    ``limits(new)`` applies a change's limits (ReloadError if they cannot be; None: this
    process has none, and ignores them); ``applied(change)`` is told of each change applied
    (the core publishes it on :data:`TOPIC`). ``users_required``: a users reload where there
    is no users file is an error (the core, which reports it to the operator) rather than
    nothing to do (a frontend running without logins)."""

    def __init__(
        self,
        auth: AuthProvider,
        *,
        limits: Callable[[dict[str, Any]], None] | None = None,
        applied: Callable[[dict[str, Any]], None] | None = None,
        users_required: bool = True,
        name: str = "",
    ) -> None:
        self.auth = auth
        self.limits = limits
        self.applied = applied
        self.users_required = users_required
        self.name = name  # who applies it, in the log ("" for the core)
        self.version = 0
        # told once a users reload has re-read the file: the open sessions check their logins
        self.users_hooks: list[Callable[[], None]] = []

    def _users(self) -> FileProvider | None:
        provider: Any = self.auth
        while provider is not None and not isinstance(provider, FileProvider):
            provider = getattr(provider, "inner", None)
        return provider

    def apply(self, change: dict[str, Any]) -> bool:
        """Apply ``change`` unless an equal or newer one was; whether it was applied.
        ReloadError if part of it cannot be (what could be is kept)."""
        version = change.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ReloadError("a reload needs an integer version")
        if version > (time.time() + MAX_AHEAD) * 1e6:
            raise ReloadError(f"version {version} is not a time of this era: reload refused")
        if version <= self.version:
            return False
        self.version = version
        errors = []
        limits = change.get("limits")
        if limits and self.limits is not None:
            try:
                self.limits(_limits(limits))
            except ReloadError as exc:
                errors.append(f"limits kept: {exc}")
        level = change.get("log_level")
        if isinstance(level, str) and level in LEVELS:
            logging.getLogger().setLevel(level)
        if change.get("users"):
            users_errors = self._reload_users()
            errors.extend(users_errors)
            if not users_errors:
                self._users_reloaded()
        who = f"{self.name}: " if self.name else ""
        log.log(
            logging.INFO if self.name else logging.WARNING,
            "%sconfiguration %d applied: %s",
            who,
            version,
            _describe(change),
        )
        if self.applied is not None:
            self.applied(change)
        if errors:
            raise ReloadError("; ".join(errors))
        return True

    def _reload_users(self) -> list[str]:
        provider = self._users()
        if provider is None:
            if self.users_required:
                return ["users: this node has no users file (POLYMQ_AUTH=file:...)"]
            return []
        try:
            provider.reload()
        except (OSError, ValueError) as exc:
            return [f"users: {provider.path} kept its old contents: {exc}"]
        return []

    def _users_reloaded(self) -> None:
        for hook in self.users_hooks:
            try:
                hook()
            except Exception:  # pragma: no cover - a hook's bug must not stop the others
                log.exception("%s: a users reload hook failed", self.name or "core")


def _describe(change: dict[str, Any]) -> str:
    parts = [f"{key}={value}" for key, value in change.items() if key != "version"]
    return ", ".join(parts) or "nothing to change"
