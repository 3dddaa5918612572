"""A full disk under a single core (issue 17, point 5), on a small tmpfs data directory: a
publish whose write failed is answered ``unavailable`` and its messages are never
delivered; an ack whose removal could not be written is not answered done; a restart on the
full disk starts and serves what was written; once space returns the core writes again by
itself, and the removals it could not write then are written without a restart.

The disk alarm (``POLYMQ_DISK_FREE_LIMIT``) is set to 0 here: it would hold the publishers
back before the disk filled (tests/integration/cross/test_alarms.py shows that), and this
is what happens when something else fills the disk faster than the alarm can act."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from polymq import Client, Message, Unavailable

from ...procs import PolymqProcess
from .helpers import collect, connect, eventually, nothing_more, uid

pytestmark = pytest.mark.timeout(180)

DISK = 4 * 1024 * 1024  # bytes of tmpfs
SPARE = 1024 * 1024  # bytes of a file taken out to give space back
BODY = 4000  # bytes of a message body


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    """Take every byte left on the disk (into ``path``, made while there was room)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass  # full
    finally:
        os.close(fd)


async def publish_until_full(c: Client, dest: str) -> tuple[list[bytes], list[int], list[str]]:
    """Persistent messages one by one until well past a full disk: the bodies written,
    their seqs, the failures' texts."""
    written: list[bytes] = []
    seqs: list[int] = []
    failures: list[str] = []
    for i in range(DISK // BODY + 200):
        body = b"%06d" % i + b"x" * BODY
        try:
            seqs += (await c.publish(dest, [Message(body, persistent=True)])).seqs
        except Unavailable as exc:
            failures.append(exc.message)
        else:
            written.append(body)
    return written, seqs, failures


async def unavailable_errors(core: PolymqProcess) -> float:
    """The core's ``polymq_request_errors_total{code="unavailable"}``."""
    async with aiohttp.ClientSession() as http, http.get(f"{core.url('admin')}/metrics") as r:
        text = await r.text()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "polymq_request_errors_total" and s.labels.get("code") == "unavailable"
    )


def core_on(mnt: Path, workdir: Path) -> PolymqProcess:
    return PolymqProcess(
        "core", workdir, "--data-dir", str(mnt / "data"), env={"POLYMQ_DISK_FREE_LIMIT": "0"}
    )


async def test_a_full_disk_fails_writes_cleanly_and_the_core_recovers(
    small_disk: Path, tmp_path: Path
) -> None:
    (small_disk / "spare").write_bytes(b"\0" * SPARE)
    for name in ("filler", "filler2"):
        (small_disk / name).touch()
    core = core_on(small_disk, tmp_path / "core")
    q = f"queue/{uid()}"
    with core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(q, durable=True)
            written, _, failures = await publish_until_full(c, q)
            assert written and len(failures) > 100, (len(written), failures[:1])
            assert all("full" in f for f in failures), failures[:3]
            # nothing that failed is in the queue, or ever delivered
            assert (await c.stats(q)).messages == len(written)
            sub = await c.subscribe(q, ack_mode="client-individual", prefetch=len(written) + 10)
            got = await collect(sub, len(written))
            await nothing_more(sub)
            assert [d.message.body for d in got] == written
            # an ack that cannot be written is answered unavailable, not done
            with pytest.raises(Unavailable, match="not written"):
                await sub.ack_many([got[0].tag])
            # the others are acked without waiting for an answer (as AMQP's basic.ack)
            for d in got[1:11]:
                d.ack()
            await c.ping()
        assert core.stop() == 0, core.log()
        assert "commits still fail" not in core.log()  # (logged once a minute at most)
        assert core.log().count("Traceback") <= 4  # the first failure of each shard's run

        # a restart on the full disk starts, and serves what was written (the acks were not)
        fill(small_disk / "filler")
        core.start()
        async with await connect(core.ports["core"]) as c:
            assert (await c.stats(q)).messages == len(written)
            sub = await c.subscribe(q, ack_mode="client-individual", prefetch=50)
            got = await collect(sub, 20)
            assert [d.message.body for d in got] == written[:20]
            fill(small_disk / "filler2")  # (what the restart's checkpoint freed)
            for d in got[:10]:
                d.ack()  # their removals fail now, and are tried again every second
            with pytest.raises(Unavailable, match="full"):
                await c.publish(q, [Message(b"x" * BODY, persistent=True)])
            # fire and forget: nobody to answer, so the operator is told, counted and logged
            before = await unavailable_errors(core)
            for _ in range(3):
                c.publish_nowait(q, [Message(b"y" * BODY, persistent=True)])
            await eventually(lambda: "a request without a reply failed" in core.log())

            async def counted() -> bool:
                return await unavailable_errors(core) >= before + 3

            await eventually(counted, within=10)
            assert core.log().count("a request without a reply failed") == 1

            # space comes back: the removals go through by themselves, then publishes
            for name in ("spare", "filler", "filler2"):
                os.unlink(small_disk / name)
            await eventually(lambda: "writes succeed again" in core.log(), within=10)
            await c.publish(q, [Message(b"after", persistent=True)])
            assert await sub.ack_many([d.tag for d in got[10:20]]) == 10
        assert core.stop() == 0, core.log()

        core.start()
        async with await connect(core.ports["core"]) as c:
            # 20 acked after the restart, the last one published after space came back
            assert (await c.stats(q)).messages == len(written) - 20 + 1
            sub = await c.subscribe(q, prefetch=len(written))
            got = await collect(sub, len(written) - 20 + 1)
            assert [d.message.body for d in got] == [*written[20:], b"after"]


async def test_a_stream_publish_that_failed_leaves_a_gap_readers_skip(
    small_disk: Path, tmp_path: Path
) -> None:
    """A stream's numbers are given when a publish comes; one whose write fails is never
    read, and the numbers go on after it, in memory and after a restart."""
    (small_disk / "spare").write_bytes(b"\0" * SPARE)
    core = core_on(small_disk, tmp_path / "core")
    s = f"stream/{uid()}"
    with core:
        async with await connect(core.ports["core"]) as c:
            await c.declare(s, durable=True)
            written, seqs, failures = await publish_until_full(c, s)
            assert len(failures) > 100
            os.unlink(small_disk / "spare")
            after = await c.publish(s, [Message(b"after", persistent=True)])
            assert after.seqs[0] > seqs[-1] + 1  # the failed ones' numbers are not reused
            assert (await c.stats(s)).messages == len(written) + 1
            reader = await c.subscribe(s, offset="first")
            got = await collect(reader, len(written) + 1)
            await nothing_more(reader)
            assert [d.message.body for d in got] == [*written, b"after"]
        assert core.stop() == 0, core.log()
        core.start()
        async with await connect(core.ports["core"]) as c:
            reader = await c.subscribe(s, offset="first")
            got = await collect(reader, len(written) + 1)
            await nothing_more(reader)
            assert [d.message.body for d in got] == [*written, b"after"]
            assert (await c.publish(s, [Message(b"next", persistent=True)])).seqs == [
                after.seqs[0] + 1
            ]
