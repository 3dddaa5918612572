"""Tests for polymq_stomp.codec: the sans-IO STOMP 1.0/1.1/1.2 codec.

Every received byte stream goes through ``tr`` (whole, one byte at a time, with trailing data)
and frames round-trip through a ``ConnectionPair``; see ``helpers.py``. Hypothesis checks that
any valid frame survives encode, random splits and decode, in every version, and that no input
raises anything but a StompError.
"""

from __future__ import annotations

import pytest

from polymq_stomp.codec import (
    CLOSED,
    NEED_DATA,
    TRANSITIONS,
    VERSIONS,
    Role,
    State,
    StompConnection,
)
from polymq_stomp.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    SERVER_COMMANDS,
    Command,
    Frame,
    LocalStompError,
    RemoteStompError,
    StompError,
)

from .helpers import (
    OTHER,
    ConnectionPair,
    connecting_client,
    open_connection,
    receive,
    tr,
    wire,
)

C, S = Role.CLIENT, Role.SERVER
CONNECT = Frame(Command.CONNECT, (("accept-version", "1.2"),))


def server(**limits: int) -> StompConnection:
    return StompConnection(S, **limits)


def open_server(version: str = "1.2", **limits: int) -> StompConnection:
    return open_connection(S, version, **limits)


def open_client(version: str = "1.2", **limits: int) -> StompConnection:
    return open_connection(C, version, **limits)


def send_frame(*headers: tuple[str, str], body: bytes = b"") -> Frame:
    return Frame(Command.SEND, headers, body)


# ---- handshake and the wire format --------------------------------------------------------


def test_initial_state() -> None:
    for role in Role:
        conn = StompConnection(role)
        assert conn.state is State.CONNECTING
        assert conn.version == "1.0"
        assert conn.next_event() is NEED_DATA


def test_server_reads_connect() -> None:
    data = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"
    frame = Frame(
        Command.CONNECT,
        (
            ("accept-version", "1.0,1.1,1.2"),
            ("host", "/"),
            ("login", "guest"),
            ("passcode", "guest"),
        ),
    )
    tr(server, data, [frame], state=State.CONNECTING)


def test_server_reads_stomp_and_a_1_0_connect_without_headers() -> None:
    tr(
        server,
        b"STOMP\naccept-version:1.2\nhost:h\n\n\0",
        [Frame(Command.STOMP, (("accept-version", "1.2"), ("host", "h")))],
    )
    tr(server, b"CONNECT\n\n\0", [Frame(Command.CONNECT)])


def test_handshake_states_and_bytes() -> None:
    pair = ConnectionPair()
    assert pair.send(C, CONNECT) == b"CONNECT\naccept-version:1.2\n\n\0"
    assert pair.states() == (State.CONNECTING, State.CONNECTING)
    connected = Frame(Command.CONNECTED, (("version", "1.2"), ("heart-beat", "0,0")))
    assert pair.send(S, connected) == b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\0"
    assert pair.states() == (State.OPEN, State.OPEN)
    assert pair.client.version == pair.server.version == "1.0"  # until negotiate()
    pair.server.negotiate("1.2")
    pair.client.negotiate("1.2")
    assert pair.server.version == pair.client.version == "1.2"


def test_client_reads_connected() -> None:
    tr(
        connecting_client,
        b"CONNECTED\nversion:1.1\nserver:polymq/0.1\n\n\0",
        [Frame(Command.CONNECTED, (("version", "1.1"), ("server", "polymq/0.1")))],
        state=State.OPEN,
    )


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_connect_and_connected_are_never_escaped(version: str) -> None:
    # Both sides already speak an escaping version: still, these frames go raw.
    pair = ConnectionPair()
    pair.client.negotiate(version)
    pair.server.negotiate(version)
    connect = Frame(Command.CONNECT, (("login", "dom\\user"), ("passcode", "a:b\\c")))
    assert pair.send(C, connect) == b"CONNECT\nlogin:dom\\user\npasscode:a:b\\c\n\n\0"
    connected = Frame(Command.CONNECTED, (("server", "x\\cy"),))
    assert pair.send(S, connected) == b"CONNECTED\nserver:x\\cy\n\n\0"
    # and read raw: a server reading STOMP with "\\n" in it keeps the backslash
    stomp = Frame(Command.STOMP, (("passcode", "p\\n"),))
    tr(lambda: negotiated_server(version), b"STOMP\npasscode:p\\n\n\n\0", [stomp])


