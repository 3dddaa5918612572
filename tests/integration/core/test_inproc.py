"""A core served in-process (as ``polymq run`` does): clients in the same process reach it
over a polymq.inproc pipe, every other client over its TCP port, and both see one broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from polymq import Client, inproc
from polymq.errors import ConnectionClosed
from polymq_core.config import CoreSettings
from polymq_core.service import CoreService

from .helpers import uid

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[CoreService]:
    settings = CoreSettings(core_port=0, admin_port=0, data_dir=tmp_path / "data", shards=2)
    service = CoreService(settings, in_process=True)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def test_a_client_in_the_process_uses_the_pipe_and_shares_the_broker(
    core: CoreService,
) -> None:
    port = core.ports["core"]
    assert inproc.served("127.0.0.1", port)
    q = f"queue/{uid()}"
    async with (
        await Client.connect("127.0.0.1", port) as piped,
        await Client.connect("localhost", port) as tcp,  # another address: a socket
    ):
        assert isinstance(piped._transport, inproc.PipeEnd)
        assert not isinstance(tcp._transport, inproc.PipeEnd)
        assert tcp._transport is not None and tcp._transport.get_extra_info("socket")
        sub = await tcp.subscribe(q, ack_mode="client-individual", prefetch=100)
        await asyncio.gather(*(piped.publish(q, f"m{i}", priority=i % 3) for i in range(300)))
        got = []
        while len(got) < 300:
            d = await sub.get(5)
            got.append(d.message.body)
            d.ack()
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(300))
        # and the other way round, with a big body (several pipe chunks in one frame)
        big = bytes(range(256)) * (3 * inproc.CHUNK // 256)
        psub = await piped.subscribe(q, ack_mode="client-individual", prefetch=10)
        await sub.unsubscribe()
        await tcp.publish(q, big)
        d = await psub.get(5)
        assert d.message.body == big
        d.ack()
        await piped.ping()
        stats = await piped.stats(q)  # acks sent before the ping were applied before it
        assert (stats.messages, stats.in_flight, stats.acked) == (0, 0, 301)


async def test_stopping_the_core_ends_piped_clients_with_a_reason(tmp_path: Path) -> None:
    settings = CoreSettings(core_port=0, admin_port=0, data_dir=tmp_path / "data", shards=1)
    service = CoreService(settings, in_process=True)
    await service.start()
    port = service.ports["core"]
    client = await Client.connect("127.0.0.1", port)
    sub = await client.subscribe(f"queue/{uid()}")
    await service.stop()
    assert not inproc.served("127.0.0.1", port)
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(sub.get(5), 10)
    assert client.closed
    with pytest.raises(ConnectionClosed):  # nothing is served here any more, nor on TCP
        await Client.connect("127.0.0.1", port, timeout=2)


async def test_a_core_not_served_in_process_is_reached_over_tcp(tmp_path: Path) -> None:
    settings = CoreSettings(core_port=0, admin_port=0, data_dir=tmp_path / "data", shards=1)
    service = CoreService(settings)
    await service.start()
    try:
        assert not inproc.served("127.0.0.1", service.ports["core"])
        async with await Client.connect("127.0.0.1", service.ports["core"]) as client:
            assert not isinstance(client._transport, inproc.PipeEnd)
            await client.ping()
    finally:
        await service.stop()
