"""polymq: the client of the multi-protocol message gateway's core.

The public API is what ``__all__`` lists (checked by ``tests/unit/polymq/test_exports.py``):
the primitive API's types, the exception tree, the asyncio client of the core and what its
calls answer (``polymq.answers``: :class:`Published`, :class:`Declared`, the stats of each
kind of destination, ...). Below it are the sans-IO wire codec (``polymq.codec``,
``polymq.events``) and the client's parts (``polymq.connection``, ``polymq.deliveries``,
``polymq.handles``, ``polymq.inproc``), imported from their modules.

The package needs only what the wire needs (msgpack): it imports neither aiohttp nor
prometheus-client, and it never imports the servers. What polymq's services share beyond the
client (settings, authentication, Avro, the frontends' core link, the aiohttp and TCP
frontends' glue, metrics) is the ``polymq_server`` library.
"""

from __future__ import annotations

from .answers import (
    Bound,
    ChannelStats,
    CursorOpened,
    CursorPage,
    Declared,
    DestinationStats,
    Published,
    QueueStats,
    StreamStats,
    TopicStats,
    Unbound,
)
from .client import (
    ChannelHandle,
    Client,
    Delivery,
    Lease,
    QueueHandle,
    Reconnected,
    Settled,
    StreamHandle,
    Subscription,
    TopicHandle,
)
from .errors import (
    BadRequest,
    Conflict,
    ConnectionClosed,
    Forbidden,
    Gone,
    NotFound,
    PayloadTooLarge,
    PolymqError,
    ProtocolError,
    QueueFull,
    RequestError,
    SlowConsumer,
    Timeout,
    Unauthorized,
    Unavailable,
)
from .types import (
    AckMode,
    ChannelRole,
    DeclareOptions,
    Destination,
    Kind,
    Message,
    Outcome,
    Overflow,
    SlowPolicy,
    SubscribeOptions,
)

__version__ = "0.1.0"

__all__ = [
    "AckMode",
    "BadRequest",
    "Bound",
    "ChannelHandle",
    "ChannelRole",
    "ChannelStats",
    "Client",
    "Conflict",
    "ConnectionClosed",
    "CursorOpened",
    "CursorPage",
    "DeclareOptions",
    "Declared",
    "Delivery",
    "Destination",
    "DestinationStats",
    "Forbidden",
    "Gone",
    "Kind",
    "Lease",
    "Message",
    "NotFound",
    "Outcome",
    "Overflow",
    "PayloadTooLarge",
    "PolymqError",
    "ProtocolError",
    "Published",
    "QueueFull",
    "QueueHandle",
    "QueueStats",
    "Reconnected",
    "RequestError",
    "Settled",
    "SlowConsumer",
    "SlowPolicy",
    "StreamHandle",
    "StreamStats",
    "SubscribeOptions",
    "Subscription",
    "Timeout",
    "TopicHandle",
    "TopicStats",
    "Unauthorized",
    "Unavailable",
    "Unbound",
    "__version__",
]