def negotiated_server(version: str) -> StompConnection:
    conn = server()
    conn.negotiate(version)
    return conn


def test_connect_headers_that_cannot_go_unescaped_are_refused() -> None:
    client = StompConnection(C)
    client.negotiate("1.2")
    for headers in [(("passcode", "a\nb"),), (("a:b", "c"),), (("p", "x\r"),), (("", "x"),)]:
        with pytest.raises(LocalStompError) as exc:
            client.send(Frame(Command.CONNECT, headers))
        assert exc.value.message == "unsendable header"
    assert client.state is State.CONNECTING


def test_pipelined_frames_behind_connect_are_judged_after_connected() -> None:
    """A client may send SEND right behind CONNECT: it is read once CONNECTED went out, and
    with the negotiated version's escaping."""
    conn = server()
    conn.receive_data(wire("CONNECT", "accept-version:1.2") + wire("SEND", "destination:/q\\c1"))
    assert conn.next_event() == Frame(Command.CONNECT, (("accept-version", "1.2"),))
    conn.send(Frame(Command.CONNECTED, (("version", "1.2"),)))
    conn.negotiate("1.2")
    assert conn.next_event() == send_frame(("destination", "/q:1"))
    assert conn.state is State.OPEN

    # Had the session asked before answering, the SEND would be out of place.
    conn = server()
    conn.receive_data(wire("CONNECT") + wire("SEND", "destination:/q"))
    conn.next_event()
    with pytest.raises(RemoteStompError) as exc:
        conn.next_event()
    assert exc.value.message == "Illegal command"


# ---- frames, bodies and EOLs --------------------------------------------------------------


def test_body_up_to_the_first_nul() -> None:
    data = wire("SEND", "destination:/q", body=b"hello\nworld")
    tr(open_server, data, [send_frame(("destination", "/q"), body=b"hello\nworld")])


@pytest.mark.parametrize("body", [b"", b"\0", b"a\0b\0\0c", b"\0" * 100, bytes(range(256))])
def test_body_with_content_length_may_hold_nuls(body: bytes) -> None:
    data = wire("SEND", "destination:/q", f"content-length:{len(body)}", body=body)
    frame = send_frame(("destination", "/q"), ("content-length", str(len(body))), body=body)
    tr(open_server, data, [frame])


def test_first_content_length_wins() -> None:
    data = wire("SEND", "content-length:3", "content-length:5", body=b"a\0b")
    frame = send_frame(("content-length", "3"), ("content-length", "5"), body=b"a\0b")
    tr(open_server, data, [frame])


def test_repeated_headers_are_kept_in_order() -> None:
    data = wire("MESSAGE", "foo:1", "bar:x", "foo:2", "foo:")
    (frame,), _ = receive(open_client(), [data])
    assert isinstance(frame, Frame)
    assert frame.headers == (("foo", "1"), ("bar", "x"), ("foo", "2"), ("foo", ""))
    assert frame.get("foo") == "1"
    assert "bar" in frame


@pytest.mark.parametrize("version", VERSIONS)
def test_crlf_eols_are_accepted_in_every_version(version: str) -> None:
    data = wire("SEND", "destination:/q", "receipt:r1", body=b"a\r\nb", eol=b"\r\n")
    frame = send_frame(("destination", "/q"), ("receipt", "r1"), body=b"a\r\nb")
    tr(lambda: open_server(version), data, [frame])
    # mixed: CRLF and LF in one frame, and a CRLF blank line after an LF header line
    tr(open_server, b"SEND\r\na:1\nb:2\r\n\n\0", [send_frame(("a", "1"), ("b", "2"))])
    tr(open_server, b"SEND\na:1\n\r\n\0", [send_frame(("a", "1"))])
    tr(open_server, b"DISCONNECT\r\n\r\n\0", [Frame(Command.DISCONNECT)])


