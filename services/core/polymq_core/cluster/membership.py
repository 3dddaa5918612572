"""Membership: every node announces itself on ``polymq.system.peers`` and listens there.

An announcement is a JSON object, every ``period`` seconds (and at once on start)::

    {"node_id": "a", "addresses": {"core": "10.0.0.1:7400", ...},
     "admin_url": "http://10.0.0.1:7401", "shards_led": [0, 2], "version": "0.1.0",
     "started": 1760000000.0, "applied": {"0": 41, "1": 7}, "state": "ready",
     "config_version": 1760000000123456789}

``state`` is optional (``"ready"``; a node may say ``"joining"``, ``"leaving"`` or another
word, shown as it is unless the node is unreachable). A node that stops says
``{"node_id": "a", "leaving": true}``, with ``"gone": true`` when it is not coming back
(scaled down: the others take it out of the shards' replicas). A node unheard for three periods is
``"unreachable"``. The view is local: ``last_heard`` is this node's monotonic clock.

The NATS connection the broker passes has ``no_echo=True``, so our own announcements
never come back over NATS: they are recorded (and handed to ``on_announce``) locally.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

__all__ = ["Membership", "PeerInfo", "parse_address"]

log = logging.getLogger(__name__)

READY, JOINING, LEAVING, UNREACHABLE, UNKNOWN = (
    "ready",
    "joining",
    "leaving",
    "unreachable",
    "unknown",
)
_MISSED = 3  # periods without an announcement before a node is unreachable


@dataclass(frozen=True)
class PeerInfo:
    """What a node last announced, and when (``last_heard``: local ``time.monotonic()``)."""

    node_id: str
    addresses: dict[str, str] = field(default_factory=dict)  # listener -> "host:port"
    admin_url: str = ""
    shards_led: tuple[int, ...] = ()
    version: str = ""
    started: float = 0.0  # unix time
    applied: dict[int, int] = field(default_factory=dict)  # shard -> last applied log seq
    last_heard: float = 0.0
    state: str = READY  # as announced: "ready", "joining", "leaving", ...
    config_version: int = 0  # the last system.config reload it applied (0: none)
    gone: bool = False  # it left for good (scaled down), not for a restart


class BadAnnouncement(ValueError):
    """An announcement that is not what this module sends."""


def _peer_from(body: Mapping[str, Any], now: float) -> PeerInfo:
    node_id = body.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise BadAnnouncement("no node_id")
    if body.get("leaving") is True:
        gone = body.get("gone") is True
        return PeerInfo(node_id=node_id, last_heard=now, state=LEAVING, gone=gone)
    addresses = body.get("addresses", {})
    if not isinstance(addresses, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in addresses.items()
    ):
        raise BadAnnouncement("addresses must map listener names to 'host:port'")
    shards = body.get("shards_led", [])
    if not isinstance(shards, list | tuple) or not all(_is_int(s) for s in shards):
        raise BadAnnouncement("shards_led must be a list of shard numbers")
    applied_in = body.get("applied", {})
    if not isinstance(applied_in, dict):
        raise BadAnnouncement("applied must map shards to sequences")
    try:
        applied = {int(k): int(v) for k, v in applied_in.items()}
    except (TypeError, ValueError):
        raise BadAnnouncement("applied must map shards to sequences") from None
    admin_url, version = body.get("admin_url", ""), body.get("version", "")
    started, state = body.get("started", 0.0), body.get("state", READY)
    if not isinstance(admin_url, str) or not isinstance(version, str):
        raise BadAnnouncement("admin_url and version must be strings")
    if isinstance(started, bool) or not isinstance(started, int | float):
        raise BadAnnouncement("started must be a unix time")
    if not isinstance(state, str) or not state:
        raise BadAnnouncement("state must be a word (ready, joining, leaving, ...)")
    config_version = body.get("config_version", 0)
    if not _is_int(config_version):
        raise BadAnnouncement("config_version must be an integer")
    return PeerInfo(
        node_id=node_id,
        addresses=dict(addresses),
        admin_url=admin_url,
        shards_led=tuple(int(s) for s in shards),
        version=version,
        started=float(started),
        applied=applied,
        last_heard=now,
        state=state,
        config_version=int(config_version),
    )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_address(text: str) -> tuple[str, int] | None:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``; None if malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host, int(port)) if host else None


class Membership:
    """Announces this node and keeps the cluster's view. ``start``/``stop`` own one task."""

    SUBJECT = "polymq.system.peers"

    def __init__(
        self,
        nc: NatsClient,
        node_id: str,
        describe_self: Callable[[], dict[str, Any]],
        *,
        period: float = 2.0,
        on_announce: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if period <= 0:
            raise ValueError("period must be positive")
        self.nc = nc
        self.node_id = node_id
        self.period = period
        self._describe_self = describe_self
        self._on_announce = on_announce
        self._peers: dict[str, PeerInfo] = {}  # every node heard from, self included
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._running = False

    # ---- life cycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe, announce now and then every ``period`` seconds."""
        if self._task is not None:
            raise RuntimeError("membership already started")
        self._sub = await self.nc.subscribe(self.SUBJECT, cb=self._received)
        self._running = True
        try:
            await self.announce()
        except Exception as exc:  # NATS reconnecting: the announcer tries again
            log.warning("membership announcement failed: %s", exc)
        self._task = asyncio.create_task(self._announcer(), name=f"membership-{self.node_id}")

    async def stop(self, *, gone: bool = False) -> None:
        """Say we are leaving (``gone``: for good), best effort; stop announcing,
        unsubscribe. Idempotent."""
        if not self._running:
            return
        self._running = False
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        leaving: dict[str, Any] = {"node_id": self.node_id, "leaving": True}
        if gone:
            leaving["gone"] = True
        self._record(leaving)
        try:
            await self.nc.publish(self.SUBJECT, json.dumps(leaving).encode())
            await self.nc.flush(timeout=1)
        except Exception as exc:  # the connection may be gone already: nobody to tell
            log.debug("could not announce leaving: %s", exc)
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def announce(self) -> None:
        """Announce now (also done every ``period``); e.g. after the shards led changed."""
        body = dict(self._describe_self())
        body["node_id"] = self.node_id
        self._record(body)
        await self.nc.publish(self.SUBJECT, json.dumps(body).encode())

    async def _announcer(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.announce()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS reconnecting, a describe_self bug: try again
                log.warning("membership announcement failed: %s", exc, exc_info=True)

    # ---- what is heard -----------------------------------------------------------------------
    async def _received(self, msg: Msg) -> None:
        try:
            body = json.loads(msg.data)
            if not isinstance(body, dict):
                raise BadAnnouncement("not a JSON object")
            if body.get("node_id") == self.node_id:
                return  # our own (when the connection echoes): recorded when sent
            self._record(body)
        except (ValueError, BadAnnouncement) as exc:
            log.warning("ignoring a malformed announcement on %s: %s", self.SUBJECT, exc)

    def _record(self, body: dict[str, Any]) -> None:
        peer = _peer_from(body, time.monotonic())
        old = self._peers.get(peer.node_id)
        if peer.state == LEAVING and old is not None:  # keep what we knew of it
            peer = dataclasses.replace(
                old, last_heard=peer.last_heard, state=LEAVING, gone=peer.gone
            )
        self._peers[peer.node_id] = peer
        if old is None or old.state != peer.state:
            log.info("node %s is %s", peer.node_id, peer.state)
        if self._on_announce is not None:
            try:
                self._on_announce(body)
            except Exception:
                log.exception("on_announce failed")

    # ---- the view ----------------------------------------------------------------------------
    def peers(self) -> dict[str, PeerInfo]:
        """Every node heard from, this one included (as it last announced itself)."""
        return dict(self._peers)

    def state_of(self, node_id: str) -> str:
        """``"ready"``, ``"joining"``, ``"leaving"`` (or another state a node announced),
        ``"unreachable"`` (unheard for three periods), ``"unknown"`` (never heard)."""
        return self._state_at(node_id, time.monotonic())

    def _state_at(self, node_id: str, now: float) -> str:
        peer = self._peers.get(node_id)
        if node_id == self.node_id:
            if not self._running:
                return LEAVING if peer is not None else UNKNOWN
            return peer.state if peer is not None else JOINING
        if peer is None:
            return UNKNOWN
        if peer.state == LEAVING:  # said goodbye (or is saying it): not unreachable
            return LEAVING
        if now - peer.last_heard > _MISSED * self.period:
            return UNREACHABLE
        return peer.state

    def describe(self) -> list[dict[str, Any]]:
        """One JSON-able dict per node (this one included), sorted by id: what
        ``GET /api/cluster`` and ``polymq cluster list`` show."""
        now = time.monotonic()
        return [
            {
                "id": p.node_id,
                "self": p.node_id == self.node_id,
                "state": self._state_at(p.node_id, now),  # the same now as last_heard's
                "addresses": dict(p.addresses),
                "admin_url": p.admin_url,
                "shards_led": list(p.shards_led),
                "applied": {str(k): v for k, v in sorted(p.applied.items())},
                "last_heard_seconds_ago": round(max(0.0, now - p.last_heard), 3),
                "version": p.version,
                "started": p.started,
                "config_version": p.config_version,
            }
            for p in sorted(self._peers.values(), key=lambda p: p.node_id)
        ]

    def address_of(self, node_id: str, listener: str = "core") -> tuple[str, int] | None:
        """``(host, port)`` of a node's listener as it announced it; None if unknown."""
        peer = self._peers.get(node_id)
        if peer is None or listener not in peer.addresses:
            return None
        return parse_address(peer.addresses[listener])
