"""Tests for the codec's fast path (``decode_publish``, ``decode_properties``): the hot frames
of a basic.publish decoded without pamqp's generic tables must give exactly what pamqp
gives, for any input (whole, cut short anywhere, fed one byte at a time), and re-encode with
pamqp to the very bytes they came from."""

from __future__ import annotations

import datetime
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from polymq_amqp.errors import ConnectionException
from polymq_amqp.wire.events import Content, ContentRun, NeedData
from polymq_amqp.wire.fastpath import _pamqp_properties, decode_properties, decode_publish

from .helpers import TRAILING, beat, content, events, method, open_conn, tr, with_channel

_INDEX = struct.Struct(">I")
_HEAD = struct.Struct(">HHQ")


def _pamqp_publish(payload: bytes) -> commands.Basic.Publish:
    m = commands.Basic.Publish()
    m.unmarshal(payload[4:])
    return m


def _fields(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in type(obj).__slots__}


def _same(fast: Any, slow: Any) -> None:
    assert type(fast) is type(slow)
    assert _fields(fast) == _fields(slow)
    assert {k: type(v) for k, v in _fields(fast).items()} == {
        k: type(v) for k, v in _fields(slow).items()
    }


def _either(fn: Any, payload: bytes) -> Any:
    try:
        return fn(payload)
    except Exception as exc:
        return exc


_names = st.text(
    alphabet=st.sampled_from("abcxyz-_.:ABC019"), max_size=127
)  # what pamqp accepts for an exchange
_keys = st.text(max_size=80).filter(lambda s: len(s.encode("utf-8")) <= 255)
_short = st.text(max_size=60).filter(lambda s: len(s.encode("utf-8")) <= 255)


@settings(max_examples=300)
@given(_names, _keys, st.booleans(), st.booleans())
def test_publish_as_pamqp_decodes_it(
    exchange: str, key: str, mandatory: bool, immediate: bool
) -> None:
    m = commands.Basic.Publish(
        exchange=exchange, routing_key=key, mandatory=mandatory, immediate=immediate
    )
    payload = _INDEX.pack(m.index) + m.marshal()
    fast = decode_publish(payload)
    _same(fast, _pamqp_publish(payload))
    assert _INDEX.pack(fast.index) + fast.marshal() == payload  # byte for byte, both ways
    for cut in range(4, len(payload)):  # cut short anywhere: the same value, or both raise
        a, b = _either(decode_publish, payload[:cut]), _either(_pamqp_publish, payload[:cut])
        if isinstance(b, Exception):
            assert isinstance(a, Exception), (cut, a)
        else:
            _same(a, b)


def test_publish_with_bad_utf8_raises_like_pamqp() -> None:
    payload = _INDEX.pack(0x003C0028) + b"\x00\x00" + b"\x02\xff\xfe" + b"\x01k" + b"\x00"
    with pytest.raises(UnicodeDecodeError):
        decode_publish(payload)
    with pytest.raises(UnicodeDecodeError):
        _pamqp_publish(payload)


_props = st.fixed_dictionaries(
    {},
    optional={
        "content_type": _short,
        "content_encoding": _short,
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 255),
        "correlation_id": _short,
        "reply_to": _short,
        "expiration": st.text(alphabet="0123456789", max_size=9),
        "message_id": _short,
        "message_type": _short,
        "user_id": _short,
        "app_id": _short,
        # these two go to pamqp
        "headers": st.dictionaries(st.text(max_size=8), st.integers(-5, 5), max_size=3),
        "timestamp": st.datetimes(
            min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1)
        ).map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)),
    },
)


@settings(max_examples=300)
@given(_props, st.integers(0, 1 << 40))
def test_properties_as_pamqp_decodes_them(kw: dict[str, Any], size: int) -> None:
    props = commands.Basic.Properties(**kw)
    encoded = props.marshal()
    payload = _HEAD.pack(60, 0, size) + encoded
    fast = decode_properties(payload)
    _same(fast, _pamqp_properties(payload))
    assert fast.marshal() == encoded  # byte for byte
    for cut in range(14, len(payload)):
        a = _either(decode_properties, payload[:cut])
        b = _either(_pamqp_properties, payload[:cut])
        if isinstance(b, Exception):
            assert isinstance(a, Exception), (cut, a)
        else:
            _same(a, b)


