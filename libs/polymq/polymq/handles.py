"""busmq-like handles over a :class:`~polymq.client.Client`: a queue (push, consume,
pull, purge, bindings), a topic (publish, subscribe), a stream (append, read from an
offset) and a channel's role (send, receive)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .answers import Bound, Declared, DestinationStats, Published, Unbound
from .deliveries import DeliveryListener, Lease, Subscription
from .types import Message

__all__ = ["ChannelHandle", "HandleHost", "QueueHandle", "StreamHandle", "TopicHandle"]


class HandleHost(Protocol):
    """The calls of the :class:`~polymq.client.Client` that a handle makes for its one
    destination. A protocol, so that this module need not import the client's, which
    imports it."""

    async def declare(self, destination: str, **options: Any) -> Declared: ...
    async def delete(self, destination: str) -> None: ...
    async def stats(self, destination: str) -> DestinationStats: ...
    async def get_metadata(self, destination: str) -> dict[str, str]: ...
    async def set_metadata(self, destination: str, metadata: dict[str, str]) -> None: ...
    async def publish(
        self,
        destination: str,
        messages: bytes | str | Message | Iterable[Message],
        *,
        role: str | None = None,
        batch_id: str | None = None,
        batch_ttl: float | None = None,
        **fields: Any,
    ) -> Published: ...
    async def subscribe(
        self, destination: str, *, listener: DeliveryListener | None = None, **options: Any
    ) -> Subscription: ...
    async def pull(
        self, destination: str, max: int = 1, *, wait: float = 0.0, visibility: float = 30.0
    ) -> list[Lease]: ...
    async def purge(self, destination: str) -> int: ...
    async def bind(self, pattern: str, queue: str) -> Bound: ...
    async def unbind(self, pattern: str, queue: str) -> Unbound: ...
    async def bindings(self, queue: str) -> list[str]: ...


class _Handle:
    def __init__(self, client: HandleHost, destination: str) -> None:
        self.client = client
        self.destination = destination

    async def declare(self, **options: Any) -> Declared:
        return await self.client.declare(self.destination, **options)

    async def delete(self) -> None:
        await self.client.delete(self.destination)

    async def stats(self) -> DestinationStats:
        return await self.client.stats(self.destination)

    async def metadata(self, **values: str) -> dict[str, str]:
        """Set metadata when given keywords; return the current metadata."""
        if values:
            await self.client.set_metadata(self.destination, values)
            return dict(values)
        return await self.client.get_metadata(self.destination)


class QueueHandle(_Handle):
    async def push(self, body: bytes | str | Message, **fields: Any) -> Published:
        return await self.client.publish(self.destination, body, **fields)

    async def push_many(self, messages: Iterable[Message]) -> Published:
        return await self.client.publish(self.destination, list(messages))

    async def consume(self, **options: Any) -> Subscription:
        return await self.client.subscribe(self.destination, **options)

    async def pull(self, max: int = 1, **kw: Any) -> list[Lease]:
        return await self.client.pull(self.destination, max, **kw)

    async def purge(self) -> int:
        return await self.client.purge(self.destination)

    async def bind(self, pattern: str) -> Bound:
        return await self.client.bind(pattern, self.destination)

    async def unbind(self, pattern: str) -> Unbound:
        return await self.client.unbind(pattern, self.destination)

    async def bindings(self) -> list[str]:
        return await self.client.bindings(self.destination)


class TopicHandle(_Handle):
    async def publish(self, body: bytes | str | Message, **fields: Any) -> Published:
        return await self.client.publish(self.destination, body, **fields)

    async def subscribe(self, **options: Any) -> Subscription:
        return await self.client.subscribe(self.destination, **options)


class StreamHandle(_Handle):
    async def append(self, body: bytes | str | Message, **fields: Any) -> Published:
        return await self.client.publish(self.destination, body, **fields)

    async def read(self, offset: str | int | float = "next", **options: Any) -> Subscription:
        if isinstance(offset, float):
            options["offset"] = {"timestamp": offset}
        else:
            options["offset"] = offset
        return await self.client.subscribe(self.destination, **options)


class ChannelHandle(_Handle):
    def __init__(self, client: HandleHost, destination: str, role: str) -> None:
        super().__init__(client, destination)
        self.role = role

    async def send(self, body: bytes | str | Message, **fields: Any) -> Published:
        return await self.client.publish(self.destination, body, role=self.role, **fields)

    async def receive(self, **options: Any) -> Subscription:
        return await self.client.subscribe(self.destination, role=self.role, **options)
