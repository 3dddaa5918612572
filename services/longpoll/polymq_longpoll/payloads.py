"""JSON in and out for subscriptions and polls. Publishing, settling and reading a body are
every JSON frontend's (``polymq_server.web.payloads``), and a delivered message is shown as
:func:`polymq_server.messages.jsonview.message_json` shows it: one message format everywhere."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from polymq import Message
from polymq.errors import BadRequest
from polymq.types import Destination, Kind, parse_offset
from polymq_server.messages.avro import SchemaCache
from polymq_server.messages.jsonview import message_json as _message_json
from polymq_server.web.payloads import no_query as no_query
from polymq_server.web.payloads import query_value as query_value
from polymq_server.web.problems import bad_request

from .config import LongpollSettings
from .subscriptions import AckMode

OPEN_KEYS = frozenset({"destination", "offset", "ttl", "visibility", "buffer", "ack", "prefetch"})
MAX_VISIBILITY = 43200.0  # the core's bound
MIN_VISIBILITY = 0.1
DEFAULT_VISIBILITY = 30.0  # seconds a queue poll leases for, as the core's pull


def parse_open(
    data: Any, settings: LongpollSettings
) -> tuple[Destination, dict[str, Any], AckMode, int]:
    """``{"destination", "offset"?, "ttl"?, "visibility"?, "buffer"?, "ack"?, "prefetch"?}``:
    the destination, the core's options, the ack mode and the prefetch."""
    if not isinstance(data, dict):
        raise bad_request("the subscription must be a JSON object")
    unknown = sorted(set(data) - OPEN_KEYS)
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise bad_request(f"unknown field(s) in the subscription: {shown}")
    raw_dest = data.get("destination")
    if not isinstance(raw_dest, str):
        kinds = "'queue/<name>', 'topic/<pattern>' or 'stream/<name>'"
        raise bad_request(f"destination is required: {kinds}")
    dest = Destination.parse(raw_dest, pattern=True)  # BadRequest: a 400 problem
    if dest.kind is Kind.CHANNEL:
        raise bad_request("subscribe to a channel's queues through the HTTP or STOMP frontend")
    options: dict[str, Any] = {
        "ttl": _number(data, "ttl", settings.longpoll_ttl, 1.0, settings.longpoll_max_ttl)
    }
    offset = data.get("offset")
    if offset is not None:
        if dest.kind is not Kind.STREAM:
            raise bad_request("offset applies to streams only")
        try:
            parse_offset(offset)
        except BadRequest as exc:
            raise bad_request(str(exc)) from None
        options["offset"] = offset
    if dest.kind is Kind.QUEUE:
        options["visibility"] = _number(
            data, "visibility", DEFAULT_VISIBILITY, MIN_VISIBILITY, MAX_VISIBILITY
        )
    elif data.get("visibility") is not None:
        raise bad_request("visibility applies to queues only")
    buffer = data.get("buffer")
    if buffer is not None and dest.kind is not Kind.TOPIC:
        raise bad_request("buffer applies to topics only")
    if dest.kind is Kind.TOPIC:
        options["buffer"] = _integer(
            data, "buffer", settings.longpoll_buffer, 1, settings.longpoll_max_buffer
        )
    ack = data.get("ack", "client")
    try:
        mode = AckMode(ack)
    except ValueError:
        raise bad_request("ack must be 'client' or 'auto'") from None
    if mode is AckMode.AUTO and dest.kind is not Kind.QUEUE:
        raise bad_request("ack applies to queues only (topics and streams need no acks)")
    prefetch = _integer(data, "prefetch", settings.longpoll_prefetch, 1, settings.longpoll_max_poll)
    return dest, options, mode, prefetch


def _number(d: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v <= high:
        raise bad_request(f"{key} must be a number of seconds {low:g}..{high:g}")
    return float(v)


def _integer(d: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise bad_request(f"{key} must be an integer {low}..{high}")
    return v


# ---- polls ---------------------------------------------------------------------------------
def parse_max(request: web.Request, default: int, limit: int) -> int:
    raw = query_value(request, "max")
    if raw is None:
        return min(default, limit)
    try:
        n = int(raw)
    except ValueError:
        raise bad_request(f"max must be an integer 1..{limit}") from None
    if not 1 <= n <= limit:
        raise bad_request(f"max must be an integer 1..{limit}")
    return n


def parse_wait(request: web.Request, limit: float) -> float:
    raw = query_value(request, "wait")
    if raw is None:
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        raise bad_request("wait must be a number of seconds") from None
    if not math.isfinite(wait) or wait < 0:
        raise bad_request("wait must be a number of seconds")
    if wait > limit:
        raise bad_request(f"wait must be at most {limit:g} seconds (this service's limit)")
    return wait


# ---- messages out ------------------------------------------------------------------------------
def message_json(
    message: Message, receipt: str, cursor: int, schemas: SchemaCache | None = None
) -> dict[str, Any]:
    """A delivered message as the HTTP frontend shows a pulled one (an Avro record decoded
    as ``value`` when ``schemas`` holds its schema), plus the cursor that resumes right after
    it; ``receipt`` only for queue leases."""
    shown = _message_json(message, schemas)
    out = {"receipt": receipt, **shown} if receipt else shown
    out["cursor"] = str(cursor)
    return out
