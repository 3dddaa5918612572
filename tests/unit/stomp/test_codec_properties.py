"""Property tests for the STOMP codec: any valid frame, in any version, survives encoding,
splitting at random points and decoding; no input, however chunked, raises anything but a
StompError, and chunking never changes what comes out."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from polymq_stomp.codec import CLOSED, NEED_DATA, VERSIONS, Role, State, StompConnection
from polymq_stomp.frames import HEARTBEAT, Command, Frame, Heartbeat, StompError

from .helpers import OTHER, ConnectionPair, Event, chunked, receive

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SENT_WHEN_OPEN = {
    Role.CLIENT: [
        Command.SEND,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.ACK,
        Command.NACK,
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.DISCONNECT,
    ],
    Role.SERVER: [Command.MESSAGE, Command.RECEIPT, Command.ERROR],
}

# Characters that need escaping come up often; any other code point but NUL and surrogates too.
chars = st.one_of(
    st.sampled_from(":\n\r\\c n r"),
    st.characters(exclude_categories=["Cs"], exclude_characters="\0"),
)
text = st.text(chars, max_size=12)


def fit(version: str | None, name: str, value: str) -> tuple[str, str]:
    """Make a header sendable: ``version`` None means unescaped (CONNECT and friends)."""
    if version in (None, "1.0"):
        name, value = name.replace(":", "").replace("\n", ""), value.replace("\n", "")
    if version != "1.2":
        value = value.rstrip("\r")
    if name in ("", "content-length"):
        name = "x-" + name
    return name, value


@st.composite
def frames(draw: st.DrawFn, version: str | None, commands: Sequence[Command]) -> Frame:
    command = draw(st.sampled_from(commands))
    headers = [fit(version, *draw(st.tuples(text, text))) for _ in range(draw(st.integers(0, 6)))]
    body = draw(st.binary(max_size=200))
    if b"\0" in body or draw(st.booleans()):
        headers.insert(draw(st.integers(0, len(headers))), ("content-length", str(len(body))))
    return Frame(command, tuple(headers), body)


def opened(version: str) -> ConnectionPair:
    pair = ConnectionPair()
    pair.handshake(version)
    return pair


@SETTINGS
@given(data=st.data(), version=st.sampled_from(VERSIONS), role=st.sampled_from(list(Role)))
def test_any_frame_round_trips(data: st.DataObject, version: str, role: Role) -> None:
    frame = data.draw(frames(version, SENT_WHEN_OPEN[role]))
    pair = opened(version)
    wire = pair.conn[role].send(frame)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=8))
    got, exc = receive(pair.conn[OTHER[role]], chunked(wire, cuts))
    assert exc is None
    assert got == [frame]


@SETTINGS
@given(data=st.data(), version=st.sampled_from(VERSIONS), role=st.sampled_from(list(Role)))
def test_a_stream_of_frames_and_heartbeats_round_trips(
    data: st.DataObject, version: str, role: Role
) -> None:
    commands = [c for c in SENT_WHEN_OPEN[role] if c is not Command.ERROR]
    items = data.draw(
        st.lists(st.one_of(frames(version, commands), st.just(HEARTBEAT)), max_size=8)
    )
    pair = opened(version)
    sender = pair.conn[role]
    crlf = data.draw(st.booleans())  # a peer may end its lines with CRLF
    wire = b"".join(
        (b"\r\n" if crlf else sender.send_heartbeat())
        if isinstance(item, Heartbeat)
        else to_crlf(sender.send(item))
        if crlf
        else sender.send(item)
        for item in items
    )
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=12))
    got, exc = receive(pair.conn[OTHER[role]], chunked(wire, cuts), eof=True)
    assert exc is None
    assert got == [*items, CLOSED]


def to_crlf(frame: bytes) -> bytes:
    """``frame`` with CRLF for every EOL before the body."""
    i = frame.index(b"\n\n")
    return frame[:i].replace(b"\n", b"\r\n") + b"\r\n\r\n" + frame[i + 2 :]


@SETTINGS
@given(
    data=st.data(),
    version=st.sampled_from([*VERSIONS, None]),
)
def test_handshake_frames_go_unescaped_in_any_version(data: st.DataObject, version: str) -> None:
    connect = data.draw(frames(None, [Command.CONNECT, Command.STOMP]))
    connected = data.draw(frames(None, [Command.CONNECTED]))
    pair = ConnectionPair()
    if version is not None:
        pair.client.negotiate(version)
        pair.server.negotiate(version)
    cuts = data.draw(st.lists(st.integers(0, 500), max_size=6))
    pair.send(Role.CLIENT, connect, cuts=cuts)
    pair.send(Role.SERVER, connected, cuts=cuts)
    assert pair.client.state is pair.server.state is State.OPEN


def run(conn: StompConnection, chunks: list[bytes], eof: bool) -> tuple[list[Event], str | None]:
    """Feed everything; only StompErrors may come out (anything else fails the test)."""
    events: list[Event] = []
    try:
        for chunk in [*(c for c in chunks if c), *([b""] if eof else [])]:
            conn.receive_data(chunk)  # b"" (only at the end) means EOF
            while (ev := conn.next_event()) is not NEED_DATA:
                assert isinstance(ev, Frame | Heartbeat) or ev is CLOSED
                events.append(ev)
                if ev is CLOSED:
                    return events, None
    except StompError as exc:
        assert conn.state is State.ERROR
        return events, exc.message
    return events, None


limits = st.fixed_dictionaries(
    {
        "max_frame": st.integers(8, 400),
        "max_headers": st.integers(0, 6),
        "max_header_length": st.integers(2, 40),
    }
)


def make(role: Role, version: str | None, lim: dict[str, int]) -> StompConnection:
    if version is None:  # fresh, still connecting
        return StompConnection(role, **lim)
    pair = ConnectionPair()
    pair.handshake(version)
    conn = pair.conn[role]
    conn.max_frame, conn.max_headers = lim.get("max_frame", 1 << 20), lim.get("max_headers", 64)
    conn.max_header_length = lim.get("max_header_length", 8192)
    return conn


def check_any_input(
    role: Role, version: str | None, lim: dict[str, int], raw: bytes, cuts: list[int], eof: bool
) -> None:
    whole = run(make(role, version, lim), [raw], eof)
    split = run(make(role, version, lim), chunked(raw, cuts), eof)
    ones = run(make(role, version, lim), [raw[i : i + 1] for i in range(len(raw))], eof)
    # Chunking changes nothing: the same events, then the same error or none.
    assert split[0] == whole[0] == ones[0]
    assert (split[1] is None) == (whole[1] is None) == (ones[1] is None)


@settings(max_examples=500, deadline=None)
@given(
    role=st.sampled_from(list(Role)),
    version=st.sampled_from([*VERSIONS, None]),
    lim=limits,
    raw=st.binary(max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=10),
    eof=st.booleans(),
)
def test_arbitrary_bytes_raise_only_stomp_errors(
    role: Role, version: str | None, lim: dict[str, int], raw: bytes, cuts: list[int], eof: bool
) -> None:
    check_any_input(role, version, lim, raw, cuts, eof)


@settings(max_examples=500, deadline=None)
@given(
    data=st.data(),
    role=st.sampled_from(list(Role)),
    version=st.sampled_from(VERSIONS),
    lim=limits,
    eof=st.booleans(),
)
def test_damaged_frames_raise_only_stomp_errors(
    data: st.DataObject, role: Role, version: str, lim: dict[str, int], eof: bool
) -> None:
    """Valid frames with bytes changed, dropped or added: deeper than random bytes get."""
    peer = OTHER[role]
    items = data.draw(st.lists(frames(version, SENT_WHEN_OPEN[peer]), min_size=1, max_size=3))
    sender = make(peer, version, {})
    raw = bytearray(b"".join(sender.send(f) for f in items if sender.state is State.OPEN))
    assume(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["set", "drop", "insert"]))
        byte = data.draw(st.sampled_from([0, 10, 13, 58, 92, 0xFF, ord("n"), ord("c"), ord("9")]))
        if op == "set":
            raw[i] = byte
        elif op == "drop":
            del raw[i]
        else:
            raw.insert(i, byte)
        if not raw:
            break
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=10))
    check_any_input(role, version, lim, bytes(raw), cuts, eof)
