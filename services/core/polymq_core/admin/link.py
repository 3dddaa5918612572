"""The admin API's own link to its core: a wire-protocol client over an in-process pipe.

What the operator does through the admin API (peek, publish, purge, delete) goes through
the same primitive operations as any frontend's, so in a cluster a request for a shard led
elsewhere is forwarded like any other. The link logs in with a one-off token
(:class:`~polymq_server.auth.provider.WithServiceToken`: every permission; the admin API checked the
operator's tags first) as client ``polymq-admin``, which the broker leaves out of its list
of wire clients.

On the same link the core answers the connection list and close requests for its own wire
clients (:class:`polymq_server.link.connections.Responder` over ``Broker.clients``), and asks them
(:meth:`AdminLink.ask`): a request on ``topic/system.connections.list`` (or ``.close``)
whose ``reply_to`` is this link's own reply topic; answers come back there by correlation
id. On a single node the topic publish says how many subscribers it reached, so the ask
ends as soon as each has answered; in a cluster (whose other nodes' subscribers it does not
count) it waits the whole window.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from polymq import inproc
from polymq.client import Client, Subscription
from polymq.errors import ConnectionClosed, Unavailable
from polymq.types import Message
from polymq_server.auth.provider import WithServiceToken, generate_token
from polymq_server.link.connections import REPLY_TOPICS, Responder
from polymq_server.names import core_headers

from ..identities import ADMIN_CLIENT
from ..session import Session

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["ASK_WITHIN", "AdminLink"]

log = logging.getLogger(__name__)

ASK_WITHIN = 2.0  # seconds the frontends have to answer a list or close request
_HOST = "polymq-admin"  # the in-process address of the link (never a socket)
_ports = itertools.count(1)

Answers = list[dict[str, Any]]


class AdminLink:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._token = generate_token()
        self._port = next(_ports)
        self._client: Client | None = None
        self._connecting: asyncio.Lock | None = None
        self.reply_topic = f"{REPLY_TOPICS.removeprefix('topic/')}{secrets.token_hex(6)}"
        self._asks: dict[str, tuple[Answers, asyncio.Event]] = {}

    async def client(self) -> Client:
        """The link's client, connected (again) if need be; Unavailable if it cannot be."""
        client = self._client
        if client is not None and not client.closed:
            return client
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is not None and not self._client.closed:
                return self._client
            self._client = await self._connect()
            return self._client

    async def _connect(self) -> Client:
        broker = self.broker
        if not broker.ready:
            raise Unavailable("the core is not ready")
        auth = WithServiceToken(broker.auth, self._token)
        inproc.serve(_HOST, self._port, lambda: Session(broker, auth))
        try:
            client = await Client.connect(_HOST, self._port, client=ADMIN_CLIENT, token=self._token)
        except ConnectionClosed as exc:
            raise Unavailable(f"the admin API cannot reach its core: {exc}") from None
        finally:
            inproc.unserve(_HOST, self._port)
        await Responder(client, broker.clients).start()
        await client.subscribe(f"topic/{self.reply_topic}", listener=_Replies(self))
        return client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def answered(self, message: Message) -> None:
        ask = self._asks.get(message.correlation_id or "")
        if ask is None:
            return
        try:
            answer = json.loads(message.body)
        except ValueError:
            return
        if isinstance(answer, dict):
            ask[0].append(answer)
            ask[1].set()

    async def ask(
        self,
        topic: str,
        request: dict[str, Any],
        enough: Callable[[Answers], bool] = lambda answers: False,
        within: float = ASK_WITHIN,
    ) -> Answers:
        """Publish ``request`` on ``topic`` and gather the answers that come within
        ``within`` seconds, or until every subscriber reached answered (on a single node),
        or until ``enough(answers)``."""
        client = await self.client()
        cid = secrets.token_hex(8)
        answers: Answers = []
        event = asyncio.Event()
        self._asks[cid] = (answers, event)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        try:
            message = Message(
                json.dumps(request).encode(),
                "application/json",
                correlation_id=cid,
                reply_to=f"topic/{self.reply_topic}",
                headers=core_headers(),  # (this link alone may: Session.speaks_for_core)
            )
            sent = await client.publish(f"topic/{topic}", message)
            reached = sent.subscribers if self.broker.cluster is None else None
            while not enough(answers) and not (
                isinstance(reached, int) and len(answers) >= reached
            ):
                left = deadline - loop.time()
                if left <= 0:
                    break
                event.clear()
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    break
            return list(answers)
        finally:
            del self._asks[cid]


class _Replies:
    """Hands the answers heard on the link's reply topic to it."""

    def __init__(self, link: AdminLink) -> None:
        self.link = link

    def on_deliver(self, sub: Subscription, tags: list[int], messages: list[Message]) -> None:
        for message in messages:
            self.link.answered(message)

    def on_end(self, sub: Subscription, error: BaseException) -> None:
        log.debug("admin link: the reply subscription ended: %s", error)
