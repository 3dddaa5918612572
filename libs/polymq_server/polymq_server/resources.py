"""What the operating system lets one polymq process hold.

Every client connection is an open file. A process starts with the soft limit its shell
gave it (often 1024), far below the hard limit a system allows (often 524288 or more), and a
broker at its soft limit silently resets new connections. :func:`raise_open_files` lifts the
soft limit to the hard one at start-up, as RabbitMQ and nginx do, and logs what it allows.
:func:`die_with_parent` ties a child process's life to its parent's (Linux).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Any

__all__ = [
    "RESERVED_FILES",
    "Admission",
    "ConnectionLimits",
    "connection_room",
    "die_with_parent",
    "give_back_memory",
    "raise_open_files",
]

log = logging.getLogger(__name__)

RESERVED_FILES = 100  # kept for the process's own files: its stores, logs, listeners, peers
_PR_SET_PDEATHSIG = 1


def _find_malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another libc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _find_malloc_trim()


def give_back_memory() -> None:
    """Hand freed heap memory back to the system (glibc ``malloc_trim(0)``): message bodies
    past 512 bytes live in malloc's heap, and what was freed stays resident until then (a
    queue that drained, a replicated store's applied entries), while the memory alarm
    reads the resident size."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def die_with_parent(parent: int, sig: int) -> None:
    """Have the kernel send this process ``sig`` when the process that started it (pid
    ``parent``, read before the fork) dies, even by SIGKILL (``PR_SET_PDEATHSIG``); if that
    one died already, ``sig`` now. Where there is no ``prctl`` (not Linux), nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl: nobody would signal us
        os.kill(os.getpid(), sig)


def raise_open_files() -> int:
    """Raise this process's soft limit on open files to its hard limit; log it and the
    connections it leaves room for. Returns the soft limit now in force (0 where the
    platform has no such limit)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not a POSIX system
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("open files: could not raise the limit %d to %d: %s", soft, target, exc)
        else:
            log.debug("open files: soft limit raised from %d to %d", soft, target)
            soft = target
    global _room
    room = _room = max(int(soft) - RESERVED_FILES, 0)
    log.info(
        "open files: limit %d (hard %s): room for about %d client connections",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        room,
    )
    return int(soft)


_room = 0  # connections the open-files limit leaves room for (raise_open_files sets it)


def connection_room() -> int:
    """The client connections this process's open-files limit leaves room for (0 when
    :func:`raise_open_files` has not run or the platform has no limit)."""
    return _room


class ConnectionLimits:
    """The connections one listener takes: at most ``max_connections`` at once (0: the room
    the open-files limit leaves, :func:`connection_room`; none if that is unknown) and at
    most ``max_per_user`` for one user (0: no such limit), as RabbitMQ's per-user and
    per-vhost ``max-connections``. A refused connection is told why in its protocol (a
    STOMP ERROR, an AMQP close, a wire Goodbye) rather than reset.

    Each connection gets an :class:`Admission` at accept (:meth:`admit`), says who it is
    with :meth:`Admission.login`, and gives its place back with :meth:`Admission.release`."""

    def __init__(self, listener: str, max_connections: int = 0, max_per_user: int = 0) -> None:
        self.listener = listener
        self.max_connections = max_connections or connection_room()
        self.max_per_user = max_per_user
        self.open = 0
        self.users: dict[str, int] = {}
        self.refused = 0

    def admit(self, *, counted: bool = True) -> Admission:
        """A new connection's admission: counted (unless not ``counted``: polymq's own
        in-process links), or refused (``refused`` says why) when the listener is full."""
        if not counted:
            return Admission(None, None)
        if self.max_connections and self.open >= self.max_connections:
            self.refused += 1
            if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
                log.warning(
                    "%s: %d connections, the most it takes: refusing new ones (%d so far)",
                    self.listener,
                    self.open,
                    self.refused,
                )
            return Admission(
                None, f"{self.listener} has {self.open} connections, the most it takes"
            )
        self.open += 1
        return Admission(self, None)


class Admission:
    """One connection's place in its listener's :class:`ConnectionLimits`."""

    def __init__(self, limits: ConnectionLimits | None, refused: str | None) -> None:
        self._limits = limits  # None: nothing counted (refused, or not counted at all)
        self.refused = refused  # why the listener refused it, if it did
        self.user: str | None = None  # the user it is counted for, once logged in

    def login(self, user: str) -> str | None:
        """None (counted for ``user``), or why it may not go on: the listener refused it,
        or ``user`` holds as many connections as one user may."""
        limits = self._limits
        if self.refused is not None or limits is None:
            return self.refused
        held = limits.users.get(user, 0)
        if limits.max_per_user and held >= limits.max_per_user:
            limits.refused += 1
            return f"user '{user[:100]}' has {held} connections, the most one user may have"
        limits.users[user] = held + 1
        self.user = user
        return None

    def release(self) -> None:
        """The connection closed: its place (and its user's) is free again (once)."""
        limits, self._limits = self._limits, None
        if limits is None:
            return
        limits.open = max(limits.open - 1, 0)
        user = self.user
        if user is not None and user in limits.users:
            left = limits.users[user] - 1
            if left > 0:
                limits.users[user] = left
            else:
                del limits.users[user]
