"""Where a basic.publish to an exchange goes is :mod:`polymq_server.exchanges.resolution`'s (shared
with the
STOMP frontend), from the topology's cached records (``route_now``, raising
:class:`~polymq_server.exchanges.resolution.Missing` when one is not cached) or reading the missing
ones first
(``route_later``, in the session's busy task). Here: what RabbitMQ refuses first, as the
channel exception it raises."""

from __future__ import annotations

from polymq_server.names import VhostNames

from .errors import ACCESS_REFUSED, ChannelException
from .topology import ExchangeRecord

__all__ = ["check_publish"]


def check_publish(names: VhostNames, rec: ExchangeRecord) -> None:
    """403 for a publish to an internal exchange."""
    if rec.internal:
        raise ChannelException(
            ACCESS_REFUSED,
            f"cannot publish to internal exchange '{rec.name}' in vhost '{names.vhost}'",
        )
