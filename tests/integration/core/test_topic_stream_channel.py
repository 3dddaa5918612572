"""Topics (patterns), streams (replay from an offset) and channels (two roles) through a real
core process and the real client."""

from __future__ import annotations

import asyncio
import time

import pytest

from polymq import BadRequest, Client, Message, Subscription
from polymq.events import Subscribe

from ...procs import PolymqProcess
from .helpers import bodies, collect, connect, eventually, nothing_more, uid

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def core(module_core: PolymqProcess) -> PolymqProcess:
    """One core for the module's tests: each uses names of its own, none stops it."""
    return module_core


# ---- topics ---------------------------------------------------------------------------------


async def _until_end(sub: Subscription) -> list[str]:
    """Topic names received before the end marker (a header), in order."""
    seen: list[str] = []
    while True:
        d = await sub.get(5)
        if d.message.headers.get("end") == "1":
            return seen
        seen.append(d.message.body.decode())


async def test_topic_patterns_star_hash_and_prefix(core: PolymqProcess) -> None:
    p = uid()
    port = core.ports["core"]
    patterns = {
        f"{p}.news.*": ["news.sport", "news.spain", "news.sp", "news.politics"],
        f"{p}.news.#": [
            "news", "news.sport", "news.spain", "news.sport.football", "news.sp",
            "news.politics",
        ],
        f"{p}.news.sp*": ["news.sport", "news.spain", "news.sport.football", "news.sp"],
        f"{p}.*.sport": ["news.sport", "weather.sport"],
        f"{p}.#": [
            "news", "news.sport", "news.spain", "news.sport.football", "news.sp",
            "news.politics", "newsy", "weather.today", "weather.sport",
        ],
        f"{p}.news.sport": ["news.sport"],
    }  # fmt: skip
    topics = [
        "news", "news.sport", "news.spain", "news.sport.football", "news.sp", "news.politics",
        "newsy", "weather.today", "weather.sport",
    ]  # fmt: skip
    async with await connect(port) as sc, await connect(port) as pub:
        subs = {pat: await sc.subscribe(f"topic/{pat}") for pat in patterns}
        for t in topics:
            r = await pub.publish(f"topic/{p}.{t}", t)
            want = sum(t in v for v in patterns.values())
            assert r.subscribers == want, (t, r)
        # an end marker every pattern matches; per subscription, order is publish order
        await pub.publish(f"topic/{p}.news.sport", "end", headers={"end": "1"})
        for pat, want in patterns.items():
            assert await _until_end(subs[pat]) == want, pat
            await nothing_more(subs[pat], 0.05)
        st = await pub.stats(f"topic/{p}.news.sport")
        assert st.subscribers == 6  # every pattern matches news.sport
        assert (await pub.stats(f"topic/{p}.news.#")).subscribers == 1


async def test_topic_messages_are_transient_and_unsubscribe_stops_delivery(
    client: Client,
) -> None:
    t = f"topic/{uid()}"
    r = await client.publish(t, "nobody-listens")
    assert r.subscribers == 0
    sub = await client.subscribe(t)
    await nothing_more(sub, 0.2)  # what was published before is gone
    await client.publish(t, "live")
    assert bodies(await collect(sub, 1)) == [b"live"]
    await sub.unsubscribe()
    assert (await client.publish(t, "after")).subscribers == 0


