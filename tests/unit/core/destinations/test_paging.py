"""What a paging queue counts (polymq_core.destinations.paging.Pages), without a store."""

from __future__ import annotations

from polymq.types import Message
from polymq_core.destinations.paging import OVERHEAD, SQUEEZE, Pages, Pressure


def msg(seq: int, size: int = 10) -> Message:
    return Message(b"x" * size, persistent=True, seq=seq)


def test_a_queue_pages_once_either_bound_is_reached_and_then_everything_after() -> None:
    pages = Pages(100, 100 * OVERHEAD + 1000)
    assert not pages.full(99, 999)
    assert pages.full(100, 0) and pages.full(0, 100 * OVERHEAD + 1000)
    assert pages.full(99, 100 * OVERHEAD + 1000 - 99 * OVERHEAD)  # bodies and what each costs
    pages.add(msg(7))
    assert pages.full(0, 0)  # once anything is paged, what comes after is too
    pages.add(msg(8, 20))
    assert (pages.count, pages.nbytes, pages.first) == (2, 30, 7)


def test_a_page_is_read_when_half_the_window_is_free_and_fills_it() -> None:
    pages = Pages(100, 100 * (OVERHEAD + 10))
    for seq in range(1, 501):
        pages.add(msg(seq))
    assert pages.wanted(50, 500) == 0  # half a window ready: nothing yet
    assert pages.wanted(49, 490) == 51  # up to a full window
    assert pages.wanted(0, 0) == 100
    pages.reading = True
    assert pages.wanted(0, 0) == 0  # one read at a time
    pages.reading = False
    pages.took([msg(seq) for seq in range(1, 101)])
    assert (pages.count, pages.nbytes, pages.first) == (400, 4000, 101)


def test_the_bytes_bound_limits_a_page_by_the_mean_size() -> None:
    pages = Pages(1000, 10 * (1000 + OVERHEAD))
    for seq in range(1, 101):
        pages.add(msg(seq, 1000))
    assert pages.wanted(0, 0) == 10  # 10 of 1000 bytes (and what each costs besides)
    assert pages.wanted(5, 5000) == 0  # (half the window is ready)
    assert pages.wanted(4, 4000) == 6


def test_small_messages_are_bounded_by_what_they_cost_in_memory() -> None:
    """A window of bytes counts each message's overhead: 32 MiB holds ~60k of 32 B."""
    pages = Pages(1_000_000, 32 * 1024 * 1024)
    assert not pages.full(60_000, 60_000 * 32)
    assert pages.full(62_000, 62_000 * 32)


def test_a_restart_counts_what_it_did_not_read_and_a_purge_forgets_it() -> None:
    pages = Pages(100, 10_000)
    pages.add_stored(0, 0, 100)
    assert pages.count == 0
    pages.add_stored(900, 9000, 100)
    assert (pages.count, pages.first) == (900, 101)
    generation = pages.generation
    assert pages.clear() == 900
    assert pages.count == 0 and pages.generation == generation + 1
    pages.add_stored(5, 50, 100)
    pages.took([])  # the store had none left: the counts were off
    assert (pages.count, pages.nbytes) == (0, 0)


def test_under_memory_pressure_the_window_is_squeezed() -> None:
    pressure = Pressure()
    pages = Pages(80, 8000 + 80 * OVERHEAD, pressure)
    squeezed = 1000 + 10 * OVERHEAD
    assert not pages.full(10, 0) and not pages.full(0, squeezed)
    pressure.on = True  # the window is 80 / SQUEEZE = 10 messages, 1000 bytes and overheads
    assert SQUEEZE == 8
    assert pages.full(10, 0) and pages.full(0, squeezed) and not pages.full(9, 999)
    for seq in range(1, 101):
        pages.add(msg(seq))
    assert pages.wanted(5, 50) == 0  # half the squeezed window ready: nothing yet
    assert pages.wanted(4, 40) == 6  # a page fills the squeezed window only
    pressure.on = False
    assert pages.wanted(4, 40) == 76
    assert pages.full(0, 0)  # (what is paged stays paged: the order is the store's)