def test_no_properties_and_the_benchmark_s_one() -> None:
    for props in (commands.Basic.Properties(), commands.Basic.Properties(delivery_mode=1)):
        payload = _HEAD.pack(60, 0, 32) + props.marshal()
        _same(decode_properties(payload), _pamqp_properties(payload))


@settings(max_examples=40, deadline=None)
@given(_keys, st.booleans(), _props, st.binary(max_size=300))
def test_publishes_through_the_codec_whole_and_byte_by_byte(
    key: str, mandatory: bool, kw: dict[str, Any], body: bytes
) -> None:
    props = commands.Basic.Properties(**kw)
    data = content(1, body, props, frame_max=4096, key=key)
    if mandatory:  # the bit in the publish frame's last argument byte
        data = data.replace(
            commands.Basic.Publish(routing_key=key).marshal(),
            commands.Basic.Publish(routing_key=key, mandatory=True).marshal(),
            1,
        )
    [ev] = tr(lambda: with_channel(open_conn(frame_max=4096)), data)
    name, channel, mname, args, got_props, got_body, _ = ev
    assert (name, channel, mname, got_body) == ("Content", 1, "Basic.Publish", body)
    assert dict(args) == {
        "ticket": 0,
        "exchange": "",
        "routing_key": key,
        "mandatory": mandatory,
        "immediate": False,
    }
    expected = _pamqp_properties(_HEAD.pack(60, 0, len(body)) + props.marshal())
    assert dict(got_props) == dict(expected)  # ("" is not sent: pamqp reads None)


def test_a_publish_event_holds_pamqp_objects() -> None:
    conn = with_channel(open_conn())
    conn.receive_data(content(1, b"x", commands.Basic.Properties(delivery_mode=2)))
    ev = conn.next_event()
    assert isinstance(ev, Content)
    assert isinstance(ev.method, commands.Basic.Publish)
    assert isinstance(ev.properties, commands.Basic.Properties)
    assert ev.properties.delivery_mode == 2 and ev.properties.cluster_id == ""


def test_deliver_on_a_channel_not_open_is_a_local_error() -> None:
    from polymq_amqp.errors import LocalProtocolError

    conn = with_channel(open_conn(), 1)
    with pytest.raises(LocalProtocolError):
        conn.send_delivers(2, [b"frames"])


# ---- ContentReader: a publish's content frames taken from the buffer in one pass ----------


def _frames_after_publish(data: bytes) -> bytes:
    """The content header and body frames of ``content(...)`` (its method frame dropped)."""
    size = struct.unpack_from(">I", data, 3)[0]
    return data[size + 8 :]


@settings(max_examples=150, deadline=None)
@given(_props, st.binary(max_size=9000), st.sampled_from([4096, 8192, 131072]))
def test_reader_takes_what_pamqp_made_and_nothing_of_a_part(
    kw: dict[str, Any], body: bytes, frame_max: int
) -> None:
    from polymq_amqp.wire.fastpath import ContentReader

    props = commands.Basic.Properties(**kw)
    frames = _frames_after_publish(content(5, body, props, frame_max=frame_max))
    buf = bytearray(b"junk" + frames + TRAILING)
    got = ContentReader().take(buf, 4, 5, frame_max, 1 << 20)
    assert got is not None
    fast_props, fast_body, end = got
    assert fast_body == body and end == 4 + len(frames)
    _same(fast_props, _pamqp_properties(_HEAD.pack(60, 0, len(body)) + props.marshal()))
    assert fast_props.marshal() == props.marshal()  # byte for byte
    for cut in range(len(frames)):  # cut short anywhere: nothing is taken
        assert ContentReader().take(bytearray(frames[:cut]), 0, 5, frame_max, 1 << 20) is None
    # another channel, a lower frame_max, a lower size limit: left to the codec
    assert ContentReader().take(bytearray(frames), 0, 6, frame_max, 1 << 20) is None
    assert ContentReader().take(bytearray(frames), 0, 5, frame_max, len(body) - 1) is None
    if len(body) > 4096 - 8:
        assert ContentReader().take(bytearray(frames), 0, 5, len(body), 1 << 20) is None


