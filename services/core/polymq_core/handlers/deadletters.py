"""Whose permission a queue's dead letters ride on: checked when the queue is declared, and
again each time a message is dead-lettered.

A dead-letter target (``dead_letter``) is a publish the declarer arranges for later, so it
is authorized as one: declaring a queue with a ``dead_letter`` needs WRITE on that target
(a ``system.*`` name, reserved, is refused by ``AuthProvider.authorize`` like any publish
there), and the queue keeps the name of the user it was declared for
(``DeclareOptions.dead_letter_by``; ``""`` is the anonymous client). When a message leaves
the queue unacked (rejected, expired, too many deliveries, dropped as the oldest), it goes
to the target only if that user, as the users file says now (the core reloads it with
every frontend), still may write there; otherwise it is dropped, as if the queue had no
dead-letter target, with a warning in the log (once a minute per queue).

Who the declarer is: a client of the core's own wire protocol is its login, whatever its
options say. Logins that act for others name the user they declare for, and the name they
pass is kept: polymq's own links (the service token of ``polymq run``, peers, a hand-over),
logins tagged ``administrator``, and logins granted every permission on ``*`` (what a
deployed frontend's core login is: the chart's ``auth.frontendLogin``). Each frontend checks
that user's WRITE on the target before it declares (``polymq_server.auth.deadletter``). A frontend
whose core login is none of these is recorded as itself: the check at declare time still
holds (the frontend makes it), but the re-check then covers that login's grants, not its
client's. (So a user granted everything can name another declarer for its own queues: it
could write there itself anyway; its dead letters then follow that user's grant.)

Queues declared before this was kept (no ``dead_letter_by``) dead-letter as they did.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from polymq.errors import BadRequest
from polymq_server.auth.principals import trusted
from polymq_server.auth.provider import ALL_PERMISSIONS, AuthProvider, Grant, Permission, Principal

__all__ = ["may_dead_letter", "stamp"]

log = logging.getLogger(__name__)

_DL, _BY = "dead_letter", "dead_letter_by"
_WARN_EVERY = 60.0  # seconds between two warnings of the same queue's dropped dead letters
_warned: dict[tuple[str, str], float] = {}  # (queue, target) -> when last warned


_EVERYTHING = Grant("*", ALL_PERMISSIONS)


def _acts_for_others(principal: Principal) -> bool:
    """polymq's own links and administrators (``trusted``: the service token and the cluster
    secret log in with the administrator tag), and a login granted everything on ``*`` (the
    chart's frontend login)."""
    return trusted(principal) or _EVERYTHING in principal.grants


def stamp(auth: AuthProvider, principal: Principal | None, options: Any) -> None:
    """Check a Declare's ``options`` (its map, changed in place) for ``principal``: WRITE on
    its ``dead_letter`` (Forbidden), and the declarer recorded. Nothing without a
    ``dead_letter``, or without a principal (anonymous mode)."""
    if not isinstance(options, dict) or options.get(_DL) is None or principal is None:
        return
    target = options[_DL]
    if not isinstance(target, str):
        raise BadRequest("dead_letter must be a queue, topic or stream")
    if _acts_for_others(principal) and options.get(_BY) is not None:
        return  # a frontend (or a peer) names who it declares for; it checked them
    auth.authorize(principal, Permission.WRITE, target)
    options[_BY] = "" if principal.anonymous else principal.name


def may_dead_letter(auth: AuthProvider, by: str | None, target: str, source: str) -> bool:
    """Whether a message leaving ``source`` may be dead-lettered to ``target`` on the
    permission of ``by`` (the queue's declarer; None: declared before declarers were kept)."""
    if by is None or auth.may(by, Permission.WRITE, target):
        return True
    now, key = time.monotonic(), (source, target)
    if _warned.get(key, -_WARN_EVERY) + _WARN_EVERY <= now:  # once a minute per queue
        if len(_warned) >= 1024:
            _warned.clear()
        _warned[key] = now
        who = f"user {by!r}" if by else "the anonymous client"
        log.warning(
            "dead letters from %s dropped: %s, who declared it, may no longer write to %s",
            source,
            who,
            target,
        )
    return False