def test_output_uses_lf() -> None:
    data = open_client().send(send_frame(("destination", "/q"), body=b"x"))
    assert data == b"SEND\ndestination:/q\n\nx\0"


def test_heartbeats_between_frames_and_after_nul() -> None:
    one = wire("SEND", "destination:/q", body=b"x")
    frame = send_frame(("destination", "/q"), body=b"x")
    # ocamlmq's clients end every frame with NUL and a newline
    tr(open_server, one + b"\n" + one + b"\n", [frame, HEARTBEAT, frame, HEARTBEAT])
    tr(
        open_server,
        b"\n\r\n\n" + one + b"\r\n\r\n" + one,
        [HEARTBEAT, HEARTBEAT, HEARTBEAT, frame, HEARTBEAT, HEARTBEAT, frame],
    )


def test_nuls_between_frames_are_padding() -> None:
    """As RabbitMQ's reader: a NUL right after a frame's NUL, or before a command, is
    skipped (no event); an EOL among them is still a heart-beat."""
    one = wire("SEND", "destination:/q", body=b"x")
    frame = send_frame(("destination", "/q"), body=b"x")
    tr(open_server, b"\0" + one + b"\0\n\0\0" + one + b"\0", [frame, HEARTBEAT, frame])
    tr(open_server, b"\0\0\0", [])
    tr(server, b"\0\r\n\0", [HEARTBEAT], state=State.CONNECTING)
    tr(open_server, one + b"\0\0", [frame, CLOSED], eof=True, state=State.CLOSED)


def test_heartbeats_before_connect_and_sent() -> None:
    tr(server, b"\n\r\n", [HEARTBEAT, HEARTBEAT], state=State.CONNECTING)
    conn = open_client()
    assert conn.send_heartbeat() == b"\n"
    tr(open_server, conn.send_heartbeat(), [HEARTBEAT])


def test_a_cr_that_is_not_an_eol_is_not_a_heartbeat() -> None:
    tr(open_server, b"\rX\n\n\0", [], error="Bad command", detail='"\\rX"')


# ---- header escaping ----------------------------------------------------------------------

# (version, header line as sent, (name, value) as read)
DECODED = [
    ("1.0", "a:b\\c", ("a", "b\\c")),
    ("1.0", "a:b:c", ("a", "b:c")),
    ("1.0", "a\\n:b\\x", ("a\\n", "b\\x")),
    ("1.1", "a\\cb:c\\nd\\\\e", ("a:b", "c\nd\\e")),
    ("1.1", "k:\\\\n", ("k", "\\n")),
    ("1.1", "k:\\\\\\n", ("k", "\\\n")),
    ("1.1", "k:a:b", ("k", "a:b")),  # a raw colon in a value: tolerated
    ("1.1", "k:x\ry", ("k", "x\ry")),  # 1.1 cannot escape CR; mid-value it is plain data
    ("1.2", "k:\\r\\n\\c\\\\", ("k", "\r\n:\\")),
    ("1.2", "ü\\cñ:日本\\c語", ("ü:ñ", "日本:語")),
]


@pytest.mark.parametrize(("version", "line", "header"), DECODED)
def test_header_unescaping(version: str, line: str, header: tuple[str, str]) -> None:
    tr(lambda: open_server(version), wire("SEND", line), [send_frame(header)])


