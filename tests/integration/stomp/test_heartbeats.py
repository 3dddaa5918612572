"""Heart-beating in both directions, over TCP and WebSocket: negotiation, a heart-beating
idle client that stays, a silent client that is cut off after the agreed interval (with an
ERROR it can read first), and the server's own heart-beats at the agreed rate. The server
has ``stomp_heartbeat_min`` 100 ms and ``stomp_heartbeat_grace`` 2.0 (its defaults)."""

from __future__ import annotations

import time

import pytest

from ...procs import PolymqProcess
from .helpers import StompClient, raw_client, unique

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("asked", "answered"),
    [
        ("0,0", "0,0"),  # none either way
        ("300,500", "500,300"),  # we send every 500 ms (as asked), expect every 300 ms
        ("1000,0", "0,1000"),  # the client beats, wants none
        ("0,250", "250,0"),  # the client wants ours, does not beat
        ("20,30", "100,100"),  # never faster than the server's floor
        (" 200 , 200 ", "200,200"),
    ],
)
def test_heart_beat_negotiation(
    run_stomp: PolymqProcess, transport: str, asked: str, answered: str
) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        connected = raw.connect(**{"heart-beat": asked})
        assert connected["heart-beat"] == answered
    finally:
        raw.close()


def test_heart_beating_idle_stomp_py_client_stays_connected(
    run_stomp: PolymqProcess, transport: str
) -> None:
    c = StompClient(run_stomp, transport, heartbeats=(200, 200)).connect()
    try:
        assert c.listener.connected[0].headers["heart-beat"] == "200,200"
        start = time.monotonic()
        # idle for ten intervals; the server's heart-beats keep arriving meanwhile
        c.listener.wait(lambda: c.listener.heartbeats >= 5, timeout=10)
        while time.monotonic() - start < 2.0:
            time.sleep(0.1)
        assert c.conn.is_connected()
        assert not c.listener.disconnected.is_set()
        assert not c.listener.errors
        q = f"/queue/{unique()}"
        c.subscribe(q)
        c.send_receipted(q, "still here")
        assert c.listener.wait_messages(1)[0].body == "still here"
    finally:
        c.close()


def test_silent_client_is_disconnected_after_the_agreed_interval(
    run_stomp: PolymqProcess, transport: str
) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        # the client promises a heart-beat every 500 ms, then says nothing
        connected = raw.connect(**{"heart-beat": "500,0"})
        assert connected["heart-beat"] == "0,500"
        start = time.monotonic()
        command, headers, body = raw.read_frame(timeout=10)
        waited = time.monotonic() - start
        assert (command, headers["message"]) == ("ERROR", "heart-beat timeout")
        assert b"500 ms" in body
        assert 0.5 <= waited < 4.0, waited  # twice the interval (the grace), give or take
        assert raw.closed_by_server()
    finally:
        raw.close()


def test_raw_client_that_beats_stays_connected(run_stomp: PolymqProcess, transport: str) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        raw.connect(**{"heart-beat": "200,0"})
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            raw.send(b"\n")
            time.sleep(0.1)
        q = f"/queue/{unique()}"
        raw.frame("SUBSCRIBE", {"destination": q, "id": "1"})
        raw.frame("SEND", {"destination": q}, b"alive")
        command, headers, body = raw.read_frame()
        assert (command, body) == ("MESSAGE", b"alive"), headers
    finally:
        raw.close()


def test_server_sends_heart_beats_at_the_agreed_rate(
    run_stomp: PolymqProcess, transport: str
) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        connected = raw.connect(**{"heart-beat": "0,200"})
        assert connected["heart-beat"] == "200,0"
        beats = raw.count_heartbeats(2.0)
        assert 6 <= beats <= 13, beats  # about ten in two seconds
    finally:
        raw.close()


def test_no_heart_beats_unless_asked(run_stomp: PolymqProcess, transport: str) -> None:
    raw = raw_client(run_stomp, transport)
    try:
        raw.connect(**{"heart-beat": "0,0"})
        assert raw.count_heartbeats(0.6) == 0
        assert not raw.closed_by_server(0.1)
    finally:
        raw.close()
