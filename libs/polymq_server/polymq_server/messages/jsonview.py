"""A message as the HTTP-family frontends show it to JSON clients: the JSON over HTTP
frontend's pull, the long-polling frontend's polls and its server-sent events. One format
everywhere, so that a client moving between them reads the same fields.

The body is text when it is UTF-8 (``encoding: utf8``), else base64 (``encoding: base64``);
the headers are the public ones (no other frontend's bookkeeping,
:mod:`polymq_server.messages.headers`).
Given a :class:`~polymq_server.messages.avro.SchemaCache` holding the message's schema (load it
first with
:func:`polymq_server.messages.avroview.load_schemas`), an Avro record also comes decoded, as
``value``
(null, with ``value_error`` saying why, when it cannot be decoded).
"""

from __future__ import annotations

import base64
from typing import Any

from polymq.types import Message

from .avro import SchemaCache
from .avroview import json_value, schema_of
from .headers import public_headers

__all__ = ["message_json"]


def message_json(message: Message, schemas: SchemaCache | None = None) -> dict[str, Any]:
    """``message`` as JSON-able data (see the module's docstring)."""
    m = message
    try:
        body, encoding = m.body.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
    out = {
        "id": m.id,
        "seq": m.seq,
        "destination": m.destination,
        "body": body,
        "encoding": encoding,
        "content_type": m.content_type,
        "headers": public_headers(m.headers),
        "priority": m.priority,
        "persistent": m.persistent,
        "delivery_count": m.delivery_count,
        "redelivered": m.redelivered,
        "timestamp": m.timestamp,
        "expires": m.expires,
        "correlation_id": m.correlation_id,
        "reply_to": m.reply_to,
    }
    if schemas is not None and schema_of(m) is not None:
        out["value"], error = json_value(schemas, m)
        if error is not None:
            out["value_error"] = error
    return out