@pytest.mark.parametrize(
    ("version", "line", "bad"),
    [
        ("1.1", "k:\\r", "\\r"),  # \r is 1.2 only
        ("1.1", "k:\\t", "\\t"),
        ("1.2", "k:a\\", "\\"),  # a trailing backslash
        ("1.2", "k\\:v", "\\:"),
        ("1.2", "k:\\\\\\x", "\\x"),
        ("1.2", "k:\\C", "\\C"),
    ],
)
def test_invalid_escape(version: str, line: str, bad: str) -> None:
    tr(
        lambda: open_server(version),
        wire("SEND", line),
        [],
        error="invalid escape",
        detail=repr(bad),
    )


# name, value: what needs escaping, by version
AWKWARD = [
    ("destination", "/queue/a:b"),
    ("colon:name", "c"),
    ("nl", "line1\nline2"),
    ("cr", "a\rb"),
    ("cr-end", "ends with\r"),
    ("backslash\\", "C:\\dir\\n"),
    ("ünï", "välue ✓ 日本語 🎉"),
    ("empty", ""),
    ("spaces", "  padded  "),
]


def representable(version: str, name: str, value: str) -> bool:
    if version == "1.0":
        return ":" not in name and "\n" not in name + value and not value.endswith("\r")
    return version == "1.2" or not value.endswith("\r")


SENT_BY = {
    C: sorted(CLIENT_COMMANDS - {Command.CONNECT, Command.STOMP}, key=lambda c: c.value),
    S: [Command.MESSAGE, Command.RECEIPT, Command.ERROR],
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("role", "command"), [(r, c) for r in Role for c in SENT_BY[r]], ids=lambda x: str(x)
)
def test_every_command_round_trips_with_awkward_headers(
    version: str, role: Role, command: Command
) -> None:
    headers = tuple(h for h in AWKWARD if representable(version, *h))
    assert len(headers) == {"1.0": 6, "1.1": 8, "1.2": 9}[version]
    body = b"body\0with NUL" if command in (Command.SEND, Command.MESSAGE, Command.ERROR) else b""
    if body:
        headers += (("content-length", str(len(body))),)
    pair = ConnectionPair()
    pair.handshake(version)
    frame = Frame(command, headers, body)
    data = pair.send(role, frame)
    if command is Command.ERROR:
        assert pair.client.state is pair.server.state is State.CLOSED
        return
    for cut in range(1, len(data)):  # split everywhere
        got, exc = receive(pair.conn[OTHER[role]], [data[:cut], data[cut:]])
        assert exc is None
        assert got == [frame]


@pytest.mark.parametrize(
    ("version", "name", "value"),
    [("1.0", *h) for h in AWKWARD if not representable("1.0", *h)]
    + [("1.1", *h) for h in AWKWARD if not representable("1.1", *h)],
)
def test_headers_a_version_cannot_carry_are_refused(version: str, name: str, value: str) -> None:
    conn = open_client(version)
    with pytest.raises(LocalStompError) as exc:
        conn.send(send_frame((name, value)))
    assert exc.value.message == "unsendable header"
    assert conn.state is State.OPEN


@pytest.mark.parametrize(
    ("version", "wire_line"),
    [
        ("1.0", b"k:a\\b:c"),
        ("1.1", b"k\\c:a\\c\\n\\\\"),
        ("1.2", b"k\\c:a\\c\\n\\\\\\r"),
    ],
)
def test_escaping_on_the_wire(version: str, wire_line: bytes) -> None:
    name, value = {
        "1.0": ("k", "a\\b:c"),
        "1.1": ("k:", "a:\n\\"),
        "1.2": ("k:", "a:\n\\\r"),
    }[version]
    data = open_client(version).send(send_frame((name, value)))
    assert data == b"SEND\n" + wire_line + b"\n\n\0"


