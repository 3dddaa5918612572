"""Settling queue leases by receipt, as every JSON frontend does it: ``POST /v1/ack`` and
``POST /v1/nack`` once their body is parsed.

- :func:`settle_receipts`: settle receipts from any request, with the outcome of
  :func:`settle_outcome`; :func:`receipt_destination` is the queue a receipt names.
- :func:`add_settle_routes`: both routes, answered by one :class:`SettleHandler`.

Errors: :func:`settle_receipts` raises ``polymq.errors.NotFound`` (404) when no receipt is
well-formed, and lets the ``Forbidden`` of ``authorize`` and the core's errors through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from polymq.errors import NotFound
from polymq.types import Destination, Kind, Outcome

from ..link.corelink import CoreLink

__all__ = [
    "SettleHandler",
    "add_settle_routes",
    "receipt_destination",
    "settle_outcome",
    "settle_receipts",
]


def receipt_destination(receipt: str) -> str | None:
    """The queue a receipt (``queue/<name>|<seq>|<delivery>``) settles, or None if malformed."""
    key, sep, rest = receipt.partition("|")
    seq, sep2, delivery_id = rest.partition("|")
    if not (
        sep
        and sep2
        and seq.isdigit()
        and delivery_id.isdigit()
        and seq.isascii()
        and delivery_id.isascii()
    ):
        return None
    try:
        dest = Destination.parse(key)
    except Exception:
        return None
    return str(dest) if dest.kind is Kind.QUEUE else None


def settle_outcome(*, nack: bool, requeue: bool) -> Outcome:
    """The outcome of ``POST /v1/ack`` (ack) or ``POST /v1/nack`` (requeue, or reject, to
    the dead letters, when its body says ``"requeue": false``)."""
    return Outcome.of_nack(requeue) if nack else Outcome.ACK


class SettleHandler(Protocol):
    """A frontend's handler of ``POST /v1/ack`` (``nack`` false) and ``/v1/nack``."""

    def __call__(self, request: web.Request, *, nack: bool) -> Awaitable[web.StreamResponse]: ...


def add_settle_routes(app: web.Application, settle: SettleHandler) -> None:
    """``POST /v1/ack`` and ``POST /v1/nack``, both answered by ``settle``."""

    async def ack(request: web.Request) -> web.StreamResponse:
        return await settle(request, nack=False)

    async def nack(request: web.Request) -> web.StreamResponse:
        return await settle(request, nack=True)

    app.router.add_post("/v1/ack", ack)
    app.router.add_post("/v1/nack", nack)


async def settle_receipts(
    core: CoreLink,
    receipts: list[str],
    outcome: Outcome,
    authorize: Callable[[str], None],
    *,
    done: Callable[[list[str]], None] | None = None,
) -> dict[str, Any]:
    """Settle queue leases by receipt with ``outcome``: ``{"settled": n, "missing":
    [...]}``, where malformed receipts and those the
    core no longer knows are missing. ``authorize(queue)`` raises if the caller may not read
    a queue named; ``done(receipts sent to the core)`` is called however the core answers."""
    known: list[str] = []
    missing: list[str] = []
    for receipt in receipts:
        dest = receipt_destination(receipt)
        if dest is None:
            missing.append(receipt)
            continue
        authorize(dest)
        known.append(receipt)
    if not known:
        raise NotFound("unknown or malformed receipt(s)")
    try:
        result = await core.call(lambda c: c.settle(known, outcome))
    finally:
        if done is not None:
            done(known)
    return {"settled": result.settled, "missing": missing + result.missing}