def test_reader_gives_the_last_properties_again_unless_they_hold_a_table() -> None:
    from polymq_amqp.wire.fastpath import ContentReader

    reader = ContentReader()
    same = commands.Basic.Properties(delivery_mode=1, content_type="text/plain")
    a = reader.take(bytearray(_frames_after_publish(content(1, b"a", same))), 0, 1, 4096, 99)
    b = reader.take(bytearray(_frames_after_publish(content(1, b"bb", same))), 0, 1, 4096, 99)
    assert a is not None and b is not None and a[0] is b[0] and (a[1], b[1]) == (b"a", b"bb")
    other = commands.Basic.Properties(delivery_mode=2)
    c = reader.take(bytearray(_frames_after_publish(content(1, b"c", other))), 0, 1, 4096, 99)
    assert c is not None and c[0].delivery_mode == 2
    table = commands.Basic.Properties(headers={"k": 1})
    frames = _frames_after_publish(content(1, b"d", table))
    d = reader.take(bytearray(frames), 0, 1, 4096, 99)
    e = reader.take(bytearray(frames), 0, 1, 4096, 99)
    assert d is not None and e is not None and d[0] is not e[0]
    assert d[0].headers == e[0].headers == {"k": 1}


def test_reader_gives_the_last_publish_method_again_for_the_same_payload() -> None:
    from polymq_amqp.wire.fastpath import ContentReader

    reader = ContentReader()
    one = _INDEX.pack(60 << 16 | 40) + b"\x00\x00\x02ex\x01k\x01"
    a, b = reader.publish(one), reader.publish(bytes(one))
    assert a is b and (a.exchange, a.routing_key, a.mandatory) == ("ex", "k", True)
    c = reader.publish(one[:-1] + b"\x00")
    assert c is not a and not c.mandatory and reader.publish(one[:-1] + b"\x00") is c
    with pytest.raises(IndexError):  # a bad payload raises and is not kept
        reader.publish(one[:8])
    assert reader.publish(one[:-1] + b"\x00") is c


def test_bad_content_frames_after_a_publish_get_the_codec_s_answers() -> None:
    from polymq_amqp.errors import ConnectionException

    publish = method(1, commands.Basic.Publish(routing_key="k"))
    good = _frames_after_publish(content(1, b"xy"))
    head_end = struct.unpack_from(">I", good, 3)[0] + 8
    cases = {
        "body before header": (good[head_end:], 505),
        "bad frame end": (good[:head_end - 1] + b"\x00" + good[head_end:], 501),
        "body too long": (good[:head_end] + b"\x03\x00\x01\x00\x00\x00\x03xyz\xce", 501),
        "another method": (method(1, commands.Basic.Qos()), 505),
    }  # fmt: skip
    for name, (frames, code) in cases.items():
        for feed in ("whole", "bytes"):
            conn = with_channel(open_conn())
            data = publish + frames
            chunks = [data] if feed == "whole" else [data[i : i + 1] for i in range(len(data))]
            with pytest.raises(ConnectionException) as err:
                for chunk in chunks:
                    conn.receive_data(chunk)
                    events(conn)
            assert err.value.reply_code == code, (name, feed)


def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        n = struct.unpack_from(">I", data, 3)[0] + 8
        out.append(data[:n])
        data = data[n:]
    return out