# ---- malformed input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "error", "detail"),
    [
        (b"FOO\n\n\0", "Bad command", 'Could not interpret command "FOO"\n'),
        (b"send\n\n\0", "Bad command", '"send"'),
        (b"SEND \n\n\0", "Bad command", '"SEND "'),
        (b"MESSAGE\n\n\0", "Bad command", "a client does not send it"),
        (b"CONNECTED\n\n\0", "Bad command", "a client does not send it"),
        (b"CONNECT\n\n\0", "Illegal command", "when the connection is open"),
        (b"STOMP\n\n\0", "Illegal command", "when the connection is open"),
        (b"SEND\nno-colon\n\n\0", "malformed header", "without ':'"),
        (b"SEND\n:value\n\n\0", "malformed header", "empty header name"),
        (b"SEND\nk\xff:v\n\n\0", "invalid UTF-8", "UTF-8"),
        (b"SEND\nk:\xc3\n\n\0", "invalid UTF-8", "UTF-8"),
        (b"SEND\nk:v\0\n\n", "malformed frame", "NUL before the end of the headers"),
        (b"SEND\0", "malformed frame", "NUL before the end of the headers"),
        (b"SEND\ncontent-length:2\n\nabc\0", "malformed frame", "no NUL after 2"),
        (b"SEND\ncontent-length:-1\n\n\0", "invalid content-length", "'-1'"),
        (b"SEND\ncontent-length:x\n\n\0", "invalid content-length", "'x'"),
        (b"SEND\ncontent-length:\n\n\0", "invalid content-length", "''"),
        (b"SEND\ncontent-length: 1\n\nx\0", "invalid content-length", "' 1'"),
        (b"SEND\ncontent-length:1.0\n\nx\0", "invalid content-length", "'1.0'"),
        ("SEND\ncontent-length:\u0663\n\nabc\0".encode(), "invalid content-length", "'٣'"),
    ],
)
def test_server_refuses(data: bytes, error: str, detail: str) -> None:
    tr(open_server, data, [], error=error, detail=detail)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"SEND\n\n\0", "Bad command"),
        (b"CONNECTED\n\n\0", "Illegal command"),
        (b"DISCONNECT\n\n\0", "Bad command"),
    ],
)
def test_client_refuses(data: bytes, error: str) -> None:
    tr(open_client, data, [], error=error)


def test_a_frame_after_good_ones_fails_alone() -> None:
    good = wire("SEND", "destination:/q")
    tr(
        open_server,
        good + b"\n" + b"BAD\n\n\0",
        [send_frame(("destination", "/q")), HEARTBEAT],
        error="Bad command",
    )


