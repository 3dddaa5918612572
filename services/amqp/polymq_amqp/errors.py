"""The AMQP frontend's exception tree: every error carries the reply code to answer with.

::

    AmqpError                     reply_code + reply_text (+ the class/method it answers)
     ├── ChannelException         a soft error: channel.close, the connection lives on
     │                            (403, 404, 405, 406, and 311 / 313)
     └── ConnectionException      a hard error: connection.close, then the socket closes
          │                       (320, 402, 403 at login, 501-506, 530, 540, 541)
          └── ProtocolHeaderMismatch   not AMQP 0-9-1 at all: answered with the protocol
                                       header polymq speaks, then closed
    LocalProtocolError            we were about to send something the protocol forbids
                                  (a bug, or a race with a closing channel): nothing is sent

Like h11's ``error_status_hint``, a raiser says how to answer; the session only sends what
the error says. Errors from below (``polymq.errors``) are translated at the boundary by
:func:`from_polymq`. ``reply_text`` follows RabbitMQ's form, ``"NOT_FOUND - no queue 'x' in
vhost '/'"``, which clients show to their users as it is.
"""

from __future__ import annotations

import asyncio
from typing import Final

from polymq.errors import (
    BadRequest,
    Conflict,
    ConnectionClosed,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    PolymqError,
    QueueFull,
    RequestError,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "ACCESS_REFUSED",
    "CHANNEL_ERROR",
    "COMMAND_INVALID",
    "CONNECTION_FORCED",
    "CONTENT_TOO_LARGE",
    "FRAME_ERROR",
    "INTERNAL_ERROR",
    "NOT_ALLOWED",
    "NOT_FOUND",
    "NOT_IMPLEMENTED",
    "NO_ROUTE",
    "PRECONDITION_FAILED",
    "REPLY_NAMES",
    "RESOURCE_LOCKED",
    "SYNTAX_ERROR",
    "UNEXPECTED_FRAME",
    "AmqpError",
    "ChannelException",
    "ConnectionException",
    "LocalProtocolError",
    "ProtocolHeaderMismatch",
    "from_polymq",
]

REPLY_SUCCESS: Final = 200
CONTENT_TOO_LARGE: Final = 311
NO_ROUTE: Final = 312
NO_CONSUMERS: Final = 313
CONNECTION_FORCED: Final = 320
INVALID_PATH: Final = 402
ACCESS_REFUSED: Final = 403
NOT_FOUND: Final = 404
RESOURCE_LOCKED: Final = 405
PRECONDITION_FAILED: Final = 406
FRAME_ERROR: Final = 501
SYNTAX_ERROR: Final = 502
COMMAND_INVALID: Final = 503
CHANNEL_ERROR: Final = 504
UNEXPECTED_FRAME: Final = 505
RESOURCE_ERROR: Final = 506
NOT_ALLOWED: Final = 530
NOT_IMPLEMENTED: Final = 540
INTERNAL_ERROR: Final = 541

REPLY_NAMES: Final = {
    REPLY_SUCCESS: "REPLY_SUCCESS",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


class AmqpError(Exception):
    """An error answered with ``reply_code`` and ``reply_text``; ``class_id`` and
    ``method_id`` name the method that failed (0 when none did)."""

    def __init__(self, reply_code: int, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(detail)
        self.reply_code = reply_code
        self.detail = detail
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        """``NAME - detail``, at most 255 bytes (a short string)."""
        name = REPLY_NAMES.get(self.reply_code, str(self.reply_code))
        text = f"{name} - {self.detail}"
        data = text.encode("utf-8")
        if len(data) > 255:
            text = data[:252].decode("utf-8", "ignore") + "..."
        return text

    def about(self, class_id: int, method_id: int) -> AmqpError:
        """Name the method this error answers (unless one is named already)."""
        if not self.class_id:
            self.class_id, self.method_id = class_id, method_id
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reply_code}, {self.detail!r})"


class ChannelException(AmqpError):
    """A soft error: the channel is closed with channel.close; other channels go on."""


class ConnectionException(AmqpError):
    """A hard error: the connection is closed with connection.close."""


class ProtocolHeaderMismatch(ConnectionException):
    """The client does not speak AMQP 0-9-1: answer with our header and close."""

    def __init__(self, detail: str) -> None:
        super().__init__(COMMAND_INVALID, detail)


class LocalProtocolError(Exception):
    """We were about to send something the protocol does not allow now."""


def from_polymq(exc: BaseException, what: str = "request") -> AmqpError:
    """The AMQP answer to an error of the core (or of the link to it)."""
    if isinstance(exc, AmqpError):
        return exc
    if isinstance(exc, Unavailable | ConnectionClosed | TimeoutError | asyncio.TimeoutError):
        return ConnectionException(
            CONNECTION_FORCED, f"the broker's core is unavailable: {exc or 'timeout'}"
        )
    if isinstance(exc, Forbidden | Unauthorized):
        return ChannelException(ACCESS_REFUSED, f"{what}: {exc}")
    if isinstance(exc, NotFound):
        return ChannelException(NOT_FOUND, f"{what}: {exc}")
    if isinstance(exc, Conflict):
        return ChannelException(PRECONDITION_FAILED, f"{what}: {exc}")
    if isinstance(exc, PayloadTooLarge):
        return ChannelException(PRECONDITION_FAILED, f"{what}: {exc}")
    if isinstance(exc, QueueFull):
        return ChannelException(PRECONDITION_FAILED, f"{what}: {exc}")
    if isinstance(exc, BadRequest):
        return ChannelException(PRECONDITION_FAILED, f"{what}: {exc}")
    if isinstance(exc, RequestError | PolymqError):
        return ChannelException(PRECONDITION_FAILED, f"{what}: {exc}")
    return ConnectionException(INTERNAL_ERROR, f"internal error: {exc!r}"[:200])
