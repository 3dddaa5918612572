"""The exceptions of polymq_spark, one tree::

    PolymqSparkError
    ├── OptionError            a write option is missing or malformed (names the option)
    ├── UnsupportedTypeError   a DataFrame column whose type has no Avro mapping (names the column)
    ├── EncodingError          a row that does not fit the Avro schema (fastavro refused it)
    ├── DeliveryError          the Avro frontend refused a batch, or could not be reached in time
    └── InjectedFailure        the ``failAfterBatches`` test hook fired (attempt 0 only)

Errors from below (``http.client``, ``OSError``, fastavro) are translated into these at the
boundary, with the original as ``__cause__``. Raised inside a Spark task, they reach the driver
wrapped in Spark's own ``PythonException``, whose message carries ours.
"""

from __future__ import annotations

__all__ = [
    "DeliveryError",
    "EncodingError",
    "InjectedFailure",
    "OptionError",
    "PolymqSparkError",
    "UnsupportedTypeError",
]


class PolymqSparkError(Exception):
    """The root of every error this package raises."""


class OptionError(PolymqSparkError, ValueError):
    """A write option is missing or malformed."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"polymq option {option!r}: {problem}")
        self.option = option


class UnsupportedTypeError(PolymqSparkError, TypeError):
    """A Spark type (at ``path`` in the schema) that has no Avro mapping."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"column {path!r}: {problem}")
        self.path = path


class EncodingError(PolymqSparkError, ValueError):
    """fastavro could not encode a batch of rows (a value that does not fit its column)."""


class DeliveryError(PolymqSparkError):
    """A batch was refused (``status`` set: the HTTP status) or could not be delivered."""

    def __init__(self, message: str, status: int | None = None, batch_id: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.batch_id = batch_id


class InjectedFailure(PolymqSparkError):
    """Raised by the ``failAfterBatches`` test hook: not a real failure."""
