"""Keeping a shard's log bounded, and copying a shard to a node that fell behind it
(docs/cluster.md, "Writes").

The leader of a shard purges its log below what every node has applied (as they announce it
on ``system.peers``), keeping the last entries always; :func:`lowest_applied` and
:func:`purge_point` say where, as pure functions. A node whose next entry was purged (a wiped
data dir, or down longer than the log kept) copies the shard's SQLite from a node that has
it: :func:`snapshot_sources` says which nodes, best first; :func:`download` fetches one from
its admin HTTP (``GET /api/cluster/snapshot/<shard>``, the cluster secret as a bearer token),
the applied sequence inside the copy in the :data:`APPLIED_HEADER` header.

Errors::

    SnapshotError   no node to copy from, or the copy failed: an HTTP error, a refused
                    secret, a broken download; ``__cause__`` is the aiohttp or OS error
                    beneath, when there is one
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path
from ssl import SSLContext

import aiohttp

from .membership import LEAVING, PeerInfo

__all__ = [
    "APPLIED_HEADER",
    "KEEP_BYTES",
    "KEEP_ENTRIES",
    "MAX_ENTRIES",
    "PURGE_EVERY",
    "SnapshotError",
    "download",
    "kept_entries",
    "lowest_applied",
    "purge_point",
    "snapshot_sources",
    "snapshot_url",
]

APPLIED_HEADER = "X-Polymq-Applied"
PURGE_EVERY = 30.0  # seconds between a leader's purges of its shards' logs
KEEP_ENTRIES = 10_000  # the last entries a purge never drops ...
KEEP_BYTES = 64 * 1024 * 1024  # ... unless they hold more bytes than this
# A log longer than this is purged even past a node that has not applied it (one down for
# good holds it up no further; it copies a snapshot if it comes back).
MAX_ENTRIES = 1_000_000
_CHUNK = 1024 * 1024


class SnapshotError(Exception):
    """No node to copy a shard from, or copying failed; ``__cause__`` says why."""


# -- purging (pure) ----------------------------------------------------------------------------


def lowest_applied(peers: Iterable[PeerInfo], shard: int) -> int | None:
    """The lowest sequence of ``shard``'s log that every node has applied, as the nodes
    announced it: over every node ever heard (an unreachable one with what it last said: it
    needs the entries when it comes back) except those that said they are leaving. A node
    that announced nothing for the shard counts as 0. None if no node counts."""
    applied = [p.applied.get(shard, 0) for p in peers if p.state != LEAVING]
    return min(applied) if applied else None


def kept_entries(keep: int, keep_bytes: int, *, entries: int, nbytes: int) -> int:
    """How many of a log's last entries a purge keeps: ``keep``, or fewer when that many
    (at the log's mean entry size: ``nbytes`` over ``entries``) hold more than
    ``keep_bytes`` bytes, but at least one. A publisher's window of 1 KB messages is one
    entry of ~1.5 MB: 10,000 of them (15 GB per node) kept a 10M-message backlog whole in
    every node's log, beside the stores that hold it."""
    if entries <= 0 or nbytes <= 0:
        return keep
    fit = keep_bytes * entries // nbytes
    return max(1, min(keep, fit)) if keep else 0


def purge_point(
    lowest: int | None,
    *,
    first: int,
    last: int,
    keep: int = KEEP_ENTRIES,
    most: int | None = MAX_ENTRIES,
) -> int:
    """Where to purge a log of entries ``first..last`` (``first`` is ``last + 1`` when it
    is empty): the sequence to purge below (it and those after stay), or 0 for no purge.

    Entries every node has applied (up to ``lowest``) go, except the last ``keep`` of the
    log; if more than ``most`` entries would still be kept, the log is cut to ``most`` even
    past ``lowest`` (None: never)."""
    if keep < 0 or (most is not None and most < max(keep, 1)):
        raise ValueError("keep must be >= 0, and most (if set) >= keep and >= 1")
    point = 0 if lowest is None else min(lowest + 1, last - keep + 1)
    if most is not None:
        point = max(point, last - most + 1)
    return point if point > first else 0


# -- copying (sources pure, download I/O) ------------------------------------------------------


def snapshot_sources(
    peers: Iterable[PeerInfo],
    shard: int,
    *,
    me: str,
    leader: str | None,
    first: int | None,
) -> list[PeerInfo]:
    """The nodes to copy ``shard`` from, best first: the other nodes with an admin URL
    whose announced ``applied`` reaches the log's first entry less one (``first``, when
    known: a copy from further back would be purged past again), the shard's leader first,
    then the furthest ahead. The caller passes only the nodes it can reach."""
    out = [
        p
        for p in peers
        if p.node_id != me
        and p.admin_url
        and p.state != LEAVING
        and (first is None or p.applied.get(shard, 0) >= first - 1)
    ]
    out.sort(key=lambda p: (p.node_id != leader, -p.applied.get(shard, 0), p.node_id))
    return out


def snapshot_url(admin_url: str, shard: int) -> str:
    """The snapshot route of the admin app at ``admin_url``."""
    return f"{admin_url.rstrip('/')}/api/cluster/snapshot/{shard}"


async def download(
    url: str,
    secret: str,
    target: Path,
    *,
    timeout: float = 30.0,
    ssl: SSLContext | None = None,
) -> int:
    """Fetch the snapshot at ``url`` into the file ``target`` (replaced; fsynced), sending
    ``secret`` as the bearer token; the applied sequence the node says is inside it.
    ``timeout`` bounds connecting and each read, not the whole copy; ``ssl``: the TLS
    context of an https ``url`` (cluster TLS), else the default one."""
    limits = aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout)
    headers = {"Authorization": f"Bearer {secret}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=limits) as session,
            session.get(url, headers=headers, ssl=True if ssl is None else ssl) as response,
        ):
            if response.status != 200:
                text = (await response.text(errors="replace"))[:200]
                raise SnapshotError(f"{url}: HTTP {response.status}: {text}")
            value = response.headers.get(APPLIED_HEADER, "")
            if not value.isdigit():
                raise SnapshotError(f"{url}: no {APPLIED_HEADER} header (got {value!r:.40})")
            await _save(response.content, target)
            return int(value)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise SnapshotError(f"{url}: {type(exc).__name__}: {exc}") from exc


async def _save(content: aiohttp.StreamReader, target: Path) -> None:
    f = await asyncio.to_thread(open, target, "wb")
    try:
        async for chunk in content.iter_chunked(_CHUNK):
            await asyncio.to_thread(f.write, chunk)
        await asyncio.to_thread(os.fsync, f.fileno())
    finally:
        await asyncio.to_thread(f.close)
