"""The polymq exception tree.

::

    PolymqError
     ├── ProtocolError              the wire protocol was violated
     │    ├── LocalProtocolError    we were asked to send something illegal
     │    └── RemoteProtocolError   the peer sent something illegal (garbage, bad frame)
     ├── ConnectionClosed           the connection is gone; pending requests fail with it
     ├── Timeout                    no answer within the deadline
     └── RequestError               the server refused one operation (carries ``code``)
          ├── BadRequest            400  malformed arguments, illegal names, wrong types
          ├── Unauthorized          401  no or wrong credentials
          ├── Forbidden             403  credentials fine, permission missing
          ├── NotFound              404  destination, subscription or lease unknown
          ├── Conflict              409  re-declared with other options, wrong kind
          ├── Gone                  410  a cursor points before what the core still holds
          ├── PayloadTooLarge       413  body or frame over the configured maximum
          ├── QueueFull             429  max length / bytes reached with ``reject`` overflow
          ├── SlowConsumer          429  the subscriber's buffer overflowed
          └── Unavailable           503  shutting down, store failing

Every ``RequestError`` carries a ``code`` (a short machine word, also used on the
wire) and an HTTP ``status`` hint, in the manner of h11's ``error_status_hint``:
frontends translate it to an HTTP status, a STOMP ERROR or an AMQP reply code.
"""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "Conflict",
    "ConnectionClosed",
    "Forbidden",
    "Gone",
    "LocalProtocolError",
    "NotFound",
    "PayloadTooLarge",
    "PolymqError",
    "ProtocolError",
    "QueueFull",
    "RemoteProtocolError",
    "RequestError",
    "SlowConsumer",
    "Timeout",
    "Unauthorized",
    "Unavailable",
    "error_from_code",
]


class PolymqError(Exception):
    """Base of every error polymq raises."""


class ProtocolError(PolymqError):
    """The wire protocol was violated. ``error_status_hint`` tells how to answer."""

    error_status_hint: int = 400

    def __init__(self, msg: str, error_status_hint: int | None = None) -> None:
        super().__init__(msg)
        if error_status_hint is not None:
            self.error_status_hint = error_status_hint


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""


class ConnectionClosed(PolymqError):
    """The connection closed; the cause is in the message (and ``__cause__``), and ``code``
    is the word the server said goodbye with (``shutdown``, ``protocol-error``, ...)."""

    def __init__(self, msg: str, code: str = "closed") -> None:
        super().__init__(msg)
        self.code = code


class Timeout(PolymqError):
    """An operation did not complete within its deadline."""


class RequestError(PolymqError):
    """The server refused one operation."""

    code: str = "error"
    status: int = 500

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code)
        self.message = message or self.code


class BadRequest(RequestError):
    code = "bad-request"
    status = 400


class Unauthorized(RequestError):
    code = "unauthorized"
    status = 401


class Forbidden(RequestError):
    code = "forbidden"
    status = 403


class NotFound(RequestError):
    code = "not-found"
    status = 404


class Conflict(RequestError):
    code = "conflict"
    status = 409


class Gone(RequestError):
    code = "gone"
    status = 410


class PayloadTooLarge(RequestError):
    code = "too-large"
    status = 413


class QueueFull(RequestError):
    code = "queue-full"
    status = 429


class SlowConsumer(RequestError):
    code = "slow-consumer"
    status = 429


class Unavailable(RequestError):
    code = "unavailable"
    status = 503


_BY_CODE: dict[str, type[RequestError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        Gone,
        PayloadTooLarge,
        QueueFull,
        SlowConsumer,
        Unavailable,
    )
}


def error_from_code(code: str, message: str) -> RequestError:
    """Rebuild the typed error a server sent as ``(code, message)``."""
    cls = _BY_CODE.get(code, RequestError)
    err = cls(message)
    if cls is RequestError:
        err.code = code
    return err
