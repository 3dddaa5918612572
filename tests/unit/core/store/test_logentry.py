"""Tests of ``polymq_core.store.logentry``: the entry codec (round trips, and no bytes that break
the decoder) and the log's error tree."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polymq_core.store.logentry import (
    ENTRY_VERSION,
    Deposed,
    Entry,
    LogError,
    LogUnavailable,
    decode_entry,
    encode_entry,
)

Q = "queue/q"


def test_an_entry_round_trips() -> None:
    writes = [
        (1, Q, 3, b"\x00blob"),
        (2, Q, [[4, b"a"], [5, b"b"]]),
        (5, Q, '{"durable": true}', "{}"),
        (9, "k", b""),
    ]
    data = encode_entry("node-a", 17, writes)
    assert msgpack.unpackb(data, raw=False)[:3] == [ENTRY_VERSION, "node-a", 17]
    entry = decode_entry(data)
    assert entry == Entry("node-a", 17, [tuple(w) for w in msgpack.unpackb(data)[3]])
    assert entry.writes[0] == (1, Q, 3, b"\x00blob") and not entry.takeover
    assert isinstance(entry.writes[0][3], bytes) and isinstance(entry.writes[2][2], str)


def test_a_takeover_entry_has_no_writes_and_says_so() -> None:
    entry = decode_entry(encode_entry("b", 9, [], takeover=True))
    assert entry == Entry("b", 9, [], takeover=True)
    assert decode_entry(encode_entry("b", 9, [])) == Entry("b", 9, [], takeover=False)
    with pytest.raises(ValueError):
        encode_entry("b", 9, [(9, "k")], takeover=True)


write_values = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.binary(max_size=40)
)
writes_strategy = st.lists(
    st.tuples(st.integers(1, 20), st.lists(write_values, max_size=4)).map(lambda t: (t[0], *t[1])),
    max_size=8,
)


@given(
    node=st.text(min_size=1, max_size=20),
    epoch=st.integers(0, 2**63),
    writes=writes_strategy,
)
def test_any_entry_round_trips(node: str, epoch: int, writes: list[tuple[Any, ...]]) -> None:
    assert decode_entry(encode_entry(node, epoch, writes)) == Entry(node, epoch, writes)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used in msgpack
        b"\x93\x01\x02",  # truncated
        msgpack.packb({"a": 1}),
        msgpack.packb([1, "a", 1]),
        msgpack.packb([2, "a", 1, []]),  # a version from the future
        msgpack.packb([1, "", 1, []]),
        msgpack.packb([1, 7, 1, []]),
        msgpack.packb([1, "a", -1, []]),
        msgpack.packb([1, "a", True, []]),
        msgpack.packb([1, "a", 1, "writes"]),
        msgpack.packb([1, "a", 1, [[]]]),
        msgpack.packb([1, "a", 1, [["kv_put", "k", b"v"]]]),
        msgpack.packb([1, "a", 1, [], False]),
        msgpack.packb([1, "a", 1, [[9, "k"]], True]),  # a takeover with writes
        msgpack.packb([1, "a", 1, [], True, "more"]),
    ],
)
def test_garbage_is_a_log_error(data: bytes) -> None:
    with pytest.raises(LogError):
        decode_entry(data)


@given(st.binary(max_size=64))
def test_no_bytes_break_the_decoder(data: bytes) -> None:
    try:
        decode_entry(data)
    except LogError:
        pass


def test_the_error_tree() -> None:
    assert issubclass(Deposed, LogError) and issubclass(LogUnavailable, LogError)
    assert not issubclass(Deposed, LogUnavailable)
    assert Deposed("x", last=4).last == 4
