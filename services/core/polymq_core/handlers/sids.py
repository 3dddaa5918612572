"""A connection's subscriptions by subscription id (sid), in little memory.

Clients number their subscriptions 1, 2, 3, ... on each connection (``polymq.Client``
does, and so every frontend does), so :class:`SidTable` keeps them in a list indexed by
sid: 8 bytes a subscription where a dict entry costs about 42 (a 24-byte entry in a table
kept one to two thirds full) and the list needs no hashing. Sids that would leave the list
mostly empty (far past the number of subscriptions it holds) go to a dict instead, so any
sid a client picks costs at most what a dict costs.

The invariant: a sid below ``len(dense)`` lives in the list (or is absent: ``None``), any
other in ``sparse``. The list grows only to a sid below twice the subscriptions it holds
(plus a little), which keeps it at least about half full when it grows; once removals
leave it less than an eighth full it is folded into the dict.

:func:`shared_sid` gives one int object per sid value below :data:`SHARED_SIDS`: the same
sids recur on every connection, and an int past 256 is otherwise a 32-byte object of its
own for each subscription.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["SHARED_SIDS", "SidTable", "shared_sid"]

T = TypeVar("T")

_SLACK = 64  # the list may always reach this length, however few it holds
_SPARSEST = 8  # folded into the dict when less than one slot in this many is used

SHARED_SIDS = 1 << 16  # sids below this share one int object per value
_shared: list[int | None] = []


def shared_sid(sid: int) -> int:
    """``sid`` itself, or the int object equal to it that an earlier call returned."""
    if type(sid) is not int or not 256 < sid < SHARED_SIDS:  # (CPython shares 0..256)
        return sid
    if sid >= len(_shared):
        _shared.extend([None] * (max(sid + 1, 2 * len(_shared)) - len(_shared)))
    known = _shared[sid]
    if known is None:
        _shared[sid] = sid
        return sid
    return known


class SidTable(Generic[T]):
    """A mapping of sids to subscriptions (never None). Sids are ints (the codec admits
    0 to 2**63 - 1); any other key is kept in the dict. The operations a session uses:
    ``in``, ``len``, ``get``, ``pop``, ``[sid] = sub``, ``values`` and ``clear``."""

    __slots__ = ("_dense", "_n_dense", "_sparse")

    def __init__(self) -> None:
        self._dense: list[T | None] = []
        self._n_dense = 0  # entries of _dense that are not None
        self._sparse: dict[int, T] = {}

    def __len__(self) -> int:
        return self._n_dense + len(self._sparse)

    def __contains__(self, sid: object) -> bool:
        return self.get(sid) is not None  # type: ignore[arg-type]

    def get(self, sid: int, default: T | None = None) -> T | None:
        dense = self._dense
        if type(sid) is int and 0 <= sid < len(dense):
            found = dense[sid]
            return default if found is None else found
        return self._sparse.get(sid, default)

    def __setitem__(self, sid: int, sub: T) -> None:
        dense = self._dense
        if type(sid) is not int or sid < 0:
            self._sparse[sid] = sub
            return
        if sid >= len(dense):
            if sid >= 2 * self._n_dense + _SLACK:
                self._sparse[sid] = sub
                return
            self._grow(sid + 1)
        if dense[sid] is None:
            self._n_dense += 1
        dense[sid] = sub

    def _grow(self, length: int) -> None:
        """Lengthen the list to ``length``, taking in the dict's entries it now covers."""
        dense, sparse = self._dense, self._sparse
        start = len(dense)
        if not sparse:
            dense.extend([None] * (length - start))
            return
        for sid in range(start, length):
            sub = sparse.pop(sid, None)
            dense.append(sub)
            if sub is not None:
                self._n_dense += 1

    def pop(self, sid: int, default: T | None = None) -> T | None:
        dense = self._dense
        if type(sid) is not int or not 0 <= sid < len(dense):
            return self._sparse.pop(sid, default)
        sub = dense[sid]
        if sub is None:
            return default
        dense[sid] = None
        self._n_dense -= 1
        while dense and dense[-1] is None:  # (each slot is dropped once: amortized O(1))
            dense.pop()
        if len(dense) > _SLACK and self._n_dense * _SPARSEST < len(dense):
            self._fold()
        return sub

    def _fold(self) -> None:
        """Move the list's entries into the dict (the list has become mostly holes)."""
        sparse = self._sparse
        for sid, sub in enumerate(self._dense):
            if sub is not None:
                sparse[sid] = sub
        self._dense = []
        self._n_dense = 0

    def values(self) -> list[T]:
        """Every subscription, as a list (safe to change the table while going through it)."""
        out = [sub for sub in self._dense if sub is not None]
        out.extend(self._sparse.values())
        return out

    def clear(self) -> None:
        self._dense = []
        self._n_dense = 0
        self._sparse.clear()
