"""What the operating system lets one polymq process hold.

Every client connection is an open file. A process starts with the soft limit its shell
gave it (often 1024), far below the hard limit a system allows (often 524288 or more), and a
broker at its soft limit silently resets new connections. :func:`raise_open_files` lifts the
soft limit to the hard one at start-up, as RabbitMQ and nginx do, and logs what it allows.
"""

from __future__ import annotations

import logging

__all__ = ["RESERVED_FILES", "raise_open_files"]

log = logging.getLogger(__name__)

RESERVED_FILES = 100  # kept for the process's own files: its stores, logs, listeners, peers


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
    room = max(int(soft) - RESERVED_FILES, 0)
    log.info(
        "open files: limit %d (hard %s): room for about %d client connections",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        room,
    )
    return int(soft)
