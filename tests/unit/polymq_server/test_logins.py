"""The per-source rules of failed password logins (``polymq_server.auth.logins``), on a clock of
the test's: a count that leaks, a block that grows, one check at a time per source."""

from __future__ import annotations

import asyncio

import pytest

from polymq.errors import Unauthorized
from polymq_server.auth.logins import LoginLimiter, TooManyLogins, peer_source, source_key
from polymq_server.auth.principals import Principal

ALICE = Principal("alice", anonymous=False, grants=())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _refused() -> Principal:
    raise Unauthorized("invalid user name or password")


async def _accepted() -> Principal:
    return ALICE


async def _fail(limiter: LoginLimiter, source: str, times: int) -> None:
    for _ in range(times):
        with pytest.raises(Unauthorized) as e:
            await limiter.check(source, _refused)
        assert not isinstance(e.value, TooManyLogins)


async def test_a_source_is_blocked_past_its_free_failures_with_a_growing_block() -> None:
    clock = Clock()
    limiter = LoginLimiter(free=3, first_block=1.0, max_block=10.0, forgive=60.0, clock=clock)
    await _fail(limiter, "10.0.0.1", 3)
    assert await limiter.check("10.0.0.1", _accepted) is ALICE  # not blocked yet
    await _fail(limiter, "10.0.0.1", 1)  # the 4th: blocked for 1 s
    with pytest.raises(TooManyLogins) as e:
        await limiter.check("10.0.0.1", _accepted)  # even a right password: not checked
    assert e.value.status == 429 and e.value.retry_after == 1 and e.value.code == "unauthorized"
    assert "10.0.0.1" in e.value.message and "retry in 1 s" in e.value.message
    assert await limiter.check("10.0.0.2", _accepted) is ALICE  # another source is not
    clock.now += 1.0
    await _fail(limiter, "10.0.0.1", 1)  # the 5th: 2 s
    assert limiter.blocked("10.0.0.1") == pytest.approx(2.0, abs=0.1)  # (1 s: 1/60 forgiven)
    blocks = [limiter.blocked("10.0.0.1")]
    for _ in range(6):  # each further failure (once the block is over) doubles it, at most 10 s
        clock.now += blocks[-1]
        await _fail(limiter, "10.0.0.1", 1)
        blocks.append(limiter.blocked("10.0.0.1"))
    assert blocks[1] > 1.5 * blocks[0] and blocks[2] > 1.5 * blocks[1], blocks
    assert blocks == sorted(blocks) and blocks[-1] == pytest.approx(10.0), blocks


async def test_failures_are_forgiven_one_per_interval() -> None:
    clock = Clock()
    limiter = LoginLimiter(free=3, forgive=60.0, clock=clock)
    await _fail(limiter, "10.0.0.1", 3)
    clock.now += 120.0  # two forgotten: one left
    await _fail(limiter, "10.0.0.1", 2)
    assert limiter.blocked("10.0.0.1") == 0
    await _fail(limiter, "10.0.0.1", 1)
    assert limiter.blocked("10.0.0.1") > 0


async def test_one_check_at_a_time_per_source_and_the_waiting_are_refused_once_blocked() -> None:
    limiter = LoginLimiter(free=1, first_block=30.0)
    running = 0
    most = 0

    async def slow_refusal() -> Principal:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        raise Unauthorized("invalid user name or password")

    results = await asyncio.gather(
        *(limiter.check("10.0.0.1", slow_refusal) for _ in range(6)),
        limiter.check("10.0.0.9", _accepted),
        return_exceptions=True,
    )
    assert most == 1
    assert [type(r) for r in results[:2]] == [Unauthorized, Unauthorized]
    assert all(isinstance(r, TooManyLogins) for r in results[2:6])
    assert results[6] is ALICE


async def test_no_source_no_rules() -> None:
    limiter = LoginLimiter(free=0)
    await _fail(limiter, "10.0.0.1", 1)
    for _ in range(3):
        with pytest.raises(Unauthorized) as e:
            await limiter.check(None, _refused)
        assert not isinstance(e.value, TooManyLogins)


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("127.0.0.1:5555", "127.0.0.1"),
        ("::1:5555", "::/64"),
        ("2001:db8:1:2:3:4:5:6:443", "2001:db8:1:2::/64"),
        ("::ffff:10.1.2.3:80", "10.1.2.3"),
    ],
)
def test_a_source_is_an_address_or_an_ipv6_64(peer: str, key: str) -> None:
    source = peer_source(peer)
    assert source is not None
    assert source_key(source) == key


def test_an_unknown_peer_has_no_source() -> None:
    assert peer_source("?") is None
