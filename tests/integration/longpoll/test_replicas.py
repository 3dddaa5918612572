"""No sticky sessions: ``polymq core`` and two ``polymq longpoll`` processes started on their
own; one subscription served by both in turn, with every queue message seen once and a
stream read in order."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from ...procs import PolymqProcess
from .conftest import Longpoll, bodies, start, unique

N = 200


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Longpoll, Longpoll]]:
    workdir = Path(tmp_path_factory.mktemp("longpoll-replicas"))
    procs: list[PolymqProcess] = []
    try:
        core = start("core", workdir / "core")
        procs.append(core)
        address = f"127.0.0.1:{core.ports['core']}"
        for name in ("a", "b"):
            procs.append(start("longpoll", workdir / name, "--core", address))
        a, b = (Longpoll(p.url("longpoll")) for p in procs[1:])
        assert a.base != b.base
        yield a, b
        for proc in reversed(procs):
            assert proc.alive, proc.log()
            assert proc.stop() == 0, proc.log()
    finally:
        for proc in procs:
            proc.kill()


def test_both_processes_are_separate_and_ready(replicas: tuple[Longpoll, Longpoll]) -> None:
    for lp in replicas:
        r = lp.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ready", r.text


def test_a_queue_subscription_served_alternately_sees_every_message_once(
    replicas: tuple[Longpoll, Longpoll],
) -> None:
    a, b = replicas
    dest = f"queue/{unique('rep')}"
    sub = a.open(dest, visibility=30)  # opened through one process
    for i in range(0, N, 50):
        a.post(
            f"/v1/{dest}/messages", json={"messages": [{"body": str(j)} for j in range(i, i + 50)]}
        )
    seen: list[str] = []
    rng = random.Random(7)
    for turn in itertools.count():
        poller, acker = (a, b) if turn % 2 == 0 else (b, a)
        messages = poller.poll(sub["id"], wait=1, max=rng.randint(1, 25))["messages"]
        if not messages:
            break
        seen += bodies(messages)
        # settled through the other process, as a browser behind a load balancer would
        assert acker.settle("ack", *(m["receipt"] for m in messages))["settled"] == len(messages)
        assert turn < N
    assert sorted(seen, key=int) == [str(i) for i in range(N)]
    assert len(seen) == len(set(seen)) == N, "a queue message was delivered twice"
    assert seen == [str(i) for i in range(N)], "one queue, one consumer: FIFO"


def test_a_stream_subscription_served_alternately_is_read_in_order(
    replicas: tuple[Longpoll, Longpoll],
) -> None:
    a, b = replicas
    dest = f"stream/{unique('rep')}"
    sub = b.open(dest, offset="first")
    for i in range(N):
        (a if i % 2 else b).publish(dest, str(i))  # published through both too
    seen: list[str] = []
    cursor = sub["cursor"]
    rng = random.Random(8)
    for turn in itertools.count():
        lp = (a, b)[turn % 2]
        if turn % 3 == 2:  # every third turn, an event stream resumed from the cursor
            with lp.events(sub["id"], last_event_id=cursor) as stream:
                events = stream.read(rng.randint(1, 30), timeout=5)
            messages = [e.data for e in events]
        else:
            messages = lp.poll(sub["id"], cursor, max=rng.randint(1, 30))["messages"]
        if not messages and len(seen) == N:
            break
        seen += bodies(messages)
        if messages:
            cursor = messages[-1]["cursor"]
        assert turn < 2 * N
    assert seen == [str(i) for i in range(N)]


def test_a_topic_subscription_served_alternately_loses_nothing(
    replicas: tuple[Longpoll, Longpoll],
) -> None:
    a, b = replicas
    base = unique("rep")
    sub = a.open(f"topic/{base}.#")
    seen: list[str] = []
    cursor = sub["cursor"]
    for i in range(40):
        (a, b)[i % 2].publish(f"topic/{base}.n{i % 3}", str(i))
        answer = (b, a)[i % 2].poll(sub["id"], cursor, max=3)
        seen += bodies(answer["messages"])
        cursor = answer["cursor"]
    seen += bodies(b.poll(sub["id"], cursor, max=100)["messages"])
    assert seen == [str(i) for i in range(40)]
