"""polymq: the shared library of the multi-protocol message gateway.

The public API is what ``__all__`` lists (checked by ``tests/unit/polymq/test_exports.py``):
the primitive API's types, the exception tree, and the asyncio client of the core.
The wire codec (``polymq.codec``, ``polymq.events``), settings (``polymq.config``),
authentication (``polymq.auth``), Avro records (``polymq.avro``, ``polymq.avroview``), the
frontends' reconnecting core link (``polymq.corelink``), the shared base of the aiohttp
frontends (``polymq.web``) and the TCP adapter of the STOMP and AMQP sessions
(``polymq.transport``) are imported from their modules.
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
