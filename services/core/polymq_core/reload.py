"""Configuration reloads, without a restart: the log level, and the core's users and grants
(re-read from its ``POLYMQ_AUTH`` file).

A reload is a small JSON object, ``{"version": N, "log_level": "DEBUG", "users": true}``
(each change optional). In a cluster it is broadcast on ``system.config`` (NATS subject
``polymq.system.config``) and every node applies it; each node announces the version it
applied last on ``system.peers`` (``config_version``), so ``polymq cluster list`` shows a
node that missed one. On one node it is applied at once.

Versions are the unix time in nanoseconds of the request: a node ignores a reload older
than the one it applied (a late or repeated message changes nothing).

Errors: :class:`ReloadError` for a change that cannot be applied (an unknown log level, a
users file that no longer reads), raised before anything of it is applied where it can be
checked first; the users file is checked by re-reading it, and a bad one keeps the users
there were.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from polymq.auth import AuthProvider, FileProvider

__all__ = ["LEVELS", "ReloadError", "Reloader", "new_change"]

log = logging.getLogger(__name__)

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SUBJECT = "polymq.system.config"


class ReloadError(ValueError):
    """A reload that cannot be applied; the message says why."""


def new_change(request: Any) -> dict[str, Any]:
    """A reload from a request's JSON (``{"log_level"?, "users"?}``), checked, with its
    version; ReloadError if it is not one."""
    if not isinstance(request, dict) or set(request) - {"log_level", "users"}:
        raise ReloadError('a reload is {"log_level": "INFO", "users": true}, each optional')
    change: dict[str, Any] = {"version": time.time_ns()}
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
    return change


class Reloader:
    """Applies reloads to this process: ``version`` is the last one applied (0: none)."""

    def __init__(self, auth: AuthProvider) -> None:
        self.auth = auth
        self.version = 0

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
        if version <= self.version:
            return False
        self.version = version
        level = change.get("log_level")
        if isinstance(level, str) and level in LEVELS:
            logging.getLogger().setLevel(level)
        if change.get("users"):
            provider = self._users()
            if provider is None:
                raise ReloadError("users: this node has no users file (POLYMQ_AUTH=file:...)")
            try:
                provider.reload()
            except (OSError, ValueError) as exc:
                raise ReloadError(f"users: {provider.path} kept its old contents: {exc}") from exc
        log.warning("configuration %d applied: %s", version, _describe(change))
        return True


def _describe(change: dict[str, Any]) -> str:
    parts = [f"{key}={value}" for key, value in change.items() if key != "version"]
    return ", ".join(parts) or "nothing to change"