def test_http_is_refused_before_its_first_line_ends() -> None:
    conn = server()
    conn.receive_data(b"GE")
    with pytest.raises(RemoteStompError) as exc:
        conn.next_event()
    assert exc.value.message == "Bad command"
    tr(server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", [], error="Bad command", trailing=False)


def test_frames_before_connect() -> None:
    for cmd in sorted(CLIENT_COMMANDS - {Command.CONNECT, Command.STOMP}, key=lambda c: c.value):
        detail = "You must log in using CONNECT first"  # RabbitMQ's words
        tr(server, wire(cmd.value), [], error="Illegal command", detail=detail)
    # and a client that sent CONNECT gets CONNECTED or ERROR first
    for cmd in (Command.MESSAGE, Command.RECEIPT):
        tr(connecting_client, wire(cmd.value), [], error="Illegal command", detail=cmd.value)


def test_client_reads_error_before_connected_and_then_drops_everything() -> None:
    data = wire("ERROR", "message:bad login", body=b"go away")
    frame = Frame(Command.ERROR, (("message", "bad login"),), b"go away")
    tr(connecting_client, data, [frame], state=State.CLOSED)
    tr(connecting_client, data + wire("MESSAGE", "a:b") + b"\n", [frame], state=State.CLOSED)
    tr(open_client, data + b"MESS", [frame, CLOSED], eof=True, state=State.CLOSED)


# ---- limits -------------------------------------------------------------------------------


def test_frame_of_exactly_max_frame_is_accepted() -> None:
    """max_frame counts the bytes before the NUL: command, headers, blank line, body."""
    head = b"SEND\ndestination:/q\n\n"
    body = b"x" * (200 - len(head))
    frame = send_frame(("destination", "/q"), body=body)
    tr(lambda: open_server(max_frame=200), head + body + b"\0", [frame])
    body = b"\0" * 175
    data = wire("SEND", "content-length:175", body=body)
    assert len(data) == 201
    frame = send_frame(("content-length", "175"), body=body)
    tr(lambda: open_server(max_frame=200), data, [frame])


@pytest.mark.parametrize(
    "data",
    [
        wire("SEND", "destination:/q", body=b"x" * 200),  # running size, no content-length
        wire("SEND", "content-length:200", body=b"x" * 200),
        wire("SEND", *[f"h{i}:{'v' * 20}" for i in range(10)]),  # headers alone
    ],
)
def test_frame_too_large(data: bytes) -> None:
    tr(lambda: open_server(max_frame=200), data, [], error="frame too large", detail="200 bytes")


@pytest.mark.parametrize(
    "length",
    ["9" * 19, "9" * 5000, "0" * 4000 + "1" * 19],  # (int() refuses 4301 digits)
)
def test_a_content_length_of_many_digits_is_too_large(length: str) -> None:
    data = f"SEND\ncontent-length:{length}\n\nabc\0".encode()
    tr(lambda: open_server(max_header_length=8192), data, [], error="frame too large")


def test_a_zero_padded_content_length_is_its_number() -> None:
    data = wire("SEND", "content-length:" + "0" * 30 + "3", body=b"a\0b")
    tr(open_server, data, [send_frame(("content-length", "0" * 30 + "3"), body=b"a\0b")])


def test_too_large_is_refused_before_the_body_arrives() -> None:
    for head in [b"SEND\ncontent-length:1000000000\n\n", b"SEND\n\n" + b"x" * 101]:
        conn = open_server(max_frame=100)
        conn.receive_data(head)
        with pytest.raises(RemoteStompError) as exc:
            conn.next_event()
        assert exc.value.message == "frame too large"
        assert conn.state is State.ERROR
        conn.receive_data(b"x" * 10_000)  # nothing more is kept
        assert conn.error_bytes("frame too large", exc.value.detail)
        assert conn.next_event() is NEED_DATA


def test_headers_limit() -> None:
    ok = wire("SEND", *[f"h{i}:v" for i in range(4)])
    frame = send_frame(*[(f"h{i}", "v") for i in range(4)])
    tr(lambda: open_server(max_headers=4), ok, [frame])
    bad = wire("SEND", *[f"h{i}:v" for i in range(5)])
    tr(lambda: open_server(max_headers=4), bad, [], error="too many headers", detail="4")


def test_header_line_length_limit() -> None:
    line = "k:" + "v" * 30  # 32 bytes
    tr(
        lambda: open_server(max_header_length=32),
        wire("SEND", line, eol=b"\r\n"),
        [send_frame(("k", "v" * 30))],
    )
    tr(
        lambda: open_server(max_header_length=32),
        wire("SEND", "ü" + line),
        [],
        error="header too long",
        detail="32 bytes",
    )
    # refused before the end of the line arrives
    conn = open_server(max_header_length=32)
    conn.receive_data(b"SEND\nk:" + b"v" * 40)
    with pytest.raises(RemoteStompError) as exc:
        conn.next_event()
    assert exc.value.message == "header too long"


def test_default_limits() -> None:
    conn = StompConnection(S)
    assert (conn.max_frame, conn.max_headers, conn.max_header_length) == (1 << 20, 64, 8192)


# ---- EOF ----------------------------------------------------------------------------------


def test_eof_between_frames_is_closed() -> None:
    one = wire("SEND", "destination:/q")
    tr(
        open_server,
        one + b"\n",
        [send_frame(("destination", "/q")), HEARTBEAT, CLOSED],
        eof=True,
        state=State.CLOSED,
    )
    tr(server, b"", [CLOSED], eof=True, state=State.CLOSED)
    conn = open_server()
    conn.receive_data(b"")
    assert conn.next_event() is CLOSED
    assert conn.next_event() is CLOSED  # and stays so
    assert conn.state is State.CLOSED


@pytest.mark.parametrize(
    "data",
    [b"S", b"SEND\n", b"SEND\nk:v\n\nbody", b"SEND\ncontent-length:3\n\nab", b"\r"],
)
def test_eof_mid_frame_is_an_error(data: bytes) -> None:
    tr(open_server, data, [], error="connection closed", eof=True)


def test_an_error_sticks() -> None:
    conn = open_server()
    conn.receive_data(b"BAD\n\n\0" + wire("SEND"))
    with pytest.raises(RemoteStompError):
        conn.next_event()
    with pytest.raises(RemoteStompError, match="protocol error"):
        conn.next_event()
    assert conn.state is State.ERROR


# ---- sending ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "state", "command", "error"),
    [
        (C, State.CONNECTING, Command.SEND, "Illegal command"),
        (C, State.CONNECTING, Command.MESSAGE, "Bad command"),
        (C, State.OPEN, Command.CONNECT, "Illegal command"),
        (C, State.OPEN, Command.ERROR, "Bad command"),
        (C, State.CLOSED, Command.SEND, "Illegal command"),
        (S, State.CONNECTING, Command.MESSAGE, "Illegal command"),
        (S, State.CONNECTING, Command.SEND, "Bad command"),
        (S, State.OPEN, Command.CONNECTED, "Illegal command"),
        (S, State.CLOSED, Command.RECEIPT, "Illegal command"),
        (S, State.ERROR, Command.MESSAGE, "Illegal command"),
    ],
)
def test_illegal_send_raises_local_error_and_changes_nothing(
    role: Role, state: State, command: Command, error: str
) -> None:
    conn = StompConnection(role)
    conn.state = state
    with pytest.raises(LocalStompError) as exc:
        conn.send(Frame(command))
    assert exc.value.message == error
    assert conn.state is state


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (send_frame(body=b"a\0b"), "a body with NUL needs content-length"),
        (send_frame(("content-length", "2"), body=b"abc"), "content-length '2'"),
        (send_frame(("content-length", "x"), body=b""), "content-length 'x'"),
        (send_frame(("k", "a\0b")), "NUL in a header"),
        (send_frame(("k", "\ud800")), "cannot encode"),
        (send_frame(("", "v")), "cannot be sent"),
    ],
)
def test_unsendable_frames(frame: Frame, error: str) -> None:
    conn = open_client()
    with pytest.raises(LocalStompError) as exc:
        conn.send(frame)
    assert error in exc.value.detail
    assert conn.state is State.OPEN
    assert conn.send(send_frame()) == b"SEND\n\n\0"  # still usable


