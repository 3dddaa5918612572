"""The broker's routes (polymq_core.handlers.routes): each request type registered once with
its handler and the key of the shard that serves it, which a cluster node's relay asks
before it forwards. The key is found as the request would be served: a request the handler
refuses is refused by the key the same way, and a lease receipt is read by one parse."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from polymq.errors import BadRequest, Forbidden, NotFound
from polymq.events import (
    Ack,
    Event,
    KvGet,
    KvList,
    KvPut,
    Peek,
    Ping,
    Publish,
    Settle,
    Stats,
    Subscribe,
)
from polymq.types import Message
from polymq_core.broker import Broker
from polymq_core.config import CoreSettings
from polymq_core.metrics import Sensors
from polymq_server.auth.principals import Grant, Principal
from polymq_server.auth.provider import AnonymousProvider, Permission


@pytest.fixture
async def broker(tmp_path: Path) -> Broker:
    """(Made in a running loop: the broker's parts take it.)"""
    settings = CoreSettings(data_dir=tmp_path, shards=8)
    settings.check()
    return Broker(settings, Sensors(CollectorRegistry()), AnonymousProvider())


def caller(principal: Principal | None = None) -> Any:
    return SimpleNamespace(principal=principal, destinations={})


def key(broker: Broker, event: Event, principal: Principal | None = None) -> str | None:
    return broker.shard_key(caller(principal), event)


async def test_a_request_is_served_by_the_shard_of_what_it_names(broker: Broker) -> None:
    assert key(broker, Publish(1, "queue/q", [Message(b"x")])) == "queue/q"
    assert key(broker, Publish(1, "channel/c", [Message(b"x")], role="client")) == (
        "channel/c>server"
    )  # (a client writes to the server's inbox)
    assert key(broker, Subscribe(1, 2, "channel/c", {"role": "client"})) == "channel/c>client"
    assert key(broker, Peek(1, "channel/c", 1)) == "channel/c>server"
    assert key(broker, KvGet(1, "k")) == "kv/k"
    assert key(broker, Settle(1, ["queue/q|3|4", "queue/q|5|6"], "ack")) == "queue/q"


async def test_what_every_node_serves_itself_has_no_shard(broker: Broker) -> None:
    for event in (
        Publish(1, "topic/t", [Message(b"x")]),
        Subscribe(1, 2, "topic/a.#", {}),
        Stats(1, "topic/a.*"),
        KvList(1, "", 10),
        Ping(1),
        Ack(1, 2, [1]),
    ):
        assert key(broker, event) is None, event
    # the handler answers a channel publish without a role's side (an empty one: count 0)
    assert key(broker, Publish(1, "channel/c", [], role="nobody")) is None


async def test_the_key_refuses_what_the_handler_refuses(broker: Broker) -> None:
    for event in (KvGet(1, ""), KvPut(1, "k" * 1025, b"v"), Settle(1, ["queue/q|x|1"], "ack")):
        with pytest.raises((BadRequest, NotFound)) as by_key:
            key(broker, event)
        with pytest.raises(type(by_key.value)) as served:
            broker.handle(caller(), event)  # type: ignore[arg-type]
        assert served.value.message == by_key.value.message


async def test_the_leases_of_a_settle_in_a_cluster_are_on_one_shard(broker: Broker) -> None:
    names = [f"queue/q{i}" for i in range(32)]
    other = next(n for n in names if broker.shard_for(n) is not broker.shard_for(names[0]))
    with pytest.raises(BadRequest, match="one queue at a time"):
        key(broker, Settle(1, [f"{names[0]}|1|1", f"{other}|1|1"], "ack"))


async def test_the_key_is_found_once_the_caller_may_do_what_it_asks(broker: Broker) -> None:
    reader = Principal("r", anonymous=False, grants=(Grant("*", frozenset({Permission.READ})),))
    assert key(broker, KvGet(1, "k"), reader) == "kv/k"
    assert key(broker, Settle(1, ["queue/q|3|4"], "ack"), reader) == "queue/q"
    for event in (KvPut(1, "k", b"v"), Publish(1, "queue/q", [Message(b"x")])):
        with pytest.raises(Forbidden):
            key(broker, event, reader)
    nobody = Principal("n", anonymous=False, grants=())
    with pytest.raises(Forbidden):
        key(broker, Settle(1, ["queue/q|3|4"], "ack"), nobody)
