"""Fixtures for the AMQP frontend's integration tests: one broker (``polymq run`` and the
AMQP frontend, on 127.0.0.1 with ephemeral ports) for the whole package, reached with pika,
aio-pika and raw sockets. Every test uses its own names, and tolerates what others left.

``target`` runs a test against polymq and, where RabbitMQ is installed, against a private
RabbitMQ node too (:mod:`tests.rabbit`, started once for the package, its own ports), so the
test shows that RabbitMQ behaves as polymq does."""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
import requests

from ...rabbit import RabbitNode, find_server, rabbit_node
from .helpers import WAIT, Broker, Target, pika_connection, serving_broker


@pytest.fixture(scope="package")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    workdir: Path = tmp_path_factory.mktemp("amqp")
    with serving_broker(workdir) as b:
        yield b


@pytest.fixture(scope="package")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A private RabbitMQ node (skips where RabbitMQ is not installed)."""
    if find_server() is None:
        pytest.skip("rabbitmq-server is not installed")
    with rabbit_node(tmp_path_factory.mktemp("rabbit")) as node:
        yield node


@pytest.fixture(params=["polymq", "rabbitmq"])
def target(request: pytest.FixtureRequest) -> Target:
    """The broker a compatibility test runs against: polymq, then RabbitMQ."""
    if request.param == "polymq":
        b: Broker = request.getfixturevalue("broker")

        def forced_alarm(on: bool) -> None:
            url = f"{b.url('amqp_admin')}/alarm/forced"
            r = requests.request("PUT" if on else "DELETE", url, timeout=WAIT)
            assert r.status_code == 200, r.text

        return Target("polymq", b.amqp_port, forced_alarm)
    node: RabbitNode = request.getfixturevalue("rabbit")

    def memory_alarm(on: bool) -> None:  # a memory watermark it is always above, or back
        ctl = [str(Path(node.server).with_name("rabbitmqctl")), "-n", node.node]
        mark = "0.000001" if on else "0.4"
        run = partial(subprocess.run, env=node.env(), check=True, capture_output=True, timeout=60)
        run([*ctl, "set_vm_memory_high_watermark", mark])
        # the memory monitor raises (or clears) the alarm on its next check: wait for it, so
        # that a publish after this call meets the alarm as it would polymq's
        deadline = time.monotonic() + WAIT
        while True:
            alarms = run([*ctl, "eval", "rabbit_alarm:get_alarms()."], text=True).stdout
            if ("memory" in alarms) == on or time.monotonic() > deadline:
                break
            time.sleep(0.1)

    return Target("rabbitmq", node.port, memory_alarm)


@pytest.fixture
def connect(broker: Broker) -> Iterator[Callable[..., pika.BlockingConnection]]:
    """``connect(**params)``: a pika BlockingConnection, closed at the end of the test."""
    made: list[pika.BlockingConnection] = []

    def make(**params: Any) -> pika.BlockingConnection:
        conn = pika_connection(broker, **params)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        if conn.is_open:
            try:
                conn.close()
            except Exception:
                pass


@pytest.fixture
def channel(
    connect: Callable[..., pika.BlockingConnection],
) -> pika.adapters.blocking_connection.BlockingChannel:
    return connect().channel()


@pytest.fixture
async def aconn(broker: Broker) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    conn = await aio_pika.connect(broker.amqp_url(), timeout=10)
    try:
        yield conn
    finally:
        await conn.close()
