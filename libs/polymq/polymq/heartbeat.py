"""A client connection's heartbeat: the part of a :class:`~polymq.connection.CoreConnection`
that finds a core which keeps the connection open but says nothing (a process stopped with
``SIGSTOP``, a machine that hangs, a network that drops packets without closing), which
the socket alone never reports. Like nats.py's ``ping_interval``, it runs per connection
and tick, not per message: what it uses of the connection is a :class:`HeartbeatHost`.

The rule (docs/cluster.md, "Clients that fail over"): every ``interval / 2`` seconds it
looks whether anything came from the core since the last look (any frame counts: a
delivery, an answer); after one such half interval of silence it sends a ``Ping``; when
the core then still sends nothing for ``interval`` seconds, the connection is taken as
lost: with failover the client connects to another address (:mod:`polymq.failover`),
without it the client is closed, pending calls failing with
:class:`~polymq.errors.ConnectionClosed` (code ``heartbeat``). So a core that hangs is
found between ``1.5 x`` and ``2 x interval`` after it last spoke. Nothing is counted while
the client itself does not read (a subscription's local buffer is full) or is between
connections; a core that does not read a connection (a resource alarm holds its
publisher) says ``Ok`` for request 0 now and then, which counts as a word.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from .addresses import Address
from .errors import ConnectionClosed
from .events import Event, Ping

__all__ = ["DEFAULT_HEARTBEAT", "Heartbeat", "HeartbeatHost"]

log = logging.getLogger("polymq.client")

DEFAULT_HEARTBEAT = 5.0  # seconds a core may take to answer a ping (Client.connect's default)
_SILENT_TICKS = 3  # half intervals of silence: a ping after the first, lost after the third


class HeartbeatHost(Protocol):
    """What the heartbeat uses of its connection: whether anything came since it last
    looked (``_heard``, which it clears), whether it is connected and reading, and how to
    ping and to give the connection up. A protocol, so that this module need not import the
    connection's, which imports it."""

    address: Address | None
    closed: bool
    _heard: bool
    _reading_paused: bool

    @property
    def connected(self) -> bool: ...
    def _rid(self) -> int: ...
    def _send(self, ev: Event) -> None: ...
    def _unresponsive(self, reason: ConnectionClosed) -> None: ...


class Heartbeat:
    """Pings ``host``'s core after ``interval / 2`` seconds of silence and gives the
    connection up when ``interval`` more pass without a word (see the module docstring)."""

    def __init__(self, host: HeartbeatHost, interval: float) -> None:
        self.host = host
        self.interval = interval
        self.pings = 0  # sent, for tests and logs
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="polymq-client-heartbeat"
            )

    def stop(self) -> None:
        """Stop (the connection is closing); not awaited (see :meth:`wait_stopped`)."""
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def wait_stopped(self) -> None:
        task, self._task = self._task, None
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        host = self.host
        silent = 0  # half intervals without a word from the core
        while not host.closed:
            await asyncio.sleep(self.interval / 2)
            if host.closed:
                return
            if host._heard or not host.connected or host._reading_paused:
                host._heard = False
                silent = 0
                continue
            silent += 1
            if silent == 1:
                self.pings += 1
                host._send(Ping(host._rid()))  # (its answer is awaited by nobody: any word counts)
            elif silent >= _SILENT_TICKS:
                silent = 0
                why = (
                    f"the core at {host.address} sent nothing for {self.interval:g} s after a "
                    "ping (heartbeat): it hangs, or the network drops what it sends"
                )
                log.warning("polymq: %s", why)
                host._unresponsive(ConnectionClosed(why, "heartbeat"))
