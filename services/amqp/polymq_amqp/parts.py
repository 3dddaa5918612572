"""What a connection's parts ask of its :class:`~polymq_amqp.session.AmqpSession`: a channel
(``channel.py``), its consumers, declarations and publisher, and the session's outbox of
publishes. The session holds them and they call back into it; they name this protocol,
not the AmqpSession, so that none of their modules imports ``session.py`` (which imports
theirs). It lives apart from them because all four of theirs need it and ``channel.py``
imports the other three; what only one part asks (the outbox, the confirms due) is added
by that part's module. :class:`PartHost` is the other way: the channel as each of its
parts sees it (each part's module adds what it alone asks)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pamqp import base

    from polymq.client import Client
    from polymq_server.auth.provider import Permission, Principal
    from polymq_server.link.corelink import CoreLink
    from polymq_server.names import VhostNames

    from .config import AmqpSettings
    from .hub import AmqpHub
    from .metrics import AmqpMetrics
    from .topology import Topology
    from .wire.codec import AmqpConnection

__all__ = ["ChannelHost", "PartHost"]


class ChannelHost(Protocol):
    """The session as its channels, and their parts, see it."""

    # what the parts count (the publishes in flight, and the reads that forget routes)
    reads: int
    inflight: int
    inflight_bytes: int

    @property
    def hub(self) -> AmqpHub: ...
    @property
    def settings(self) -> AmqpSettings: ...
    @property
    def names(self) -> VhostNames: ...
    @property
    def metrics(self) -> AmqpMetrics: ...
    @property
    def codec(self) -> AmqpConnection: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def owner(self) -> str: ...
    @property
    def principal(self) -> Principal | None: ...
    @property
    def open(self) -> bool: ...
    @property
    def closing(self) -> bool: ...
    @property
    def cancel_notify(self) -> bool: ...
    @property
    def exclusive_queues(self) -> set[str]: ...
    @property
    def link(self) -> CoreLink: ...
    @property
    def topology(self) -> Topology: ...

    def client(self) -> Client: ...
    def authorize(self, permission: Permission, destination: str) -> None: ...
    def start_busy(
        self, coro: Coroutine[Any, Any, None], channel: int, method: base.Frame | None
    ) -> None: ...
    def send_method(self, channel: int, method: base.Frame) -> bool: ...
    def send_content(
        self, channel: int, method: base.Frame, properties: bytes, body: bytes
    ) -> bool: ...
    def send_delivers(self, channel: int, frames: list[bytes], count: int) -> bool: ...
    def ack_after_write(self, consumer: Any, core_tag: int) -> None: ...
    def update_reading(self) -> None: ...
    def fail(self, exc: BaseException, channel: int, method: base.Frame | None = None) -> None: ...
    def core_lost(self, reason: str) -> None: ...


class PartHost(Protocol):
    """The channel as each of its parts (consumers, declarations, publisher) sees it."""

    @property
    def session(self) -> ChannelHost: ...
    @property
    def number(self) -> int: ...
    @property
    def names(self) -> VhostNames: ...
    @property
    def settings(self) -> AmqpSettings: ...
    @property
    def reply_to(self) -> str | None: ...
