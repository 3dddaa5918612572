"""Avro messages seen as JSON, for the frontends that show them to JSON clients (HTTP's pull,
STOMP's ``accept: application/json``, the Avro frontend's JSON reads).

Two steps, so that the message path stays synchronous: :func:`load_schemas` (async) makes
sure the schemas of a batch of messages are in the
:class:`~polymq_server.messages.avro.SchemaCache`, then
:func:`json_value` decodes one message with what is cached. A message that is not Avro, or
whose schema is not stored, or whose bytes do not decode, has no JSON value: the caller
shows it as it is (and may say why, with the error :func:`json_value` gives).

A view never fails: a stored message is delivered whatever its bytes (a poison message that
stopped every pull would be undeliverable for ever). The bytes are checked against the
bounds of :mod:`polymq_server.messages.avrobounds` before fastavro reads them, and whatever goes
wrong while decoding or converting becomes the error that :func:`json_value` gives.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from polymq.errors import PolymqError
from polymq.types import Message

from .avro import (
    AvroError,
    SchemaCache,
    UnknownSchema,
    decode_single,
    message_schema_id,
    to_json_value,
)

__all__ = ["json_value", "load_schemas", "schema_of"]


def schema_of(message: Message) -> str | None:
    """The schema id of an Avro message (``avro.message_schema_id``), else None."""
    return message_schema_id(message)


async def load_schemas(cache: SchemaCache, messages: Iterable[Message]) -> None:
    """Load the schemas of the Avro messages among ``messages`` that the cache lacks.
    Unknown schemas and a core that cannot answer are left for :func:`json_value` to say."""
    for sid in {s for s in map(schema_of, messages) if s is not None}:
        if sid not in cache:
            try:
                await cache.get(sid)
            except (AvroError, PolymqError):
                pass


def json_value(cache: SchemaCache, message: Message) -> tuple[Any, str | None]:
    """``(value, None)``: the message's record as JSON-able data; ``(None, why)`` when it
    has none (``why`` is None for a message that is not Avro at all)."""
    sid = schema_of(message)
    if sid is None:
        return None, None
    schema = cache.cached(sid)
    if schema is None:
        return None, str(UnknownSchema(sid))
    try:
        return to_json_value(decode_single(message.body, schema)), None
    except AvroError as exc:
        return None, str(exc)
    except Exception as exc:  # a value a logical type cannot hold, a converter's error...
        return None, f"the record cannot be shown as JSON: {str(exc)[:300] or type(exc).__name__}"