def test_publishes_interleaved_with_other_channels_and_heartbeats() -> None:
    def make() -> Any:
        return with_channel(with_channel(open_conn(frame_max=4096), 1), 2)

    one = _frames(content(1, b"a" * 5000, commands.Basic.Properties(), frame_max=4096))
    two = content(2, b"b", commands.Basic.Properties(delivery_mode=2), frame_max=4096)
    assert len(one) == 4  # method, header, two body frames
    # channel 2's publish and a heartbeat between channel 1's body frames
    data = b"".join(one[:3]) + two + beat() + one[3] + two
    evs = tr(make, data)
    assert [(e[0], e[1] if len(e) > 1 else None, e[5] if len(e) > 1 else None) for e in evs] == [
        ("Content", 2, b"b"),
        ("Heartbeat", None, None),
        ("Content", 1, b"a" * 5000),
        ("Content", 2, b"b"),
    ]


# ---- runs: publishes that repeat the one before them, given as one ContentRun -----------------
def _run_events(data: bytes, frame_max: int = 4096) -> list[Any]:
    conn = with_channel(with_channel(open_conn(frame_max=frame_max), 1), 2)
    conn.receive_data(data)
    return events(conn, runs=True)


def _shape(evs: list[Any]) -> list[tuple[str, int, int]]:
    """(event, channel, bodies) of each event."""
    out = []
    for e in evs:
        if isinstance(e, ContentRun):
            out.append(("run", e.channel, len(e.bodies)))
        elif isinstance(e, Content):
            out.append(("one", e.channel, 1))
        else:
            out.append((type(e).__name__, 0, 0))
    return out


def test_repeated_publishes_come_as_one_run_of_their_bodies() -> None:
    props = commands.Basic.Properties(delivery_mode=1, content_type="text/plain")
    bodies = [b"m%d" % i for i in range(50)] + [b""] + [b"last"]
    data = b"".join(content(1, b, props, frame_max=4096) for b in bodies)
    [run] = _run_events(data)
    assert isinstance(run, ContentRun)
    assert run.bodies == bodies
    assert (run.channel, run.method.routing_key, run.properties.content_type) == (
        1,
        "k",
        "text/plain",
    )
    # the same events as Contents when fed byte by byte (no run is ever whole) and with a
    # partial publish after them
    evs = tr(lambda: with_channel(open_conn(frame_max=4096)), data)
    assert [e[5] for e in evs] == bodies


def test_a_run_stops_at_the_first_publish_that_differs() -> None:
    p1 = commands.Basic.Properties(delivery_mode=1)
    p2 = commands.Basic.Properties(delivery_mode=2)
    table = commands.Basic.Properties(headers={"a": 1})
    parts = [
        *(content(1, b"x", p1) for _ in range(3)),
        content(1, b"x", p1, key="other"),  # another routing key
        content(1, b"x", p1, key="other"),
        content(1, b"x", p2, key="other"),  # other properties
        content(1, b"x", p2, key="other"),
        content(2, b"x", p2, key="other"),  # another channel
        content(2, b"x", table, key="other"),  # a headers table: never a run
        content(2, b"x", table, key="other"),
        content(2, b"y" * 5000, p1, frame_max=4096),  # a body in two frames: read by
        content(2, b"z", p1),  # take(), the run goes on with one-frame bodies
        content(2, b"y" * 5000, p1, frame_max=4096),  # ends the run: read alone
        beat(),
        content(2, b"z", p1),
    ]
    evs = _run_events(b"".join(parts))
    assert _shape(evs) == [
        ("run", 1, 3),
        ("run", 1, 2),
        ("run", 1, 2),
        ("one", 2, 1),
        ("one", 2, 1),
        ("one", 2, 1),
        ("run", 2, 2),
        ("one", 2, 1),
        ("Heartbeat", 0, 0),
        ("one", 2, 1),
    ]
    assert evs[6].bodies == [b"y" * 5000, b"z"]


