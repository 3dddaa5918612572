"""A shard's SQLite file copied whole: how a node that fell behind its shard's log takes a
copy of another node's (docs/cluster.md, "Writes").

:func:`copy_store` makes a consistent copy of a store's file while it is open and written
(what :meth:`~polymq_core.store.sqlite.SqliteStore.backup` runs on a thread); the copy travels
(:mod:`polymq_core.cluster.snapshot`); :func:`check_snapshot` reads a received copy's applied
sequence, refusing a file that is not an intact store this polymq reads; and
:func:`install_snapshot` puts it in place of a closed store's file. Each is blocking: run it
on a thread. They fail with :class:`~polymq_core.store.contract.StoreError` (``check_snapshot``) or
the sqlite3 and OS errors beneath (``copy_store``, ``install_snapshot``: their callers
translate).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .contract import StoreError
from .schema import LOAD_APPLIED, SCHEMA_VERSION

__all__ = ["check_snapshot", "copy_store", "install_snapshot"]


def copy_store(source: Path, target: Path) -> int:
    """A consistent copy of the SQLite store ``source`` in the new file ``target`` (replaced
    if there), by SQLite's online backup on a connection of its own, as of one commit; a
    single file (no ``-wal``). Returns the log sequence applied in the copy (0 if none)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for path in (target, *_sidecars(target)):
        path.unlink(missing_ok=True)
    src = sqlite3.connect(source)
    try:
        dst = sqlite3.connect(target, isolation_level=None)
        try:
            src.backup(dst)  # all pages in one step: one read transaction, one commit's state
            dst.execute("PRAGMA journal_mode = DELETE")
            row = dst.execute(LOAD_APPLIED).fetchone()
            return 0 if row is None else int(row[0])
        finally:
            dst.close()
    finally:
        src.close()


def _sidecars(db: Path) -> tuple[Path, ...]:
    """The files SQLite keeps beside ``db``."""
    return tuple(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal"))


def check_snapshot(path: str | os.PathLike[str]) -> int:
    """The log sequence applied in the store copy at ``path``, after checking that it is an
    intact SQLite store (``quick_check``) of a schema this polymq reads; :class:`StoreError`
    if it is not. Blocking: run it on a thread."""
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if not 1 <= version <= SCHEMA_VERSION:
                raise StoreError(f"{path}: schema version {version}, not 1..{SCHEMA_VERSION}")
            (verdict,) = conn.execute("PRAGMA quick_check").fetchone()
            if verdict != "ok":
                raise StoreError(f"{path} is damaged: {verdict}")
            row = conn.execute(LOAD_APPLIED).fetchone()
            return 0 if row is None else int(row[0])
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{path} is not a polymq store: {exc}") from exc


def install_snapshot(snapshot: str | os.PathLike[str], db: str | os.PathLike[str]) -> None:
    """Put the store copy ``snapshot`` in place of the (closed) store file ``db``, atomically:
    ``db``'s ``-wal`` and ``-shm`` go first (a WAL left beside another file would be replayed
    into it), then ``snapshot`` is renamed over ``db`` and the directory synced. Blocking:
    run it on a thread."""
    db = Path(db)
    with open(snapshot, "rb+") as f:
        os.fsync(f.fileno())
    for path in _sidecars(db):
        path.unlink(missing_ok=True)
    os.replace(snapshot, db)
    fd = os.open(db.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
