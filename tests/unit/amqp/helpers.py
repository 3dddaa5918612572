"""Helpers for the AMQP codec's tests: frames made by pamqp (the client side), and ``tr``,
which feeds the same bytes whole, one byte at a time, and followed by more data, and checks
that the events are the same each way (as h11's ``tests/test_io.py::tr``)."""

from __future__ import annotations

from typing import Any

from pamqp import base, body, commands, frame, header, heartbeat

from polymq_amqp.wire.codec import PROTOCOL_HEADER, AmqpConnection
from polymq_amqp.wire.events import Content, ContentRun, Event, NeedData

TRAILING = frame.marshal(commands.Basic.Qos(prefetch_count=7), 1)[:5]  # half a frame


def method(channel: int, m: base.Frame) -> bytes:
    return frame.marshal(m, channel)


def content(channel: int, data: bytes, props: commands.Basic.Properties | None = None,
            frame_max: int = 131072, exchange: str = "", key: str = "k") -> bytes:  # fmt: skip
    """A basic.publish with its content header and body frames."""
    out = [
        frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), channel),
        frame.marshal(header.ContentHeader(0, len(data), props or commands.Basic.Properties()),
                      channel),
    ]  # fmt: skip
    step = frame_max - 8
    for i in range(0, len(data), step):
        out.append(frame.marshal(body.ContentBody(data[i : i + step]), channel))
    return b"".join(out)


def beat() -> bytes:
    return frame.marshal(heartbeat.Heartbeat(), 0)


def events(conn: AmqpConnection, *, runs: bool = False) -> list[Event]:
    """The events until more data is needed; a ContentRun as the Content of each body (what
    it stands for) unless ``runs``."""
    out: list[Event] = []
    while not isinstance(ev := conn.next_event(), NeedData):
        if isinstance(ev, ContentRun) and not runs:
            out += (Content(ev.channel, ev.method, ev.properties, b) for b in ev.bodies)
            continue
        out.append(ev)
        if type(ev).__name__ == "ConnectionClosed":
            break
    return out


def open_conn(**kw: Any) -> AmqpConnection:
    """A server codec through the handshake: header, start, start-ok, tune, tune-ok, open,
    open-ok; state OPEN."""
    conn = AmqpConnection(**kw)
    conn.receive_data(PROTOCOL_HEADER)
    events(conn)
    conn.send_method(0, commands.Connection.Start())
    conn.receive_data(method(0, commands.Connection.StartOk({}, "PLAIN", "\0u\0p", "en_US")))
    events(conn)
    channel_max, frame_max = kw.get("channel_max", 2047), kw.get("frame_max", 131072)
    conn.send_method(0, commands.Connection.Tune(channel_max, frame_max, 0))
    conn.receive_data(method(0, commands.Connection.TuneOk(channel_max, frame_max, 0)))
    conn.receive_data(method(0, commands.Connection.Open("/")))
    events(conn)
    conn.send_method(0, commands.Connection.OpenOk())
    return conn


def with_channel(conn: AmqpConnection, channel: int = 1) -> AmqpConnection:
    conn.receive_data(method(channel, commands.Channel.Open()))
    events(conn)
    conn.send_method(channel, commands.Channel.OpenOk())
    return conn


def _describe(ev: Event) -> Any:
    """An event as comparable data (pamqp's objects compare by identity)."""
    name = type(ev).__name__
    if hasattr(ev, "method"):
        m = ev.method
        args = tuple((k, v) for k, v in m)
        props = tuple(getattr(ev, "properties", ()) or ())
        return (name, ev.channel, m.name, args, props, getattr(ev, "body", None),  # type: ignore[attr-defined]
                getattr(ev, "size", None))  # fmt: skip
    return (name,)


def tr(make: Any, data: bytes) -> list[Any]:
    """The events of ``data`` fed to ``make()`` whole, byte by byte, and with trailing data;
    asserts all three agree, returns them (as comparable tuples)."""
    whole = make()
    whole.receive_data(data)
    expected = [_describe(e) for e in events(whole)]
    one = make()
    got: list[Any] = []
    for i in range(len(data)):
        one.receive_data(data[i : i + 1])
        got += [_describe(e) for e in events(one)]
    assert got == expected
    trailing = make()
    trailing.receive_data(data + TRAILING)
    assert [_describe(e) for e in events(trailing)] == expected
    return expected
