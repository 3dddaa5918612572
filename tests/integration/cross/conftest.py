"""Fixtures of the cross-protocol tests that run against ``polymq run`` with the AMQP
frontend: one broker per module, a pika channel and stomp.py clients per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pika.adapters.blocking_connection import BlockingChannel

from ..amqp.helpers import Broker, pika_connection, serving_broker
from ..stomp.helpers import Clients, clients


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    workdir: Path = tmp_path_factory.mktemp("cross-amqp")
    with serving_broker(workdir) as b:
        yield b


@pytest.fixture
def channel(broker: Broker) -> Iterator[BlockingChannel]:
    conn = pika_connection(broker)
    yield conn.channel()
    if conn.is_open:
        conn.close()


@pytest.fixture
def stomp_client(broker: Broker) -> Iterator[Clients]:
    """stomp.py clients over TCP (``test_http_stomp.py`` has its own, over both transports)."""
    with clients(broker.run, "tcp") as make:
        yield make
