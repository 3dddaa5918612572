"""Durable queues page to the store (issue 17, point 1): past a window of ready messages
(here 100), a queue's messages stay in the store only and are read back in order as
consumers advance; a restart reads one window and counts the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from polymq import Client, Message

from ...procs import PolymqProcess
from .helpers import collect, connect, nothing_more, uid

pytestmark = pytest.mark.timeout(120)

WINDOW = 100


def paging_core(tmp_path: Path) -> PolymqProcess:
    return PolymqProcess("core", tmp_path / "core", env={"POLYMQ_QUEUE_WINDOW_MESSAGES": "100"})


async def backlog(c: Client, q: str, n: int, *, persistent: bool = True, tag: str = "m") -> None:
    for start in range(0, n, 100):
        await c.publish(
            q, [Message(b"%s%05d" % (tag.encode(), i), persistent=persistent)
                for i in range(start, min(start + 100, n))]
        )  # fmt: skip


def expected(n: int, tag: str = "m") -> list[bytes]:
    return [b"%s%05d" % (tag.encode(), i) for i in range(n)]


async def test_a_backlog_past_the_window_is_paged_and_read_back_in_order(
    tmp_path: Path,
) -> None:
    q = f"queue/{uid()}"
    with paging_core(tmp_path) as core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(q, durable=True)
            await backlog(c, q, 1000)
            # transient ones that come while it pages are kept (in the store) and in order
            await c.publish(q, [Message(b"transient", persistent=False)])
            st = await c.stats(q)
            assert (st.messages, st.paged) == (1001, 901)
            assert st.bytes == 1000 * 6 + len(b"transient")
            sub = await c.subscribe(q, ack_mode="client-individual", prefetch=30)
            got = []
            for _ in range(1001):
                d = await sub.get(10)
                got.append(d.message)
                d.ack()
            await nothing_more(sub)
            assert [m.body for m in got] == [*expected(1000), b"transient"]
            assert got[0].persistent and not got[-1].persistent  # each as it was published
            assert (await c.stats(q)).messages == 0


async def test_a_transient_message_that_is_paged_stays_transient_and_leaves_no_row(
    tmp_path: Path,
) -> None:
    """A transient message that comes while its queue pages is written to the store (the
    paged messages are exactly the stored ones), yet delivered flagged transient, before a
    restart and after it; each leaves the store once acknowledged or once it is returned
    past max-deliveries (dead-lettered, still transient), so a restart brings back nothing."""
    q, dlq = f"queue/{uid()}", f"queue/{uid('dl')}"
    core = paging_core(tmp_path)
    with core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(dlq, durable=True)
            await c.declare(q, durable=True, max_deliveries=1, dead_letter=dlq)
            await c.publish(q, [Message(b"in-window", persistent=False)])
            await backlog(c, q, 200)
            await c.publish(q, [Message(b"paged-a"), Message(b"paged-b")])  # transient
            st = await c.stats(q)
            assert (st.messages, st.paged) == (203, 103)
        assert core.stop() == 0, core.log()
        core.start()
        async with await connect(core.ports["core"]) as c:
            # the one in the window was only in memory; the paged ones were stored
            assert (await c.stats(q)).messages == 202
            sub = await c.subscribe(q, ack_mode="client-individual", prefetch=10)
            got = []
            for _ in range(202):
                d = await sub.get(10)
                got.append(d)
                if d.message.body != b"paged-b":
                    d.ack()
            await nothing_more(sub)
            assert [d.message.body for d in got] == [*expected(200), b"paged-a", b"paged-b"]
            assert all(d.message.persistent for d in got[:200])
            assert not got[200].message.persistent and not got[201].message.persistent
            got[201].nack(requeue=True)  # past max-deliveries 1: dead-lettered
            dead = await c.subscribe(dlq, prefetch=1)
            (d,) = await collect(dead, 1)
            assert d.message.body == b"paged-b" and not d.message.persistent
            await nothing_more(dead)
            assert (await c.stats(q)).messages == 0
        assert core.stop() == 0, core.log()
        core.start()
        async with await connect(core.ports["core"]) as c:
            assert (await c.stats(q)).messages == 0
            assert (await c.stats(dlq)).messages == 0  # auto-acked, and transient anyway


async def test_paged_messages_are_redelivered_and_dead_lettered_as_others(
    tmp_path: Path,
) -> None:
    q, dlq = f"queue/{uid()}", f"queue/{uid('dl')}"
    with paging_core(tmp_path) as core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(dlq, durable=True)
            await c.declare(q, durable=True, max_deliveries=2, dead_letter=dlq)
            await backlog(c, q, 300)
            sub = await c.subscribe(q, ack_mode="client-individual", prefetch=1)
            seen: list[bytes] = []
            while len(seen) < 250:  # past the first window: these were paged
                d = await sub.get(10)
                seen.append(d.message.body)
                d.ack()
            d = await sub.get(10)
            assert d.message.body == b"m00250" and not d.message.redelivered
            d.nack(requeue=True)  # back first, before anything published after it
            again = await sub.get(10)
            assert again.message.body == b"m00250" and again.message.redelivered
            again.nack(requeue=True)  # a second delivery failed: dead-lettered
            rest = []
            for _ in range(49):
                d = await sub.get(10)
                rest.append(d.message.body)
                d.ack()
            assert rest == expected(300)[251:]
            dead = await c.pull(dlq, max=5, wait=5, visibility=30)
            assert [lease.message.body for lease in dead] == [b"m00250"]


async def test_a_restart_reads_one_window_and_counts_the_rest(tmp_path: Path) -> None:
    q = f"queue/{uid()}"
    core = paging_core(tmp_path)
    with core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(q, durable=True)
            await backlog(c, q, 2000)
        assert core.stop() == 0, core.log()
        core.start()
        async with await connect(core.ports["core"]) as c:
            st = await c.stats(q)
            assert (st.messages, st.paged) == (2000, 2000 - WINDOW)
            sub = await c.subscribe(q, prefetch=50)  # auto ack
            got = await collect(sub, 2000)
            assert [d.message.body for d in got] == expected(2000)
            await nothing_more(sub)
        assert core.stop() == 0, core.log()
        core.start()
        async with await connect(core.ports["core"]) as c:
            assert (await c.stats(q)).messages == 0


async def test_a_purge_drops_the_paged_messages_too(tmp_path: Path) -> None:
    q = f"queue/{uid()}"
    core = paging_core(tmp_path)
    with core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(q, durable=True)
            await backlog(c, q, 500)
            assert await c.purge(q) == 500
            assert (await c.stats(q)).messages == 0
            await backlog(c, q, 150, tag="n")
            sub = await c.subscribe(q, prefetch=20)
            got = await collect(sub, 150)
            assert [d.message.body for d in got] == expected(150, "n")
            await nothing_more(sub)
        assert core.stop() == 0, core.log()
        core.start()
        async with await connect(core.ports["core"]) as c:
            assert (await c.stats(q)).messages == 0


async def test_queues_that_do_not_page_keep_everything(tmp_path: Path) -> None:
    """A queue declared not durable (or drop-head) keeps its messages in memory: nothing of
    it is in the store to read back (before, one declared over the default options paged
    and lost what it paged)."""
    loose, head = f"queue/{uid()}", f"queue/{uid()}"
    with paging_core(tmp_path) as core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(loose, durable=False)
            await c.declare(head, durable=True, max_length=1000, overflow="drop-oldest")
            for q in (loose, head):
                await backlog(c, q, 300, persistent=False)
                st = await c.stats(q)
                assert (st.messages, st.paged) == (300, 0)
                sub = await c.subscribe(q, prefetch=50)
                got = await collect(sub, 300)
                assert [d.message.body for d in got] == expected(300)
                await nothing_more(sub)


@pytest.mark.parametrize("persistent", [False, True])
async def test_a_publisher_that_leaves_before_its_paged_messages_are_written_loses_none(
    tmp_path: Path, persistent: bool
) -> None:
    """A publisher that fires batches and goes at once: those the queue writes to the store
    (paged transient ones, here behind a backlog that a consumer under slow policy "drop"
    leaves in the queue, or persistent ones) are still being written when its connection
    closes. Closing cancelled the wait for their answers, and the cancel reached the write's
    future: the queue took it for a failed write and dropped the messages (in the store,
    delivered only after a restart). Found by the bench's native_transient_queue."""
    q = f"queue/{uid()}"
    n, batch = 20_000, 1000
    with paging_core(tmp_path) as core:
        port = core.ports["core"]
        producer = await connect(port)
        for start in range(0, n, batch):
            producer.publish_nowait(
                q, [Message(b"m%05d" % i, persistent=persistent)
                    for i in range(start, start + batch)]
            )  # fmt: skip
            await producer.drain()
        await producer.ping()  # answered at once: the writes may still be under way
        await producer.close()
        async with await connect(port) as c:
            sub = await c.subscribe(q, prefetch=500)  # auto ack
            got = await collect(sub, n, within=15)
            assert [d.message.body for d in got] == expected(n)
            await nothing_more(sub)
            assert (await c.stats(q)).published == n
