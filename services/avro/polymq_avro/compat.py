"""Schema compatibility rules, decided by Apache Avro's own reader/writer checker
(``avro.compatibility.ReaderWriterCompatibilityChecker``); nothing is hand-written here but
which pairs to check.

A rule names who must read whom. ``BACKWARD``: the new schema reads data written with the
latest one (consumers upgrade first); ``FORWARD``: the latest reads the new (producers
upgrade first); ``FULL``: both. The ``_TRANSITIVE`` forms check every earlier version, not
only the latest; ``NONE`` checks nothing. Sans-IO: schemas in, messages out.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence

import avro.errors
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from polymq_server.messages.avro import InvalidSchema

__all__ = ["Compatibility", "apache_schema", "incompatibilities"]


class Compatibility(enum.Enum):
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.value.startswith(("FORWARD", "FULL"))


@functools.lru_cache(maxsize=1024)
def apache_schema(text: str) -> avro.schema.Schema:
    """Apache Avro's parse of a schema's JSON (stricter than fastavro's: names, defaults,
    required attributes); InvalidSchema if it refuses it."""
    try:
        return avro.schema.parse(text)
    except RecursionError:
        raise InvalidSchema("the schema is nested too deeply") from None
    except (avro.errors.AvroException, ValueError, TypeError, KeyError, AttributeError) as exc:
        detail = str(exc).strip() or type(exc).__name__
        raise InvalidSchema(f"not a valid Avro schema: {detail[:300]}") from None


def _pair(reader: avro.schema.Schema, writer: avro.schema.Schema, what: str) -> list[str]:
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(reader, writer)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted({i.value for i in result.incompatibilities})) or "incompatible"
    details = "; ".join(sorted(result.messages))
    where = ", ".join(sorted(result.locations))
    return [f"{what}: {kinds} at {where}" + (f" ({details})" if details else "")]


def incompatibilities(
    rule: Compatibility, new: str, existing: Sequence[tuple[int, str]]
) -> list[str]:
    """Why the schema ``new`` (JSON) may not follow ``existing`` (``(version, JSON)``,
    oldest first) under ``rule``; an empty list if it may."""
    if rule is Compatibility.NONE or not existing:
        return []
    candidate = apache_schema(new)
    against = existing if rule.transitive else existing[-1:]
    messages: list[str] = []
    for version, text in reversed(against):
        old = apache_schema(text)
        if rule.backward:
            messages += _pair(candidate, old, f"the new schema cannot read version {version}")
        if rule.forward:
            messages += _pair(old, candidate, f"version {version} cannot read the new schema")
    return messages
