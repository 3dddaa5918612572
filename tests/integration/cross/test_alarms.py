"""Resource alarms on every protocol, against one ``polymq run`` whose memory high watermark
is forced below what it uses (``POLYMQ_MEMORY_HIGH_WATERMARK=2``: two bytes): HTTP, long-poll
and Avro publishes get 503 with ``Retry-After``; an AMQP publisher gets
``connection.blocked``; a STOMP or native publisher's connection is read no more, while a
consumer keeps draining. A reload that raises the watermark clears the alarm by itself, and every
publisher goes on (the held native publish is answered, AMQP gets ``connection.unblocked``)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import requests

from polymq import Message

from ...procs import PolymqProcess
from ..core.helpers import bodies, collect, connect, eventually, uid

pytestmark = pytest.mark.timeout(90)
WAIT = 10


@pytest.fixture
def run(tmp_path: Path) -> Iterator[PolymqProcess]:
    env = {"POLYMQ_MEMORY_HIGH_WATERMARK": "2"}
    with PolymqProcess("run", tmp_path / "run", env=env) as proc:
        yield proc


def alarm_gauge(run: PolymqProcess) -> float:
    text = requests.get(f"{run.url('admin')}/metrics", timeout=WAIT).text
    [line] = [
        x for x in text.splitlines() if x.startswith('polymq_resource_alarm{resource="memory"}')
    ]
    return float(line.split()[-1])


def stomp_frame(sock: socket.socket) -> bytes:
    """The next STOMP frame (heart-beat newlines skipped) from ``sock``."""
    data = b""
    while b"\x00" not in data:
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data.lstrip(b"\n")


def http_publish(run: PolymqProcess, listener: str, q: str) -> requests.Response:
    return requests.post(
        f"{run.url(listener)}/v1/queue/{q}/messages", json={"body": "x"}, timeout=WAIT
    )


async def test_a_memory_alarm_holds_publishers_on_every_protocol_until_it_clears(
    run: PolymqProcess,
) -> None:
    q, native = uid(), uid()
    await eventually(lambda: alarm_gauge(run) == 1, within=WAIT)
    assert "memory alarm on" in run.log()
    api = (await asyncio.to_thread(requests.get, f"{run.url('admin')}/api/alarms")).json()
    assert api["alarms"] == ["memory"] and api["memory"]["limit"] == 2, api
    # what the console's banner shows (tests/e2e/test_console.py sees the banner itself)
    overview = (await asyncio.to_thread(requests.get, f"{run.url('admin')}/api/overview")).json()
    assert overview["alarms"] == ["memory"] and overview["memory"]["limit_bytes"] == 2, overview

    # HTTP family: 503 with Retry-After, a JSON problem saying why (after the link heard it)
    def refused(listener: str) -> bool:
        r = http_publish(run, listener, q)
        return r.status_code == 503 and "memory alarm" in r.json()["detail"]

    for listener in ("http", "longpoll"):
        await eventually(lambda listener=listener: refused(listener), within=WAIT)
        assert http_publish(run, listener, q).headers["Retry-After"]
    avro = await asyncio.to_thread(
        requests.post,
        f"{run.url('avro')}/v1/queue/{q}/records",
        data=b"\x00",
        headers={"Content-Type": "application/vnd.apache.avro+json"},
        timeout=WAIT,
    )
    assert avro.status_code == 503 and "memory alarm" in avro.json()["detail"], avro.text

    # AMQP: connection.blocked, with the alarm as the reason
    blocked: list[str] = []
    params = pika.ConnectionParameters("127.0.0.1", run.ports["amqp"])
    amqp = pika.BlockingConnection(params)
    amqp.add_on_connection_blocked_callback(lambda _c, m: blocked.append(m.method.reason))
    amqp.add_on_connection_unblocked_callback(lambda _c, _m: blocked.append("unblocked"))
    channel = amqp.channel()
    channel.basic_publish("", q, b"from amqp")
    deadline = time.monotonic() + WAIT
    while not blocked and time.monotonic() < deadline:
        amqp.process_data_events(0.1)
    assert blocked and "memory" in blocked[0], blocked

    # STOMP: the first SEND is served, then the connection is read no more
    stomp = socket.create_connection(("127.0.0.1", run.ports["stomp"]), timeout=WAIT)
    stomp.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
    assert stomp_frame(stomp).startswith(b"CONNECTED")
    stomp.sendall(b"SEND\ndestination:/queue/" + q.encode() + b"\nreceipt:r1\n\none\x00")
    assert b"receipt-id:r1" in stomp_frame(stomp)
    stomp.sendall(b"SEND\ndestination:/queue/" + q.encode() + b"\nreceipt:r2\n\ntwo\x00")
    stomp.settimeout(1.5)
    with pytest.raises(TimeoutError):
        stomp_frame(stomp)  # held: no RECEIPT for r2
    stomp.settimeout(WAIT)

    # native: the first publish is served, then the publisher is read no more; a consumer
    # on another connection keeps draining what is there
    async with (
        await connect(run.ports["core"]) as producer,
        await connect(run.ports["core"]) as consumer,
    ):
        await producer.publish(f"queue/{native}", [Message(b"first")])
        held = asyncio.ensure_future(producer.publish(f"queue/{native}", [Message(b"second")]))
        await asyncio.sleep(1.5)
        assert not held.done(), "a native publisher was not held by the alarm"
        sub = await consumer.subscribe(f"queue/{native}", prefetch=10)
        assert bodies(await collect(sub, 1)) == [b"first"]

        # a reload raises the watermark: the alarm clears by itself, publishers go on
        r = await asyncio.to_thread(
            requests.post,
            f"{run.url('admin')}/api/config/reload",
            json={"limits": {"memory_high_watermark": 0.99}},
            timeout=WAIT,
        )
        assert r.json()["applied_here"], r.text
        await asyncio.wait_for(held, WAIT)
        assert bodies(await collect(sub, 1)) == [b"second"]
        await eventually(lambda: alarm_gauge(run) == 0, within=WAIT)
        assert "memory alarm cleared" in run.log()
        assert b"receipt-id:r2" in await asyncio.to_thread(stomp_frame, stomp)  # read again
        stomp.close()
        for listener in ("http", "longpoll"):
            await eventually(
                lambda listener=listener: http_publish(run, listener, q).status_code == 200,
                within=WAIT,
            )
    deadline = time.monotonic() + WAIT
    while "unblocked" not in blocked and time.monotonic() < deadline:
        amqp.process_data_events(0.1)
    assert blocked[-1] == "unblocked", blocked
    amqp.close()
