"""The sans-IO STOMP 1.0/1.1/1.2 codec: bytes in, frames out, and back.

Like h11's ``Connection``, :class:`StompConnection` never touches a socket::

    conn = StompConnection(Role.SERVER)
    conn.receive_data(data)              # b"" means end of stream
    while (event := conn.next_event()) is not NEED_DATA:
        ...                              # a Frame, HEARTBEAT, or CLOSED after a clean EOF
    transport.write(conn.send(Frame(Command.CONNECTED, (("version", "1.2"),))))

On the wire a frame is ``COMMAND EOL *(header EOL) EOL body NUL``; EOL is ``\\n`` or ``\\r\\n``
on input (any version) and ``\\n`` on output. An EOL between frames is a heart-beat, a NUL
between frames padding that is skipped (as RabbitMQ's reader skips it). A body is
``content-length`` bytes followed by NUL, or without that header everything up to the first NUL.
Header escaping follows :attr:`StompConnection.version`, which the session sets with
:meth:`~StompConnection.negotiate` when CONNECTED goes by: none in 1.0; ``\\\\ \\n \\c`` in 1.1;
also ``\\r`` in 1.2. CONNECT, STOMP and CONNECTED are never escaped.

Frames are parsed lazily, one per :meth:`~StompConnection.next_event`, so a frame is checked
against the state (and unescaped with the version) in force when the session asks for it:
a client may pipeline frames behind CONNECT and they are judged after CONNECTED went out.

The states of one side are in :data:`TRANSITIONS`. Bad input raises
:class:`~polymq_stomp.frames.RemoteStompError` and leaves the connection in ``State.ERROR``;
the owner should then send :meth:`~StompConnection.error_bytes` and close. A frame the role
may not send now raises :class:`~polymq_stomp.frames.LocalStompError` and changes nothing.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Final, NoReturn

from .frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    SERVER_COMMANDS,
    Command,
    Frame,
    Heartbeat,
    LocalStompError,
    RemoteStompError,
    StompError,
)

__all__ = [
    "CLOSED",
    "NEED_DATA",
    "TRANSITIONS",
    "VERSIONS",
    "Closed",
    "NeedData",
    "Role",
    "State",
    "StompConnection",
]

VERSIONS: Final = ("1.0", "1.1", "1.2")
_SUPPORTED: Final = ",".join(VERSIONS)


class NeedData:
    """More bytes are needed before the next event: :data:`NEED_DATA`."""

    def __repr__(self) -> str:
        return "NEED_DATA"


class Closed:
    """The peer closed the stream cleanly, between frames: :data:`CLOSED`."""

    def __repr__(self) -> str:
        return "CLOSED"


NEED_DATA: Final = NeedData()
CLOSED: Final = Closed()


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    CONNECTING = "connecting"  # before CONNECTED went by
    OPEN = "open"
    CLOSED = "closed"  # an ERROR frame went either way, or a clean EOF
    ERROR = "error"  # the peer broke the protocol


_C, _S = Role.CLIENT, Role.SERVER
# (state, command, sent by) -> next state; anything else is a protocol error.
TRANSITIONS: Final[dict[tuple[State, Command, Role], State]] = {
    (State.CONNECTING, Command.CONNECT, _C): State.CONNECTING,
    (State.CONNECTING, Command.STOMP, _C): State.CONNECTING,
    (State.CONNECTING, Command.CONNECTED, _S): State.OPEN,
    (State.CONNECTING, Command.ERROR, _S): State.CLOSED,
    **{
        (State.OPEN, c, _C): State.OPEN for c in CLIENT_COMMANDS - {Command.CONNECT, Command.STOMP}
    },  # DISCONNECT included: the server answers with RECEIPT, then closes
    (State.OPEN, Command.MESSAGE, _S): State.OPEN,
    (State.OPEN, Command.RECEIPT, _S): State.OPEN,
    (State.OPEN, Command.ERROR, _S): State.CLOSED,
}
_PEER: Final = {_C: _S, _S: _C}
_SENDS: Final = {_C: CLIENT_COMMANDS, _S: SERVER_COMMANDS}
_BY_NAME: Final = {c.value: c for c in Command}
_PREFIXES: Final = frozenset(c.value[:i].encode() for c in Command for i in range(len(c.value) + 1))
_NEVER_ESCAPED: Final = frozenset({Command.CONNECT, Command.STOMP, Command.CONNECTED})
# What sending looks up per frame, by the members' values (an Enum member hashes and reads
# ``.value`` in Python, ~0.2-0.5 us each; ``_value_`` is a plain attribute): TRANSITIONS by
# (state, command, role), and the commands never escaped.
_SEND: Final = {(s.value, c.value, r.value): n for (s, c, r), n in TRANSITIONS.items()}
_NEVER_ESCAPED_NAMES: Final = frozenset(c.value for c in _NEVER_ESCAPED)
# What a role receives, by state and command name: (command, next state, headers escaped?).
# (By the state's value: a frame looks it up, and an Enum member hashes in Python.)
_RECEIVE: Final[dict[Role, dict[str, dict[str, tuple[Command, State, bool]]]]] = {
    role: {state.value: {} for state in State} for role in Role
}
for (_state, _cmd, _sender), _next in TRANSITIONS.items():
    _RECEIVE[_PEER[_sender]][_state.value][_cmd.value] = (_cmd, _next, _cmd not in _NEVER_ESCAPED)
_UNESCAPES: Final = {
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},
    "1.2": {"n": "\n", "c": ":", "\\": "\\", "r": "\r"},
}
_ESCAPE_RE: Final = re.compile(r"\\(.?)", re.DOTALL)


def _check_escapes(text: str, table: dict[str, str]) -> None:
    """Raise unless every backslash in ``text`` starts an escape in ``table``."""
    rest = text.replace("\\\\", "")  # pairs left to right, as a reader takes them
    for c in table:
        rest = rest.replace("\\" + c, "")
    if "\\" in rest:
        bad = next(m.group(0) for m in _ESCAPE_RE.finditer(text) if m.group(1) not in table)
        raise RemoteStompError("invalid escape", f"invalid escape {bad!r} in a header")


def _unescape(s: str) -> str:
    """``s`` unescaped, once :func:`_check_escapes` passed (headers hold no NUL)."""
    s = s.replace("\\\\", "\0").replace("\\n", "\n").replace("\\c", ":").replace("\\r", "\r")
    return s.replace("\0", "\\")


def _escape_11(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")


def _escape_12(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c").replace("\r", "\\r")


class StompConnection:
    """One side of a STOMP connection. Owns no socket."""

    # The frame in progress, which starts the buffer. Before its blank line is found: no NUL
    # before _nscan (or one at _nul), no blank line before _hscan (0: nothing looked at yet,
    # where an EOL is a heart-beat); early checks passed the command line if _cmd_checked and
    # _lines header lines before _lscan. Then: _head is (command, headers, next state), and
    # the body starts at _body_start and is _clen bytes long (-1: up to the first NUL).
    _head: tuple[Command, tuple[tuple[str, str], ...], State] | None

    def __init__(
        self,
        role: Role,
        *,
        max_frame: int = 1024 * 1024,
        max_headers: int = 64,
        max_header_length: int = 8192,
    ) -> None:
        self.role = role
        self.max_frame = max_frame
        self.max_headers = max_headers
        self.max_header_length = max_header_length
        self.version = "1.0"
        self.state = State.CONNECTING
        self._receive = _RECEIVE[role]
        self._unescapes: dict[str, str] | None = None
        self._buf = bytearray()
        self._eof = False
        self._head, self._hscan, self._nscan, self._nul = None, 0, 0, -1
        self._cmd_checked, self._lscan, self._lines = False, 0, 0
        self._body_start, self._clen = 0, -1

    def negotiate(self, version: str) -> None:
        """Use ``version``'s header escaping from now on (call it as CONNECTED goes by)."""
        if version not in VERSIONS:
            raise LocalStompError("unsupported version", f"cannot speak STOMP {version!r}")
        self.version = version
        self._unescapes = _UNESCAPES.get(version)

    # ---- receiving ----------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
        elif self.state is not State.CLOSED and self.state is not State.ERROR:
            self._buf += data  # after an ERROR frame nothing more is read: do not keep it

    def next_event(self) -> Frame | Heartbeat | NeedData | Closed:
        """The next :class:`Frame`, :data:`HEARTBEAT`, :data:`NEED_DATA` or :data:`CLOSED`.

        :data:`CLOSED` comes after a clean EOF, and again on every later call. Raises
        RemoteStompError on bad input; the connection is then in ``State.ERROR`` for good.
        Once an ERROR frame went either way, what the peer sends is dropped unread.
        """
        state = self.state
        if state is State.ERROR:
            raise RemoteStompError("protocol error", "the connection is in an error state")
        if state is State.CLOSED:
            self._buf.clear()
            return CLOSED if self._eof else NEED_DATA
        try:
            event = self._parse()
        except RemoteStompError:
            self.state = State.ERROR
            self._buf.clear()
            raise
        if event is not None:
            return event
        if not self._eof:
            return NEED_DATA
        if self._buf:
            self.state = State.ERROR
            raise RemoteStompError("connection closed", "EOF in the middle of a frame")
        self.state = State.CLOSED
        return CLOSED

    def _parse(self) -> Frame | Heartbeat | None:
        buf = self._buf
        head = self._head
        if head is None:
            n = len(buf)
            if not n:
                return None
            hs = self._hscan
            if hs == 0:  # the start of a frame: EOLs here are heart-beats, NULs padding
                c = buf[0]
                if c == 0:
                    i = 1
                    while i < n and buf[i] == 0:
                        i += 1
                    del buf[:i]
                    n -= i
                    if not n:
                        return None
                    c = buf[0]
                if c == 10:
                    del buf[:1]
                    return HEARTBEAT
                if c == 13:
                    if n == 1:
                        return None
                    if buf[1] == 10:
                        del buf[:2]
                        return HEARTBEAT
            nul = self._nul
            if nul < 0:
                nul = self._nul = buf.find(b"\0", self._nscan)
                if nul < 0:
                    self._nscan = n
            bound = n if nul < 0 else nul
            # The blank line: "\n\n" or "\n\r\n", whichever comes first (never at 0: heart-beat)
            p = buf.find(b"\n\n", hs, bound)
            q = buf.find(b"\n\r\n", hs, bound if p < 0 else p + 2)
            if q >= 0:
                p, start = q, q + 3
            elif p >= 0:
                start = p + 2
            else:
                self._partial_head(n, nul, hs == 0)
                return None
            head = self._head = self._decode_head(p, start)
            self._body_start = start
        start, clen = self._body_start, self._clen
        if clen >= 0:
            end = start + clen
            if len(buf) <= end:
                return None
            if buf[end]:
                raise RemoteStompError(
                    "malformed frame", f"no NUL after {clen} content-length bytes"
                )
        else:
            end = self._nul
            if end < 0:
                end = buf.find(b"\0", max(start, self._nscan))
                if end < 0:
                    self._nscan = n = len(buf)
                    if n > self.max_frame:
                        raise self._too_large()
                    return None
            if end > self.max_frame:
                raise self._too_large()
        frame = Frame(head[0], head[1], bytes(buf[start:end]))
        del buf[: end + 1]
        self.state = head[2]
        self._head, self._hscan, self._nscan, self._nul = None, 0, 0, -1
        return frame

    def _decode_head(
        self, hend: int, start: int
    ) -> tuple[Command, tuple[tuple[str, str], ...], State]:
        """Command and headers from ``buf[:hend]``, checked; sets ``_clen``."""
        buf = self._buf
        try:
            text = buf[:hend].decode("utf-8")
        except UnicodeDecodeError as exc:
            i = buf.find(b"\n")
            self._command(buf[: i - 1 if buf[i - 1] == 13 else i])  # a bad command comes first
            raise RemoteStompError("invalid UTF-8", f"headers must be UTF-8: {exc}") from None
        lines = text.split("\n")
        if "\r" in text:
            lines = [ln[:-1] if ln[-1:] == "\r" else ln for ln in lines]
        entry = self._receive[self.state._value_].get(lines[0])
        if entry is None:
            self._refuse(lines[0])
        limit = self.max_header_length
        if hend > limit and any(len(ln.encode()) > limit for ln in lines):
            raise self._too_long()
        if len(lines) > self.max_headers + 1:
            raise self._too_many()
        table = self._unescapes if entry[2] and "\\" in text else None
        if table is not None:
            _check_escapes(text, table)
        headers = []
        for ln in lines[1:]:
            name, sep, value = ln.partition(":")
            if not sep or not name:
                why = "empty header name" if sep else "header line without ':'"
                raise RemoteStompError("malformed header", f"{why}: {ln[:40]!r}")
            if table is not None and "\\" in ln:
                name, value = _unescape(name), _unescape(value)
            headers.append((name, value))
        if start > self.max_frame:
            raise self._too_large()
        self._clen = -1
        if "content-length" in text:
            for name, value in headers:
                if name == "content-length":
                    if not (value.isascii() and value.isdigit()):
                        raise RemoteStompError("invalid content-length", repr(value[:40]))
                    if len(value) > 18 and len(value.lstrip("0")) > 18:  # (not for int())
                        raise self._too_large()
                    self._clen = int(value)
                    if start + self._clen > self.max_frame:
                        raise self._too_large()
                    break
        return entry[0], tuple(headers), entry[1]

    def _partial_head(self, n: int, nul: int, first: bool) -> None:
        """No blank line before ``n`` bytes (or the NUL at ``nul``): refuse early what cannot
        become a good frame, with the error a byte-by-byte reader would meet first."""
        buf, limit = self._buf, self.max_header_length
        end = n if nul < 0 else nul
        if first:
            self._cmd_checked, self._lscan, self._lines = False, 0, 0
        if not self._cmd_checked:
            i = buf.find(b"\n", 0, end)
            if i >= 0:
                self._command(buf[: i - 1 if buf[i - 1] == 13 else i])
                self._cmd_checked, self._lscan = True, i + 1
            else:  # e.g. "GET / HTTP/1.1" is refused at the "GET"
                part = bytes(buf[:end])
                part = part[:-1] if part.endswith(b"\r") else part
                if part not in _PREFIXES:
                    self._refuse(part.decode("utf-8", "replace"))
        if self._cmd_checked:
            while (j := buf.find(b"\n", self._lscan, end)) >= 0:
                if j - self._lscan - (buf[j - 1] == 13) > limit:
                    raise self._too_long()
                self._lines += 1
                if self._lines > self.max_headers:
                    raise self._too_many()
                self._lscan = j + 1
            if end - self._lscan > limit + 1:
                raise self._too_long()
        if end > self.max_frame:
            raise self._too_large()
        if nul >= 0:
            raise RemoteStompError("malformed frame", "NUL before the end of the headers")
        self._hscan = max(n - 2, 1)

    def _command(self, line: bytes | bytearray) -> None:
        """Raise unless command ``line`` is one the peer may send now."""
        name = line.decode("utf-8", "replace")
        if name not in self._receive[self.state._value_]:
            self._refuse(name)

    def _refuse(self, name: str) -> NoReturn:
        """Raise the error for a peer sending command ``name`` now."""
        cmd = _BY_NAME.get(name)
        if cmd is None:
            quoted = json.dumps(name[:40], ensure_ascii=False)  # as RabbitMQ's ~p quotes it
            raise RemoteStompError("Bad command", f"Could not interpret command {quoted}\n")
        raise self._refusal(cmd, _PEER[self.role], RemoteStompError)

    def _too_large(self) -> RemoteStompError:
        return RemoteStompError("frame too large", f"a frame may be {self.max_frame} bytes at most")

    def _too_long(self) -> RemoteStompError:
        limit = self.max_header_length
        return RemoteStompError("header too long", f"a header line may be {limit} bytes at most")

    def _too_many(self) -> RemoteStompError:
        return RemoteStompError("too many headers", f"{self.max_headers} headers at most")

    # ---- sending ------------------------------------------------------------------------
    def send(self, frame: Frame) -> bytes:
        """The bytes of ``frame``. Raises LocalStompError, changing nothing, if this role may
        not send it now or it cannot go on the wire: a header this version cannot carry, NUL
        in a header, a body with NUL but no content-length, or a content-length that is not
        the body's length (set it yourself: it is never added)."""
        nxt = _SEND.get((self.state._value_, frame.command._value_, self.role._value_))
        if nxt is None:
            raise self._refusal(frame.command, self.role, LocalStompError)
        data = self._encode(frame)
        self.state = nxt
        return data

    def send_heartbeat(self) -> bytes:
        """The bytes of one heart-beat."""
        return b"\n"

    def error_bytes(self, message: str, detail: str, receipt_id: str | None = None) -> bytes:
        """An ERROR frame for a server to send in any state, even before CONNECT; then CLOSED.

        ``message`` and ``receipt_id`` are made fit for a header (CR, LF or NUL become a space
        where this version cannot escape them); ``detail`` is the text/plain body."""
        if self.role is not Role.SERVER:
            raise LocalStompError("unknown command", "only a server sends ERROR")

        def fit(s: str) -> str:  # 1.0 cannot carry CR/LF in a header, 1.1 a trailing CR
            s = s.replace("\0", " ")
            s = s if self.version == "1.2" else s.replace("\r", " ")
            return s.replace("\n", " ") if self.version == "1.0" else s

        body = detail.encode("utf-8", "replace")
        headers = [("message", fit(message))]
        if receipt_id is not None:
            headers.append(("receipt-id", fit(receipt_id)))
        headers += [
            ("content-type", "text/plain"),
            ("version", _SUPPORTED),  # on every ERROR, as RabbitMQ says it
            ("content-length", str(len(body))),
        ]
        try:
            data = self._encode(Frame(Command.ERROR, tuple(headers), body))
        except LocalStompError:  # e.g. a lone surrogate: say something rather than nothing
            data = self._encode(Frame(Command.ERROR, (("message", "error"),)))
        self.state = State.CLOSED
        return data

    def _encode(self, frame: Frame) -> bytes:
        cmd, version, headers = frame.command._value_, self.version, frame.headers
        if version == "1.0" or cmd in _NEVER_ESCAPED_NAMES:
            parts = [cmd]
            for name, value in headers:
                if not name or ":" in name or "\n" in name or "\n" in value or value[-1:] == "\r":
                    raise _unsendable(name, value, "unescaped")
                parts.append(f"{name}:{value}")
            parts.append("\n")
            text = "\n".join(parts)
        else:
            # The common case (ids, numbers, destinations): nothing to escape, every name
            # given. Told from the text itself by C-level scans (str.count, `in`): exactly one
            # colon per header, one line feed per line, no backslash, no CR, no line that
            # starts with a colon (a header without a name). A regular expression's scan of
            # the headers cost more than building the frame (~1 us a MESSAGE).
            text = "\n".join([cmd, *[f"{name}:{value}" for name, value in headers], "\n"])
            count = len(headers)
            if (
                "\\" in text
                or "\r" in text
                or "\n:" in text
                or text.count(":") != count
                or text.count("\n") != count + 2
            ):
                text = self._escaped(cmd, headers)
        if "\0" in text:
            raise LocalStompError("malformed frame", "NUL in a header")
        body = frame.body
        clen = frame.get("content-length")
        if clen is None:
            if b"\0" in body:
                raise LocalStompError("malformed frame", "a body with NUL needs content-length")
        elif clen != str(len(body)):
            raise LocalStompError(
                "invalid content-length", f"content-length {clen!r}, body of {len(body)} bytes"
            )
        try:
            return b"".join((text.encode("utf-8"), body, b"\0"))
        except UnicodeEncodeError as exc:
            raise LocalStompError("invalid UTF-8", f"cannot encode a header: {exc}") from None

    def _escaped(self, cmd: str, headers: tuple[tuple[str, str], ...]) -> str:
        """The head of a STOMP 1.1 or 1.2 frame whose headers need escaping (or cannot be
        sent: a header without a name, a value ending in CR in 1.1)."""
        esc = _escape_12 if self.version == "1.2" else _escape_11
        parts = [cmd]
        for name, value in headers:
            if not name:
                raise _unsendable(name, value, "without a name")
            if self.version == "1.1" and value[-1:] == "\r":
                raise _unsendable(name, value, "in STOMP 1.1")
            parts.append(f"{esc(name)}:{esc(value)}")
        parts.append("\n")
        return "\n".join(parts)

    def _refusal(self, cmd: Command, sender: Role, error: type[StompError]) -> StompError:
        """The error for ``sender`` sending ``cmd`` in this state, which TRANSITIONS lacks."""
        if cmd not in _SENDS[sender]:
            detail = f"Could not interpret command {cmd.value!r}: a {sender.value} does not send it"
            return error("Bad command", detail)
        if self.state is State.CONNECTING:
            if sender is Role.CLIENT:
                detail = "You must log in using CONNECT first"
            else:
                detail = f"expected CONNECTED first, not {cmd.value}"
            return error("Illegal command", detail)
        return error(
            "Illegal command",
            f"a {sender.value} may not send {cmd.value} when the connection is {self.state.value}",
        )


def _unsendable(name: str, value: str, how: str) -> LocalStompError:
    return LocalStompError(
        "unsendable header", f"header {name[:40]!r}: {value[:40]!r} cannot be sent {how}"
    )


# ---- the compiled twin: everything above, compiled by mypyc (polymq_stomp.compiled) -----------
# Where ``make compiled`` built it from this very source, its public names replace the ones
# above for every importer; otherwise (not built, stale, POLYMQ_PURE_PYTHON) this module stays.
def _take_twin() -> bool:
    from .compiled import load_twin

    twin = load_twin()
    if twin is None:
        return False
    globals().update({name: getattr(twin, name) for name in __all__})
    return True


COMPILED: Final = _take_twin()  # whether the classes here are the compiled ones
