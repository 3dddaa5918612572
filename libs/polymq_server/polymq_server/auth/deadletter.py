"""A declaration's dead-letter target, authorized as a publish there by the user who names it.

Every frontend that declares queues for its clients (HTTP ``PUT``, AMQP ``queue.declare``
with ``x-dead-letter-exchange``, STOMP ``SUBSCRIBE`` with ``x-dead-letter-*`` headers) passes
the core options through :func:`for_user` first: WRITE on ``dead_letter`` is checked with the
frontend's own ``authorize`` (so the refusal is the protocol's: HTTP 403, AMQP 403
ACCESS_REFUSED, a STOMP ERROR), and the user is named in ``dead_letter_by``, on whose
permission the core sends each dead letter later (``polymq_core.handlers.deadletters`` re-checks it
then). ``DECLARER`` is not a key a client may set itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .principals import Permission, Principal

__all__ = ["DECLARER", "for_user"]

DECLARER: Final = "dead_letter_by"


def for_user(
    options: dict[str, Any],
    principal: Principal,
    authorize: Callable[[Permission, str], None],
) -> dict[str, Any]:
    """``options`` with the declarer named, once ``authorize(WRITE, dead_letter)`` returned
    (it raises the frontend's refusal); ``options`` itself without a ``dead_letter``."""
    target = options.get("dead_letter")
    if target is None:
        return options
    authorize(Permission.WRITE, str(target))
    return {**options, DECLARER: "" if principal.anonymous else principal.name}
