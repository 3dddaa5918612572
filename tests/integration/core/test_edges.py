"""Edges found by the HTTP frontend's tests: each once broke a connection or hung."""

from __future__ import annotations

import asyncio

import pytest

from polymq import BadRequest, Client
from polymq.errors import LocalProtocolError

from ...procs import PolymqProcess
from .helpers import connect, uid

MIB = 1024 * 1024


async def test_an_unencodable_request_fails_alone(client: Client) -> None:
    q = f"queue/{uid()}"
    with pytest.raises(LocalProtocolError):
        await asyncio.wait_for(client.publish(q, b"x", correlation_id="\ud800"), 5)
    assert (await client.publish(q, b"fine")).count == 1  # the connection is intact


@pytest.mark.timeout(60)
async def test_big_concurrent_publishes_are_split_into_frames(client: Client) -> None:
    q = f"queue/{uid()}"
    body = b"b" * (12 * MIB)  # 8 x 12 MiB would be one 96 MiB frame, over the 64 MiB limit
    results = await asyncio.gather(*(client.publish(q, body) for _ in range(8)))
    assert [r.count for r in results] == [1] * 8
    assert (await client.stats(q)).messages == 8


@pytest.mark.timeout(60)
async def test_a_pull_is_bounded_by_bytes_and_the_connection_survives(client: Client) -> None:
    q = f"queue/{uid()}"
    for i in range(5):
        await client.publish(q, bytes([i]) * (15 * MIB))
    got: list[int] = []
    while len(got) < 5:
        leases = await asyncio.wait_for(client.pull(q, 5), 20)
        assert 1 <= len(leases) < 5  # 75 MiB would not fit one frame: fewer, never a crash
        got += [lease.message.body[0] for lease in leases]
        await client.settle([lease.receipt for lease in leases])
    assert got == [0, 1, 2, 3, 4]


async def test_stats_on_an_illegal_pattern_is_a_bad_request(client: Client) -> None:
    with pytest.raises(BadRequest):
        await client.stats("topic/a#b")
    await client.ping()


async def test_an_ack_given_just_before_leaving_is_not_lost(client: Client) -> None:
    q = f"queue/{uid()}"
    await client.publish(q, b"once")
    async with await client.subscribe(q, ack_mode="client-individual") as sub:
        d = await sub.get(5)
        d.ack()  # fire-and-forget, then leave at once
    await asyncio.sleep(0.2)
    st = await client.stats(q)
    assert (st.messages, st.in_flight, st.acked) == (0, 0, 1)


async def test_a_closed_connections_waiting_pull_takes_nothing(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    gone = await connect(core.ports["core"])
    waiting = asyncio.ensure_future(gone.pull(q, 1, wait=30))
    await asyncio.sleep(0.2)  # the pull is waiting in the core
    await gone.close()
    with pytest.raises(Exception):  # noqa: B017 - whatever the closed client raises
        await waiting
    async with await connect(core.ports["core"]) as other:
        await asyncio.sleep(0.2)  # the core has seen the close
        await other.publish(q, b"for the living")
        leases = await other.pull(q, 1)
        assert [lease.message.body for lease in leases] == [b"for the living"]
