"""Where a basic.publish to an exchange goes: the core destinations of the exchanges it
reaches (``e2e.py``), from the cached records (:func:`route_now`, raising
:class:`~polymq_amqp.e2e.Missing` when one is not cached) or reading the missing ones
first (:func:`route_later`, in the session's busy task)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from . import e2e
from .errors import ACCESS_REFUSED, ChannelException
from .names import UnmappableName, VhostNames
from .topology import ExchangeRecord, Topology, plain_args

__all__ = ["route_later", "route_now"]


def route_now(
    topology: Topology,
    names: VhostNames,
    rec: ExchangeRecord,
    routing_key: str,
    headers: Mapping[str, Any] | None,
    known: Mapping[str, ExchangeRecord | None] | None = None,
) -> list[str]:
    """The destinations of a publish to ``rec``; ``known``: exchanges read since (None:
    there is none). 403 for an internal exchange."""
    if rec.internal:
        raise ChannelException(
            ACCESS_REFUSED,
            f"cannot publish to internal exchange '{rec.name}' in vhost '{names.vhost}'",
        )

    def exchange(name: str) -> ExchangeRecord | bool | None:
        found = topology.cached_exchange(names, name)
        if found is not None:
            return found
        if known is not None and name in known:
            return known[name] or False
        return None

    def queue(name: str) -> str | None:
        try:
            return names.queue(name)
        except UnmappableName:
            return None

    reached = e2e.reached(
        rec,
        routing_key,
        headers,
        exchange,
        partial(topology.cached_bindings_from, names),
        plain_args,
    )
    return e2e.destinations(
        reached,
        routing_key,
        headers,
        partial(topology.cached_exchange_bindings, names),
        lambda name: names.publish_topic(name, routing_key),
        queue,
        plain_args,
    )


async def route_later(
    topology: Topology,
    names: VhostNames,
    rec: ExchangeRecord,
    routing_key: str,
    headers: Mapping[str, Any] | None,
) -> list[str]:
    """:func:`route_now`, reading each record it misses until it has them all."""
    known: dict[str, ExchangeRecord | None] = {}
    for _ in range(4 * e2e.MAX_EXCHANGES):
        try:
            return route_now(topology, names, rec, routing_key, headers, known)
        except e2e.Missing as missing:  # read it, then route again
            if missing.what == "exchange":
                known[missing.name] = await topology.exchange(names, missing.name)
            elif missing.what == "sources":
                await topology.bindings_from(names, missing.name)
            else:
                await topology.exchange_bindings(names, missing.name)
    return route_now(topology, names, rec, routing_key, headers, known)  # (Missing: a bug)
