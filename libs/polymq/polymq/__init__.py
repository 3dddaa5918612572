"""polymq: the client of the multi-protocol message gateway's core.

The public API is what ``__all__`` lists (checked by ``tests/unit/polymq/test_exports.py``):
the primitive API's types, the exception tree, and the asyncio client of the core. Below it
are the sans-IO wire codec (``polymq.codec``, ``polymq.events``) and the client's parts
(``polymq.deliveries``, ``polymq.handles``, ``polymq.inproc``), imported from their modules.

The package needs only what the wire needs (msgpack): it imports neither aiohttp nor
prometheus-client, and it never imports the servers. What polymq's services share beyond the
client (settings, authentication, Avro, the frontends' core link, the aiohttp and TCP
frontends' glue, metrics) is the ``polymq_server`` library.
"""

from __future__ import annotations

from .client import (
    ChannelHandle,
    Client,
    Delivery,
    Lease,
    QueueHandle,
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
    DeclareOptions,
    Destination,
    Kind,
    Message,
    Overflow,
    SlowPolicy,
    SubscribeOptions,
)

__version__ = "0.1.0"

__all__ = [
    "AckMode",
    "BadRequest",
    "ChannelHandle",
    "Client",
    "Conflict",
    "ConnectionClosed",
    "DeclareOptions",
    "Delivery",
    "Destination",
    "Forbidden",
    "Gone",
    "Kind",
    "Lease",
    "Message",
    "NotFound",
    "Overflow",
    "PayloadTooLarge",
    "PolymqError",
    "ProtocolError",
    "QueueFull",
    "QueueHandle",
    "RequestError",
    "SlowConsumer",
    "SlowPolicy",
    "StreamHandle",
    "SubscribeOptions",
    "Subscription",
    "Timeout",
    "TopicHandle",
    "Unauthorized",
    "Unavailable",
    "__version__",
]
