"""The fake cores of the client's failover and heartbeat tests (:mod:`.fakecores`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from polymq import inproc

from .fakecores import HOST, A, B, Cores


@pytest.fixture
def cores() -> Iterator[Cores]:
    made = Cores()
    for port in (A, B):
        inproc.serve(HOST, port, made.factory(port))
    yield made
    for port in (A, B):
        inproc.unserve(HOST, port)
