"""Fake cores served in this process (``polymq.inproc``: no sockets) that speak the wire
protocol with the real codec, for the client's failover and heartbeat tests: each records
what it is sent and answers as told; one ``frozen`` answers nothing and says nothing, as a
core stopped with ``SIGSTOP`` (its connection stays open)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from polymq.codec import NEED_DATA, Connection, Role
from polymq.events import Event, Goodbye, Hello, Ok, Publish, Welcome

HOST = "127.0.0.1"
A, B = 65101, 65102  # the fake cores' ports (served in-process only: no socket)


class FakeCore(asyncio.Protocol):
    """A core that welcomes every Hello (or, ``refuse``d, says Goodbye ``unavailable``),
    records what it is sent, and answers as ``answer`` says (None: not at all); ``frozen``,
    it records and says nothing at all."""

    def __init__(self, name: str, answer: Callable[[Event], object]) -> None:
        self.name = name
        self.answer = answer
        self.conn = Connection(Role.SERVER)
        self.got: list[Event] = []
        self.transport: asyncio.Transport | None = None
        self.refuse = False
        self.frozen = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        while (ev := self.conn.next_event()) is not NEED_DATA:
            assert isinstance(ev, Event)
            self.got.append(ev)
            if self.frozen or isinstance(ev, Goodbye):
                continue
            if isinstance(ev, Hello):
                if self.refuse:
                    self.say_goodbye("unavailable", "not now")
                else:
                    self.send(Welcome(1, self.name, f"{self.name}-session", {}))
                continue
            result = self.answer(ev)
            if result is not None:
                self.send(Ok(ev.rid, None if result is True else result))  # type: ignore[attr-defined]

    def send(self, ev: Event) -> None:
        assert self.transport is not None
        self.transport.write(self.conn.send(ev))

    def say_goodbye(self, code: str, message: str) -> None:
        assert self.transport is not None
        self.transport.write(self.conn.goodbye(code, message))
        self.transport.close()

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.got if isinstance(e, kind)]


def answer_all(ev: Event) -> object:
    if isinstance(ev, Publish):
        return {"count": len(ev.messages), "ids": ["i"], "seqs": [1], "duplicate": False}
    return True


def answer_but_publishes(ev: Event) -> object:
    return None if isinstance(ev, Publish) else True


class Cores:
    """The fake cores made at each address, newest last; ``refusing`` the addresses whose
    next cores say Goodbye to the Hello."""

    def __init__(self) -> None:
        self.made: dict[int, list[FakeCore]] = {A: [], B: []}
        self.answers: dict[int, Callable[[Event], object]] = {A: answer_all, B: answer_all}
        self.refusing: set[int] = set()

    def factory(self, port: int) -> Callable[[], FakeCore]:
        def make() -> FakeCore:
            core = FakeCore(f"core-{port}", self.answers[port])
            core.refuse = port in self.refusing
            self.made[port].append(core)
            return core

        return make

    def last(self, port: int) -> FakeCore:
        return self.made[port][-1]


async def until(check: Callable[[], object], what: str, within: float = 5.0) -> None:
    """Poll ``check`` (the fakes answer from the client's own loop) until it is true."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        if check():
            return
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within {within:g}s"
        await asyncio.sleep(0.005)


def address(port: int) -> str:
    return f"{HOST}:{port}"