def test_a_run_ends_where_the_data_ends_and_goes_on_as_more_comes() -> None:
    props = commands.Basic.Properties()
    one = content(1, b"abc", props)
    conn = with_channel(open_conn())
    cut = len(one) * 3 + 10  # three whole publishes and a part of the fourth
    data = one * 6
    conn.receive_data(data[:cut])
    assert _shape(events(conn, runs=True)) == [("run", 1, 3)]
    conn.receive_data(data[cut:])
    assert _shape(events(conn, runs=True)) == [("run", 1, 3)]


def test_a_run_respects_the_body_limit_and_a_frame_error_is_still_found() -> None:
    props = commands.Basic.Properties()
    ok = content(1, b"abc", props)
    big = content(1, b"x" * 100, props)
    conn = with_channel(open_conn(max_body=50))
    conn.receive_data(ok * 2 + big)
    evs = events(conn, runs=True)
    assert _shape(evs)[0] == ("run", 1, 2)
    assert type(evs[-1]).__name__ == "OversizedContent"
    # a repeated publish whose body frame lacks its end byte: the run stops before it and
    # the codec answers it as it would without runs
    bad = bytearray(ok)
    bad[-1] = 0
    conn = with_channel(open_conn())
    conn.receive_data(ok * 2 + bytes(bad))
    got: list[Any] = []
    with pytest.raises(ConnectionException) as err:
        while not isinstance(ev := conn.next_event(), NeedData):
            got.append(ev)
    assert _shape(got) == [("run", 1, 2)]
    assert err.value.reply_code == 501


def test_an_empty_headers_table_is_decoded_without_pamqp(monkeypatch: pytest.MonkeyPatch) -> None:
    """aio-pika sends ``headers={}`` and a new message id with every publish."""
    props = commands.Basic.Properties(headers={}, message_id="a1b2", delivery_mode=1)
    payload = _HEAD.pack(60, 0, 32) + props.marshal()
    expected = _pamqp_properties(payload)
    import polymq_amqp.wire.fastpath as fastpath

    def refuse(_: bytes) -> Any:
        raise AssertionError("went to pamqp")

    monkeypatch.setattr(fastpath, "_pamqp_properties", refuse)
    got = decode_properties(payload)
    _same(got, expected)
    assert got.headers == {} and got.marshal() == props.marshal()
    with pytest.raises(AssertionError):  # a table with something in it goes to pamqp
        decode_properties(
            _HEAD.pack(60, 0, 1) + commands.Basic.Properties(headers={"a": 1}).marshal()
        )


@pytest.mark.parametrize("pamqp_path", [False, True])
@pytest.mark.parametrize("wrong", ["a string longer than the frame", "bytes after the last"])
def test_properties_that_do_not_fill_their_frame_are_refused(pamqp_path: bool, wrong: str) -> None:
    """Not cut or ignored as pamqp would: the message would carry what its client never
    sent (RabbitMQ refuses such a frame too)."""
    kw: dict[str, Any] = {"content_type": "text/plain"}
    if pamqp_path:
        kw["timestamp"] = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    payload = _HEAD.pack(60, 0, 2) + commands.Basic.Properties(**kw).marshal()
    if wrong == "bytes after the last":
        payload += b"\x00junk"
    else:  # the content type says 240 bytes; "text/plain" (and the timestamp) follow
        payload = payload.replace(b"\x0atext/plain", b"\xf0text/plain")
    for decode in (decode_properties, _pamqp_properties):
        with pytest.raises(ValueError):  # (or the string's bytes are not UTF-8)
            decode(payload)
    head = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    for feed in ("whole", "bytes"):  # (the fast reader, then frame by frame)
        conn = with_channel(open_conn())
        data = method(1, commands.Basic.Publish(routing_key="q")) + head + b"\x03\x00\x01"
        data += b"\x00\x00\x00\x02xy\xce"
        chunks = [data] if feed == "whole" else [data[i : i + 1] for i in range(len(data))]
        with pytest.raises(ConnectionException) as info:
            for chunk in chunks:
                conn.receive_data(chunk)
                events(conn)
        assert info.value.reply_code == 502, feed