async def test_thousands_of_subscriptions_at_once_on_two_connections(
    core: PolymqProcess,
) -> None:
    """3,000 subscribe requests sent together on each of two connections (the same sids on
    both): every one answered, in a frame or several, each topic counting its subscribers
    and delivering to them; a queue subscription among them gets its messages; unsubscribing
    and closing a connection release them, the other connection's staying."""
    p, n = uid(), 3000
    q = f"queue/{p}.q"
    port = core.ports["core"]
    a, b, pub = await connect(port), await connect(port), await connect(port)
    try:
        await pub.publish(q, [Message(f"m{i}".encode()) for i in range(5)])
        subs_a = await asyncio.gather(
            *(a.subscribe(f"topic/{p}.t{i}") for i in range(n)), a.subscribe(q)
        )
        subs_b = await asyncio.gather(*(b.subscribe(f"topic/{p}.t{i}") for i in range(n)))
        assert bodies(await collect(subs_a[-1], 5)) == [f"m{i}".encode() for i in range(5)]
        for i in (0, 1023, 1024, 2999):
            assert (await pub.stats(f"topic/{p}.t{i}")).subscribers == 2
            r = await pub.publish(f"topic/{p}.t{i}", f"to {i}")
            assert r.subscribers == 2
            assert bodies(await collect(subs_a[i], 1)) == [f"to {i}".encode()]
            assert bodies(await collect(subs_b[i], 1)) == [f"to {i}".encode()]
        await asyncio.gather(*(s.unsubscribe() for s in subs_a[: n // 2]))
        for i in (0, n // 2 - 1):
            assert (await pub.stats(f"topic/{p}.t{i}")).subscribers == 1
            assert (await pub.publish(f"topic/{p}.t{i}", "b only")).subscribers == 1
            assert bodies(await collect(subs_b[i], 1)) == [b"b only"]
        assert (await pub.stats(f"topic/{p}.t{n - 1}")).subscribers == 2
        await b.close()
        await eventually(lambda: _subscribers(pub, f"topic/{p}.t{n - 1}", 1), within=10)
        assert (await pub.stats(f"topic/{p}.t0")).subscribers == 0
        assert (await pub.stats(q)).subscribers == 1
    finally:
        for c in (a, b, pub):
            await c.close()


async def _subscribers(client: Client, destination: str, want: int) -> bool:
    return (await client.stats(destination)).subscribers == want


async def test_bad_topic_pattern_is_refused(client: Client) -> None:
    for bad in ("topic/a.b#", "topic/a.*b", "topic/a.b*.c", "topic/#x"):
        with pytest.raises(BadRequest):
            await client.subscribe(bad)
    with pytest.raises(BadRequest):
        await client.publish("topic/a.*", "wildcards are for subscribing")
    await client.ping()


# ---- streams --------------------------------------------------------------------------------


async def test_stream_replay_from_every_kind_of_offset(core: PolymqProcess) -> None:
    s = f"stream/{uid()}"
    port = core.ports["core"]
    async with await connect(port) as w, await connect(port) as r:
        r1 = await w.publish(s, [Message(f"a{i}".encode()) for i in range(5)])
        assert r1.seqs == [1, 2, 3, 4, 5]
        await asyncio.sleep(0.05)
        mark = time.time()  # the core runs on this host's clock
        await asyncio.sleep(0.05)
        await w.publish(s, [Message(f"b{i}".encode()) for i in range(3)])
        old = [f"a{i}".encode() for i in range(5)] + [f"b{i}".encode() for i in range(3)]

        first = await r.subscribe(s, offset="first")
        last = await r.subscribe(s, offset="last")
        nxt = await r.subscribe(s, offset="next")
        by_seq = await r.subscribe(s, offset=4)
        by_seq_text = await r.subscribe(s, offset="7")
        by_time = await r.stream(s.partition("/")[2]).read(mark)
        before_all = await r.subscribe(s, offset={"timestamp": mark - 3600})

        got = await collect(first, 8)
        assert bodies(got) == old
        assert [d.message.seq for d in got] == list(range(1, 9))
        assert bodies(await collect(last, 1)) == [b"b2"]
        assert bodies(await collect(by_seq, 5)) == old[3:]
        assert bodies(await collect(by_seq_text, 2)) == old[6:]
        assert bodies(await collect(by_time, 3)) == [b"b0", b"b1", b"b2"]
        assert bodies(await collect(before_all, 8)) == old
        await nothing_more(nxt, 0.2)

        await w.publish(s, "c0")  # every reader, whatever its start, then sees the new entry
        for sub in (first, last, nxt, by_seq, by_seq_text, by_time, before_all):
            (d,) = await collect(sub, 1)
            assert (d.message.body, d.message.seq) == (b"c0", 9)
            await nothing_more(sub, 0.05)


async def test_a_stream_subscribe_answers_the_seq_it_starts_at(client: Client) -> None:
    """The answer to a stream's subscribe names the seq it reads first (``seq``), what a
    client failing over before any delivery goes on from; a queue's names none."""
    s = f"stream/{uid()}"
    await client.publish(s, [Message(f"a{i}".encode()) for i in range(5)])

    async def answer(destination: str, **options: object) -> dict[str, object]:
        sid = next(client._sids)  # (a raw subscribe: its deliveries go nowhere)
        r: dict[str, object] = await client._call(
            Subscribe(client._rid(), sid, destination, options)
        )
        return r

    assert (await answer(s, offset="first"))["seq"] == 1
    assert (await answer(s, offset="last"))["seq"] == 5
    assert (await answer(s, offset="next"))["seq"] == 6
    assert (await answer(s, offset=3))["seq"] == 3
    assert (await answer(s, offset={"timestamp": time.time() + 3600}))["seq"] == 6
    assert "seq" not in await answer(f"queue/{uid()}")


async def test_stream_is_not_consumed_by_reading(client: Client) -> None:
    s = f"stream/{uid()}"
    await client.publish(s, [Message(str(i).encode()) for i in range(3)])
    a = await client.subscribe(s, offset="first")
    assert bodies(await collect(a, 3)) == [b"0", b"1", b"2"]
    b = await client.subscribe(s, offset="first")  # a second reader reads it all again
    assert bodies(await collect(b, 3)) == [b"0", b"1", b"2"]
    st = await client.stats(s)
    assert (st.messages, st.first_seq, st.last_seq, st.subscribers) == (3, 1, 3, 2)


async def test_stream_publishes_in_flight_together_get_their_own_seqs(client: Client) -> None:
    """Persistent publishes are appended once written; those in flight at once still get
    distinct, increasing seqs, and every entry is kept (a replicated core appended them
    late before, and each one in flight took the same number)."""
    s = f"stream/{uid()}"
    await client.declare(s, durable=True)
    receipts = await asyncio.gather(
        *(client.publish(s, [Message(b"%d" % i, persistent=True)]) for i in range(50))
    )
    assert sorted(r.seqs[0] for r in receipts) == list(range(1, 51))
    reader = await client.subscribe(s, offset="first")
    got = await collect(reader, 50)
    assert [d.message.body for d in got] == [b"%d" % i for i in range(50)]
    assert (await client.stats(s)).messages == 50


async def test_stream_sequence_survives_eviction_from_memory(client: Client) -> None:
    """An emptied stream leaves memory after ~0.5 s idle; its numbering must go on."""
    stream = client.stream(uid("evict"))
    for i in range(3):
        await stream.append(f"e{i}")
    await client.purge(stream.destination)
    await asyncio.sleep(1.5)  # two sweeps: the empty, unread stream is evicted
    receipt = await stream.append("after")
    assert receipt.seqs == [4]
    reader = await stream.read(4)
    assert (await reader.get(5)).message.body == b"after"


async def test_stream_offset_is_refused_on_a_queue(client: Client) -> None:
    with pytest.raises(BadRequest):
        await client.subscribe(f"queue/{uid()}", offset="first")
    with pytest.raises(BadRequest):
        await client.subscribe(f"stream/{uid()}", offset="yesterday")
    await client.ping()


# ---- channels -------------------------------------------------------------------------------


async def test_channel_roles_each_receive_what_the_other_sends(core: PolymqProcess) -> None:
    name = uid()
    port = core.ports["core"]
    async with await connect(port) as cs, await connect(port) as cc:
        server = cs.channel(name, "server")
        client = cc.channel(name, "client")
        s_in = await server.receive()
        c_in = await client.receive()
        await client.send("request-1")
        await client.send("request-2")
        await server.send("reply-1")
        assert bodies(await collect(s_in, 2)) == [b"request-1", b"request-2"]
        assert bodies(await collect(c_in, 1)) == [b"reply-1"]
        await nothing_more(s_in, 0.2)  # nobody receives what it sent itself
        await nothing_more(c_in, 0.2)
        st = await cs.stats(f"channel/{name}")
        assert st.server.subscribers == 1 and st.client.subscribers == 1


async def test_channel_keeps_messages_until_the_other_role_arrives(core: PolymqProcess) -> None:
    name = uid()
    port = core.ports["core"]
    async with await connect(port) as cs, await connect(port) as cc:
        await cs.channel(name, "server").send("hello-early-client")
        c_in = await cc.channel(name, "client").receive()
        assert bodies(await collect(c_in, 1)) == [b"hello-early-client"]
        with pytest.raises(BadRequest):
            await cc.publish(f"channel/{name}", "x", role="observer")