def test_disconnect_keeps_the_connection_open_for_the_receipt() -> None:
    pair = ConnectionPair()
    pair.handshake()
    pair.send(C, Frame(Command.DISCONNECT, (("receipt", "bye"),)))
    assert pair.client.state is State.OPEN
    assert pair.server.state is State.OPEN
    pair.send(S, Frame(Command.RECEIPT, (("receipt-id", "bye"),)))
    pair.server.receive_data(b"")
    assert pair.server.next_event() is CLOSED


def test_sending_error_closes_both_sides() -> None:
    pair = ConnectionPair()
    pair.handshake()
    error = Frame(Command.ERROR, (("message", "no"),))
    pair.send(S, error)
    assert pair.server.state is State.CLOSED
    assert pair.client.state is State.CLOSED
    with pytest.raises(LocalStompError):
        pair.server.send(Frame(Command.MESSAGE))


def test_negotiate_refuses_unknown_versions() -> None:
    with pytest.raises(LocalStompError):
        StompConnection(S).negotiate("2.0")


# ---- error_bytes --------------------------------------------------------------------------


@pytest.mark.parametrize("state", [State.CONNECTING, State.OPEN, State.ERROR, State.CLOSED])
def test_error_bytes_in_any_state(state: State) -> None:
    conn = server()
    conn.state = state
    data = conn.error_bytes("bad\nthing", "the detail ✓", receipt_id="r-7")
    assert conn.state is State.CLOSED
    assert data.startswith(b"ERROR\nmessage:bad thing\nreceipt-id:r-7\n")
    body = "the detail ✓".encode()
    frame = Frame(
        Command.ERROR,
        (
            ("message", "bad thing"),
            ("receipt-id", "r-7"),
            ("content-type", "text/plain"),
            ("version", "1.0,1.1,1.2"),  # on every ERROR, as RabbitMQ
            ("content-length", str(len(body))),
        ),
        body,
    )
    tr(connecting_client, data, [frame], state=State.CLOSED)


