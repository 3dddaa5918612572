"""Subscription ids and cursors as clients see them.

The subscription itself lives in the core (``Client.cursor_open``), so that any longpoll
process can serve any poll. What this frontend needs to serve it without state of its own
travels in the id it hands out: the core's id, the destination (for authorization on every
request), the ack mode, the prefetch, a queue's lease time and the ttl (so that no wait at
the core outlasts it: the core renews a subscription when a poll starts, not while it
waits), and its owner: the user who opened it (``""`` for the anonymous client).

The id is base64url of a small JSON array, a ``.`` and a MAC of that text (HMAC-SHA256, 128
bits) under a key every replica of this frontend shares (:func:`ids_key`): an id whose
text was changed in any way (another destination, another owner, another core id) or made
up is not one of ours (404), and one that another user presents is refused (403). So an id
reads only the destination it was opened on, for the user who opened it, who must still
be allowed to read there; the core's id inside it (96 random bits) is not enough alone.

A cursor is the decimal text of the core's integer cursor. Every message carries the
cursor that resumes right after it, so a client that stops mid-answer (or an SSE stream cut
between two events) resumes exactly: for a topic the positions of one answer are
consecutive, for a stream the cursor is the message's sequence, and for a queue it does
not move (unacked leases come back when they expire).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from polymq import Message
from polymq.errors import BadRequest
from polymq.types import Destination, Kind
from polymq_server.web.problems import Problem, bad_request

MAX_CURSOR = 2**63 - 1
_VERSION = 2  # 1 was unsigned and had no owner
_MAX_ID = 4096  # characters of an id (a destination and a user name: at most 255 bytes each)
_MAC_BYTES = 16
_KEY_LABEL = b"polymq longpoll subscription ids\0"


def ids_key(material: str | None) -> bytes:
    """The key of the ids' MACs, from ``material`` (``LongpollSettings.ids_material``: a
    secret every replica shares); without one (an anonymous core, no secret set), from
    polymq's own label alone: ids still cannot be edited, but can be forged by one who
    knows how (then, as before ids were signed, only the core's id inside is secret)."""
    return hashlib.sha256(_KEY_LABEL + (material or "").encode("utf-8", "surrogatepass")).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode((text + "=" * (-len(text) % 4)).encode("ascii"))


def _mac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("ascii"), hashlib.sha256).digest()[:_MAC_BYTES]


class AckMode(enum.Enum):
    CLIENT = "client"  # queue leases are settled by POST /v1/ack or /v1/nack (or expire)
    AUTO = "auto"  # the frontend acks a lease once its answer is written


@dataclass(frozen=True, slots=True)
class SubscriptionRef:
    core_id: str
    destination: Destination
    ack: AckMode
    prefetch: int
    visibility: float = 0.0  # seconds a queue poll leases for (0 for topics and streams)
    ttl: float = 300.0  # seconds the core keeps it without a poll
    owner: str = ""  # the user who opened it ("" the anonymous client)

    @property
    def max_step(self) -> float:
        """The longest one wait at the core may be: well within the ttl."""
        return self.ttl / 2

    @property
    def kind(self) -> Kind:
        return self.destination.kind

    def encode(self, key: bytes) -> str:
        """The id: this reference, signed with ``key`` (:func:`ids_key`)."""
        raw = [
            _VERSION,
            self.core_id,
            str(self.destination),
            self.ack.value,
            self.prefetch,
            self.visibility,
            self.ttl,
            self.owner,
        ]
        text = _b64(json.dumps(raw, separators=(",", ":")).encode())
        return f"{text}.{_b64(_mac(key, text))}"

    @classmethod
    def decode(cls, text: str, key: bytes) -> SubscriptionRef:
        """The reference in an id signed with ``key``; a 404 problem if it is not one of
        ours (made up, or changed since this service gave it)."""
        try:
            if len(text) > _MAX_ID or not text.isascii():
                raise ValueError("too long")
            body, dot, mac = text.partition(".")
            if not dot or not hmac.compare_digest(_unb64(mac), _mac(key, body)):
                raise ValueError("not signed by us")
            raw: Any = json.loads(_unb64(body))
            version, core_id, dest, ack, prefetch, visibility, ttl, owner = raw
            if version != _VERSION or not isinstance(core_id, str) or not core_id:
                raise ValueError("not a subscription id")
            if not isinstance(owner, str):
                raise ValueError("bad owner")
            if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
                raise ValueError("bad prefetch")
            for number in (visibility, ttl):
                if isinstance(number, bool) or not isinstance(number, int | float):
                    raise ValueError("bad number")
            if not ttl > 0:
                raise ValueError("bad ttl")
            destination = Destination.parse(dest, pattern=True)
            if destination.kind is Kind.CHANNEL:
                raise ValueError("not a kind we subscribe to")
            ack_mode = AckMode(ack)
            return cls(
                core_id, destination, ack_mode, prefetch, float(visibility), float(ttl), owner
            )
        except (
            ValueError,
            TypeError,
            RecursionError,
            binascii.Error,
            BadRequest,
            UnicodeDecodeError,
        ):
            raise Problem(
                404, f"no subscription {text[:60]!r} (not an id this service gave)"
            ) from None


def parse_cursor(raw: str | None, what: str = "cursor") -> int | None:
    """A cursor from a query string or Last-Event-ID; None when absent or empty."""
    if raw is None:
        return None
    raw = raw.strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_CURSOR:
        raise bad_request(f"{what} must be a cursor this service gave (a non-negative integer)")
    return int(raw)


def message_cursors(kind: Kind, cursor: int, messages: list[Message]) -> list[int]:
    """The cursor that resumes right after each message of an answer ending at ``cursor``."""
    n = len(messages)
    if kind is Kind.TOPIC:
        return [cursor - n + 1 + i for i in range(n)]
    if kind is Kind.STREAM:
        return [m.seq for m in messages]
    return [cursor] * n
