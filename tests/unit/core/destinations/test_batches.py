"""What an idempotent batch keeps in the store: its answer, packed small when the publish
numbered its messages in a row, and read back the same."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polymq.types import Message
from polymq_core.destinations.batches import pack_answer, unpack_answer


def numbered(first_id: int, first_seq: int, n: int, prefix: str = "19a2b3c4d5e.3") -> list[Message]:
    return [Message(b"x", id=f"{prefix}.{first_id + i}", seq=first_seq + i) for i in range(n)]


def answer(messages: list[Message]) -> dict[str, object]:
    return {
        "count": len(messages),
        "ids": [m.id for m in messages],
        "seqs": [m.seq for m in messages],
        "duplicate": False,
    }


def test_a_numbered_row_is_kept_in_a_few_bytes_whatever_its_length() -> None:
    messages = numbered(41, 7, 10_000)
    blob = pack_answer(messages)
    assert len(blob) < 40
    assert unpack_answer(blob) == answer(messages)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        numbered(1, 1, 1),
        numbered(1, 1, 3) + numbered(9, 4, 1),  # a gap in the ids
        numbered(1, 1, 2) + numbered(3, 9, 1),  # a gap in the seqs
        numbered(1, 1, 2) + numbered(3, 3, 1, prefix="other.1"),
        [Message(b"x", id="no-counter", seq=1)],
        [Message(b"x", id="a.\u00b9", seq=1)],  # a digit to str.isdigit, not to int()
        [Message(b"x", id="a.007", seq=1)],
    ],
)
def test_anything_else_is_kept_as_lists(messages: list[Message]) -> None:
    assert unpack_answer(pack_answer(messages)) == answer(messages)


@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 2**40)), max_size=20))
def test_any_answer_comes_back_as_it_was(pairs: list[tuple[str, int]]) -> None:
    messages = [Message(b"", id=i, seq=s) for i, s in pairs]
    assert unpack_answer(pack_answer(messages)) == answer(messages)


@pytest.mark.parametrize("blob", [b"", b"\xc1", b"\x93\x07\x01\x02", b"\x95\x00\x01"])
def test_what_is_not_a_kept_answer_is_a_value_error(blob: bytes) -> None:
    with pytest.raises(ValueError, match="not a stored batch answer"):
        unpack_answer(blob)