@pytest.mark.parametrize("version", VERSIONS)
def test_error_bytes_escape_by_version(version: str) -> None:
    pair = ConnectionPair()
    pair.handshake(version)
    data = pair.server.error_bytes("bad:\r\nthing\0", "d\0d", receipt_id="r:1\n")
    (frame,), exc = receive(pair.client, [data])
    assert exc is None
    assert isinstance(frame, Frame)
    assert frame.body == b"d\0d"
    assert (
        frame.get("message")
        == {
            "1.0": "bad:  thing ",
            "1.1": "bad: \nthing ",
            "1.2": "bad:\r\nthing ",
        }[version]
    )
    assert frame.get("receipt-id") == ("r:1 " if version == "1.0" else "r:1\n")


def test_error_bytes_survive_unencodable_text() -> None:
    conn = server()
    data = conn.error_bytes("\ud800", "\udfff")
    assert data.startswith(b"ERROR\nmessage:error\n\n")


def test_only_a_server_sends_error_bytes() -> None:
    with pytest.raises(LocalStompError):
        StompConnection(C).error_bytes("x", "y")


# ---- the transition table -----------------------------------------------------------------


def test_transitions_are_what_the_spec_says() -> None:
    for (state, command, sender), nxt in TRANSITIONS.items():
        assert command in (CLIENT_COMMANDS if sender is C else SERVER_COMMANDS)
        assert state in (State.CONNECTING, State.OPEN)
        if command is Command.ERROR:
            assert nxt is State.CLOSED
        elif command is Command.CONNECTED:
            assert nxt is State.OPEN
        else:
            assert nxt is state
    open_client_cmds = {c for (s, c, r) in TRANSITIONS if s is State.OPEN and r is C}
    assert open_client_cmds == CLIENT_COMMANDS - {Command.CONNECT, Command.STOMP}


@pytest.mark.parametrize("state", [State.CONNECTING, State.OPEN])
@pytest.mark.parametrize("command", list(Command), ids=lambda c: c.value)
@pytest.mark.parametrize("sender", list(Role))
def test_transition_table_holds_both_ways(state: State, command: Command, sender: Role) -> None:
    """Sending and receiving agree with TRANSITIONS for every (state, command, role)."""
    nxt = TRANSITIONS.get((state, command, sender))
    sending = StompConnection(sender)
    sending.state = state
    receiving = StompConnection(OTHER[sender])
    receiving.state = state
    if nxt is None:
        with pytest.raises(LocalStompError):
            sending.send(Frame(command))
        assert sending.state is state
        with pytest.raises(RemoteStompError):
            receive_one(receiving, wire(command.value))
        assert receiving.state is State.ERROR
    else:
        data = sending.send(Frame(command))
        assert sending.state is nxt
        assert receive_one(receiving, data) == Frame(command)
        assert receiving.state is nxt


def receive_one(conn: StompConnection, data: bytes) -> object:
    conn.receive_data(data)
    return conn.next_event()


def test_errors_are_stomp_errors() -> None:
    assert issubclass(RemoteStompError, StompError)
    assert issubclass(LocalStompError, StompError)
