"""What the request handlers share: one object the broker makes and hands to each of them
(:class:`~polymq_core.handlers.publisher.PublishHandler`,
:class:`~polymq_core.handlers.consumers.ConsumeHandler`,
:class:`~polymq_core.handlers.catalog.Catalog`,
:class:`~polymq_core.handlers.keyvalue.KeyValue`).

It holds the core's settings (a reload replaces them here: ``Broker.settings`` is this
object's), sensors and auth, the shards and the shard of a key, the index of every queue's
bindings, the topic router and the topic side of subscriptions, the cursor subscriptions,
the topic mesh of a cluster node (set once the node has joined), and the check of a
destination a request names (:meth:`HandlerContext.destination`, kept per session).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polymq.errors import BadRequest
from polymq.types import Destination
from polymq_server.auth.provider import AuthProvider, Permission

from ..destinations.shard import Shard, shard_index
from ..destinations.subscription import TopicReceiver, TopicSource
from ..topics.bindings import BindingTable
from ..topics.trie import TopicRouter, validate_pattern
from .cursors import Cursors

if TYPE_CHECKING:
    from ..config import CoreSettings
    from ..metrics import Sensors
    from ..topics.mesh import TopicMesh
    from .caller import Caller

__all__ = ["KNOWN_DESTINATIONS", "HandlerContext"]

KNOWN_DESTINATIONS = 1024  # destinations kept per session (parsed and authorized)


class HandlerContext:
    """``shards``: the broker's (it opens and closes them); ``node_id``: this node's id in a
    cluster, None on a single node (where a cursor subscription lives: :class:`Cursors`)."""

    def __init__(
        self,
        settings: CoreSettings,
        sensors: Sensors,
        auth: AuthProvider,
        shards: list[Shard],
        node_id: str | None,
    ) -> None:
        self.settings = settings
        self.sensors = sensors
        self.auth = auth
        self.shards = shards
        self.bindings = BindingTable()  # every queue's bindings; the shards store durable ones
        self.topics: TopicRouter[TopicReceiver] = TopicRouter()
        self.topic_source = TopicSource(self.topics)
        self.cursors = Cursors(self.topics, self.shard_for, node_id)
        self.mesh: TopicMesh | None = None  # in a cluster: topic messages to and from other nodes

    def shard_for(self, key: str) -> Shard:
        return self.shards[shard_index(key, len(self.shards))]

    def destination(
        self, session: Caller, text: Any, perm: Permission, *, pattern: bool = False
    ) -> Destination:
        """The destination ``text`` names (a topic pattern if ``pattern``), once ``session``
        may use it with ``perm``. Kept per session (its principal does not change): a
        frontend names the same few destinations request after request."""
        key = (text, perm, pattern) if type(text) is str else None
        if key is not None:
            known = session.destinations.get(key)
            if known is not None:
                return known
        dest = Destination.parse(text, pattern=pattern)
        if dest.is_pattern:
            try:
                validate_pattern(dest.name)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        if session.principal is not None:
            self.auth.authorize(session.principal, perm, str(dest))
        if key is not None:
            if len(session.destinations) >= KNOWN_DESTINATIONS:
                session.destinations.clear()
            session.destinations[key] = dest
        return dest

    def holder_key(self, dest: Destination, role: Any) -> str:
        """The shard key of ``dest`` (a channel's: the inbox of ``role``)."""
        if role is not None and not isinstance(role, str):
            raise BadRequest("role must be a string")
        return Shard.key_of(dest, role)
