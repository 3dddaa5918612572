"""Idempotent batches and key listing through a real core process and the real client."""

from __future__ import annotations

import asyncio

import pytest

from polymq import BadRequest, Client, Message, QueueFull

from ...procs import PolymqProcess
from .helpers import collect, connect, nothing_more, uid

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def core(module_core: PolymqProcess) -> PolymqProcess:
    """One core for the module's tests: each uses destinations of its own (a batch id is one
    destination's); a test that kills its core takes ``fresh_core``."""
    return module_core


def batch(n: int, tag: str = "m") -> list[Message]:
    return [Message(f"{tag}{i}".encode(), persistent=True) for i in range(n)]


@pytest.mark.parametrize("kind", ["queue", "stream"])
async def test_a_repeated_batch_id_publishes_once_and_answers_like_the_first(
    client: Client, kind: str
) -> None:
    dest = f"{kind}/{uid()}"
    if kind == "queue":
        await client.declare(dest, durable=True)
    first = await client.publish(dest, batch(100), batch_id="b-1")
    again = await client.publish(dest, batch(100), batch_id="b-1")
    assert first.duplicate is False and again.duplicate is True
    assert again.ids == first.ids and again.seqs == first.seqs
    assert (await client.stats(dest)).messages == 100
    other = await client.publish(dest, batch(100), batch_id="b-2")
    assert other.duplicate is False and other.ids != first.ids
    assert (await client.stats(dest)).messages == 200


async def test_the_same_batch_id_on_another_destination_is_another_batch(client: Client) -> None:
    a, b = f"queue/{uid()}", f"queue/{uid()}"
    await client.publish(a, batch(3), batch_id="same")
    r = await client.publish(b, batch(3), batch_id="same")
    assert r.duplicate is False
    assert (await client.stats(b)).messages == 3


async def test_concurrent_repeats_share_one_publish(core: PolymqProcess) -> None:
    dest = f"stream/{uid()}"
    clients = [await connect(core.ports["core"]) for _ in range(3)]
    try:
        answers = await asyncio.gather(
            *(c.publish(dest, batch(50), batch_id="race") for c in clients for _ in range(3))
        )
        assert sum(not a.duplicate for a in answers) == 1
        assert len({tuple(a.ids) for a in answers}) == 1
        assert (await clients[0].stats(dest)).messages == 50
    finally:
        for c in clients:
            await c.close()


async def test_a_refused_batch_is_not_remembered_so_its_retry_publishes(client: Client) -> None:
    dest = f"queue/{uid()}"
    await client.declare(dest, max_length=5, overflow="reject")
    with pytest.raises(QueueFull):
        await client.publish(dest, batch(10), batch_id="too-big")
    assert (await client.stats(dest)).messages == 0  # all or nothing
    await client.purge(dest)
    r = await client.publish(dest, batch(5), batch_id="too-big")
    assert r.duplicate is False and r.count == 5


async def test_a_batch_id_expires_after_its_ttl(client: Client) -> None:
    dest = f"queue/{uid()}"
    await client.publish(dest, batch(2), batch_id="short", batch_ttl=0.3)
    assert (await client.publish(dest, batch(2), batch_id="short", batch_ttl=0.3)).duplicate
    await asyncio.sleep(0.5)
    r = await client.publish(dest, batch(2), batch_id="short", batch_ttl=0.3)
    assert r.duplicate is False
    assert (await client.stats(dest)).messages == 4


async def test_topic_batches_are_deduplicated_too(client: Client) -> None:
    name = uid()
    sub = await client.subscribe(f"topic/{name}")
    await client.publish(f"topic/{name}", batch(2), batch_id="t")
    r = await client.publish(f"topic/{name}", batch(2), batch_id="t")
    assert r.duplicate is True and r.subscribers == 1
    got = [await sub.get(5) for _ in range(2)]
    assert [d.message.body for d in got] == [b"m0", b"m1"]
    with pytest.raises(TimeoutError):
        await sub.get(0.3)


@pytest.mark.parametrize("kind", ["queue", "stream", "channel"])
async def test_a_batch_of_persistent_messages_is_remembered_across_kill_9(
    fresh_core: PolymqProcess, kind: str
) -> None:
    """The batch id is kept with the messages: a retry after the core died (its answer
    lost, say) is still a duplicate, answered with the first publish's ids and seqs."""
    core = fresh_core
    dest = f"{kind}/{uid()}"
    role = "client" if kind == "channel" else None
    async with await connect(core.ports["core"]) as c:
        if kind == "queue":
            await c.declare(dest, durable=True)
        first = await c.publish(dest, batch(300), batch_id="kept", role=role)
        other = await c.publish(dest, batch(2, "o"), batch_id="other", role=role)
    core.kill()
    core.start()
    async with await connect(core.ports["core"]) as c:
        again = await c.publish(dest, batch(300), batch_id="kept", role=role)
        assert again.duplicate is True
        assert (again.ids, again.seqs, again.count) == (
            first.ids,
            first.seqs,
            300,
        )
        assert (await c.publish(dest, batch(2, "o"), batch_id="other", role=role)).duplicate
        assert other.seqs == [301, 302]
        fresh = await c.publish(dest, batch(1), batch_id="new", role=role)
        assert fresh.duplicate is False and fresh.seqs == [303]
        if kind == "channel":
            sub = await c.subscribe(dest, role="server")
            got = await collect(sub, 303)
            await nothing_more(sub)
            assert len({d.message.id for d in got}) == 303
        else:
            assert (await c.stats(dest)).messages == 303


async def test_what_a_restart_forgets_transient_batches_and_expired_ones(
    fresh_core: PolymqProcess,
) -> None:
    """A batch of transient messages is remembered as long as they are: in memory. A stored
    batch whose window has passed publishes again, after a restart as before one."""
    core = fresh_core
    transient, expiring = f"queue/{uid()}", f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.declare(expiring, durable=True)
        await c.publish(transient, [Message(b"t")], batch_id="t")
        assert (await c.publish(transient, [Message(b"t")], batch_id="t")).duplicate
        await c.publish(expiring, batch(2), batch_id="e", batch_ttl=1.0)
    core.kill()
    await asyncio.sleep(1.2)
    core.start()
    async with await connect(core.ports["core"]) as c:
        assert (await c.publish(transient, [Message(b"t")], batch_id="t")).duplicate is False
        assert (await c.publish(expiring, batch(2), batch_id="e")).duplicate is False
        assert (await c.stats(expiring)).messages == 4


@pytest.mark.parametrize(
    "batch_id, ttl", [("", None), ("x" * 257, None), (7, None), ("ok", 0), ("ok", -1), ("ok", "1")]
)
async def test_bad_batch_ids_and_ttls_are_refused(
    client: Client, batch_id: object, ttl: object
) -> None:
    with pytest.raises(BadRequest):
        await client.publish(f"queue/{uid()}", batch(1), batch_id=batch_id, batch_ttl=ttl)  # type: ignore[arg-type]


async def test_kv_list_returns_the_keys_under_a_prefix_over_every_shard(client: Client) -> None:
    prefix = f"{uid()}/"
    keys = [f"{prefix}k{i:03d}" for i in range(40)]
    for k in keys:
        await client.kv_put(k, b"v")
    await client.kv_put(f"{prefix[:-1]}0", b"not under the prefix")
    assert await client.kv_list(prefix) == keys
    assert await client.kv_list(prefix, limit=5) == keys[:5]
    assert await client.kv_list(f"{prefix}k01") == keys[10:20]
    assert await client.kv_list(f"{uid()}/") == []
    with pytest.raises(BadRequest):
        await client.kv_list(prefix, limit=0)
