"""A long poll's answer: its JSON, each message encoded once however many polls it
answers, and its HTTP response, written in one piece.

One topic message wakes every poll waiting on its topic: with 10,000 of them, each gets the
same message (its own copy, decoded from its own answer of the core) with a cursor of its
own. :class:`Shown` keeps the JSON text of the last messages shown, so the first poll
encodes the message and the others reuse its text once their copy is found equal; only the
cursors (and a queue lease's receipt) are written per answer. The bytes are exactly
``json.dumps`` of the answer as :func:`polymq_longpoll.api.answer_json` builds it (what
``web.json_response`` wrote before).

An Avro record is encoded per answer, as before: its ``value`` depends on the schemas the
frontend holds at that moment.

:func:`json_answer` makes the response: for a GET over HTTP/1.1 with a body up to 64 KiB an
:class:`Answer`, which writes the status line, the headers and the body to the connection
in one write (aiohttp's own path for a ``web.Response`` costs about 10 us more of every
answer, a third of what aiohttp spends on it); else a ``web.Response``, as before.
"""

from __future__ import annotations

import json
import time
from email.utils import formatdate

from aiohttp import HttpVersion11, web
from aiohttp.http import SERVER_SOFTWARE

from polymq import CursorPage, Message
from polymq_server.messages.avro import SchemaCache, is_avro
from polymq_server.messages.jsonview import message_json

from .subscriptions import SubscriptionRef, message_cursors

__all__ = ["Answer", "Shown", "answer_bytes", "json_answer"]

_ENTRIES = 64  # messages remembered
_CHARS = 16 * 1024 * 1024  # at most this much JSON text remembered; a longer one is not


class Shown:
    """The JSON text of the last messages shown (without its outer braces), by message."""

    def __init__(self, entries: int = _ENTRIES, chars: int = _CHARS) -> None:
        self.entries = entries
        self.chars = chars
        self.held = 0  # characters of text remembered
        self._memo: dict[tuple[str, int, int], tuple[Message, str]] = {}

    def inner(self, message: Message, schemas: SchemaCache | None) -> str:
        """``message`` as :func:`polymq_server.messages.jsonview.message_json` shows it, as JSON
        text
        without the braces around it."""
        if is_avro(message):
            return json.dumps(message_json(message, schemas))[1:-1]
        key = (message.id, message.seq, message.delivery_count)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == message:
            return hit[1]
        text = json.dumps(message_json(message))[1:-1]
        self._remember(key, message, text)
        return text

    def _remember(self, key: tuple[str, int, int], message: Message, text: str) -> None:
        if len(text) > self.chars:
            return
        memo = self._memo
        old = memo.pop(key, None)
        if old is not None:
            self.held -= len(old[1])
        while memo and (len(memo) >= self.entries or self.held + len(text) > self.chars):
            self.held -= len(memo.pop(next(iter(memo)))[1])  # the oldest
        memo[key] = (message, text)
        self.held += len(text)


def answer_bytes(
    ref: SubscriptionRef, page: CursorPage, schemas: SchemaCache, shown: Shown
) -> bytes:
    """A poll's answer ``{"cursor", "messages"}`` as JSON bytes (see the module's
    docstring); the Avro schemas of its messages are loaded already."""
    cursor = page.cursor
    messages = page.messages
    cursors = message_cursors(ref.kind, cursor, messages) if cursor is not None else []
    parts = []
    for m, r, c in zip(messages, page.receipts, cursors, strict=True):
        head = f'{{"receipt": {json.dumps(r)}, ' if r else "{"
        parts.append(f'{head}{shown.inner(m, schemas)}, "cursor": "{c:d}"}}')
    at = "null" if cursor is None else f'"{cursor:d}"'
    return f'{{"cursor": {at}, "messages": [{", ".join(parts)}]}}'.encode()


# ---- the HTTP response ---------------------------------------------------------------------
JSON = "application/json; charset=utf-8"
_WHOLE_MAX = 64 * 1024  # bytes of body an Answer writes at once (a larger one is drained)


def json_answer(request: web.Request, body: bytes) -> web.StreamResponse:
    """``body`` as a ``200 OK`` JSON response to ``request`` (see the module's docstring)."""
    if request.method == "GET" and request.version == HttpVersion11 and len(body) <= _WHOLE_MAX:
        return Answer(body)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


class Answer(web.StreamResponse):
    """A ``200 OK`` with a small JSON ``body``, written in one piece to an HTTP/1.1 GET:
    the headers a ``web.Response`` gets (Content-Type, Content-Length, Date, Server,
    ``Connection: close`` when the connection is not kept), then those the app's
    ``on_response_prepare`` handlers add (CORS), then the body. ``prepare`` writes it all;
    ``write_eof`` has nothing left to do. A connection already closing is a
    ``ConnectionResetError``, as aiohttp's writer says it."""

    def __init__(self, body: bytes) -> None:
        super().__init__(status=200, headers={"Content-Type": JSON})
        self._data = body
        self._sent = False
        self._keep = False

    @property
    def prepared(self) -> bool:
        return self._sent

    @property
    def keep_alive(self) -> bool:
        return self._keep

    @property
    def body_length(self) -> int:
        return len(self._data) if self._sent else 0

    async def prepare(self, request: web.BaseRequest) -> None:
        if self._sent:
            return
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        self._keep = request.keep_alive and self._keep_alive is not False
        headers = self.headers
        headers["Content-Length"] = str(len(self._data))
        headers["Date"] = _http_date()
        headers["Server"] = SERVER_SOFTWARE
        if not self._keep:
            headers["Connection"] = "close"
        if isinstance(request, web.Request):  # (a BaseRequest has no app)
            for app in request.match_info.apps:
                await app.on_response_prepare.send(request, self)
        lines = ["HTTP/1.1 200 OK"]
        for name, value in headers.items():
            line = f"{name}: {value}"
            if "\r" in line or "\n" in line:
                raise ValueError(f"a header with a line break: {name!r}")
            lines.append(line)
        lines += ("", "")
        transport.write("\r\n".join(lines).encode() + self._data)
        self._sent = True

    async def write_eof(self, data: bytes = b"") -> None:
        if not self._sent:
            raise RuntimeError("write_eof() before prepare()")
        if data:
            raise RuntimeError("an Answer's body is whole: nothing may follow it")


_date: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The Date header's value, made once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True))
    return _date[1]
