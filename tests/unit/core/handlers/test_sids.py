"""Tests for polymq_core.handlers.sids: the table of a connection's subscriptions by sid, checked
against a dict on its edges (sid 0, the largest sid, sids far apart, a list grown over sids
the dict held, a list folded into the dict) and on random sequences of operations."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from polymq_core.handlers.sids import SHARED_SIDS, SidTable, shared_sid

LARGEST = 2**63 - 1  # the largest sid the codec admits


class Sub:
    """A stand-in subscription: any object that is not None."""

    def __init__(self, sid: int) -> None:
        self.sid = sid

    def __repr__(self) -> str:
        return f"Sub({self.sid})"


def check(table: SidTable[Sub], model: dict[int, Sub]) -> None:
    """``table`` holds exactly what ``model`` holds."""
    assert len(table) == len(model)
    assert sorted(table.values(), key=lambda s: s.sid) == sorted(
        model.values(), key=lambda s: s.sid
    )
    for sid, sub in model.items():
        assert sid in table
        assert table.get(sid) is sub


def test_sequential_sids_live_in_the_list() -> None:
    table: SidTable[Sub] = SidTable()
    subs = {sid: Sub(sid) for sid in range(1, 10_001)}
    for sid, sub in subs.items():
        table[sid] = sub
    check(table, subs)
    assert table._n_dense == 10_000 and not table._sparse  # the dict holds nothing
    assert 0 not in table and 10_001 not in table and table.get(0) is None


def test_sid_zero_and_the_largest_sid() -> None:
    table: SidTable[Sub] = SidTable()
    zero, top = Sub(0), Sub(LARGEST)
    table[0] = zero
    table[LARGEST] = top
    check(table, {0: zero, LARGEST: top})
    assert table.pop(LARGEST) is top and table.pop(0) is zero
    check(table, {})


def test_missing_sids_answer_the_default() -> None:
    table: SidTable[Sub] = SidTable()
    table[1] = Sub(1)
    marker = Sub(-1)
    for sid in (0, 2, 63, 64, 1000, LARGEST, -1):
        assert sid not in table
        assert table.get(sid) is None and table.get(sid, marker) is marker
        assert table.pop(sid) is None and table.pop(sid, marker) is marker
    check(table, {1: table.get(1)})  # type: ignore[dict-item]


def test_keys_that_are_not_sids_go_to_the_dict() -> None:
    table: SidTable[Any] = SidTable()
    table[-5] = "minus five"
    table["x"] = "a string key"  # type: ignore[index]
    assert table.get(-5) == "minus five" and "x" in table and len(table) == 2
    assert table.pop("x") == "a string key" and table.pop(-5) == "minus five"  # type: ignore[arg-type]
    assert len(table) == 0


def test_setting_a_sid_again_replaces_it() -> None:
    table: SidTable[Sub] = SidTable()
    first, again = Sub(3), Sub(3)
    far, far_again = Sub(10**9), Sub(10**9)
    table[3] = first
    table[10**9] = far
    table[3] = again
    table[10**9] = far_again
    check(table, {3: again, 10**9: far_again})


def test_the_list_grows_over_sids_the_dict_held() -> None:
    """A sid first too far for the list goes to the dict; once the list reaches it, the
    list takes it in (whether set again, looked up or popped)."""
    table: SidTable[Sub] = SidTable()
    model = {500: Sub(500), 90: Sub(90)}
    for sid, sub in model.items():
        table[sid] = sub
    assert set(table._sparse) == {500, 90}
    for sid in range(1, 600):
        if sid not in model:
            model[sid] = table[sid] = Sub(sid)
    check(table, model)
    assert not table._sparse and len(table._dense) == 600  # both moved into the list
    assert table.pop(500) is model.pop(500)
    check(table, model)


def test_a_list_left_mostly_empty_is_folded_into_the_dict() -> None:
    table: SidTable[Sub] = SidTable()
    model = {sid: Sub(sid) for sid in range(1, 1001)}
    for sid, sub in model.items():
        table[sid] = sub
    for sid in range(1, 1000, 2):  # half of them: still in the list
        assert table.pop(sid) is model.pop(sid)
    assert table._dense and not table._sparse
    check(table, model)
    for sid in range(2, 950, 2):  # most of the rest: too many holes, so the dict
        assert table.pop(sid) is model.pop(sid)
    assert not table._dense and len(table._sparse) == len(model)
    check(table, model)
    table[1001] = model[1001] = Sub(1001)  # far past the few it holds: the dict
    check(table, model)


def test_removing_the_last_sids_shortens_the_list() -> None:
    table: SidTable[Sub] = SidTable()
    for sid in range(10):
        table[sid] = Sub(sid)
    for sid in range(9, 2, -1):
        table.pop(sid)
    assert len(table._dense) == 3  # sids 0, 1, 2
    table.pop(1)
    assert len(table._dense) == 3  # a hole in the middle stays
    table.pop(2)
    assert len(table._dense) == 1


def test_values_is_a_snapshot_and_clear_empties() -> None:
    table: SidTable[Sub] = SidTable()
    for sid in (1, 2, 3, 10**6):
        table[sid] = Sub(sid)
    for sub in table.values():  # (the session pops while going through them)
        assert table.pop(sub.sid) is sub
    check(table, {})
    table[7] = Sub(7)
    table[10**6] = Sub(10**6)
    table.clear()
    check(table, {})
    assert table.pop(7) is None and 10**6 not in table


# sids as clients pick them: mostly small and close together, some far away
SIDS = st.one_of(
    st.integers(0, 80), st.integers(0, 600), st.integers(0, LARGEST), st.sampled_from([LARGEST])
)
OPS = st.lists(st.tuples(st.sampled_from(["set", "pop", "get"]), SIDS), max_size=300)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_behaves_as_a_dict(ops: list[tuple[str, int]]) -> None:
    table: SidTable[Sub] = SidTable()
    model: dict[int, Sub] = {}
    for op, sid in ops:
        if op == "set":
            model[sid] = table[sid] = Sub(sid)
        elif op == "pop":
            assert table.pop(sid) is model.pop(sid, None)
        else:
            assert table.get(sid) is model.get(sid)
            assert (sid in table) == (sid in model)
        assert len(table) == len(model)
        dense = table._dense
        assert not dense or dense[-1] is not None  # no trailing holes
        assert table._n_dense == sum(s is not None for s in dense)
        assert all(not 0 <= sid < len(dense) for sid in table._sparse)  # the invariant
    check(table, model)


def test_bulk_after_many_sequential_sids_stays_dense() -> None:
    """A million sequential sids: a list of about a million slots, no dict."""
    table: SidTable[int] = SidTable()
    for sid in range(1, 1_000_001):
        table[sid] = sid
    assert len(table) == 1_000_000 and not table._sparse
    assert len(table._dense) == 1_000_001


# ---- shared_sid -------------------------------------------------------------------------
def test_shared_sid_gives_one_int_object_per_value() -> None:
    for sid in (257, 1000, SHARED_SIDS - 1):
        first = shared_sid(int(str(sid)))  # (a fresh int object each time)
        again = shared_sid(int(str(sid)))
        assert first == sid and again is first


def test_shared_sid_leaves_other_values_alone() -> None:
    for sid in (0, 1, 256, SHARED_SIDS, LARGEST, -1000):
        value = int(str(sid))
        assert shared_sid(value) is value
    assert shared_sid(True) is True  # (not an int sid: as given)
