"""A reload's limits in the core (polymq_core.reload.limits_setter): they reach the request
handlers at once (they read the settings of the object they share with the broker), and a
value the settings refuse changes nothing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from polymq.errors import BadRequest
from polymq.events import Subscribe
from polymq_core.broker import Broker
from polymq_core.config import CoreSettings
from polymq_core.handlers.sids import SidTable
from polymq_core.metrics import Sensors
from polymq_core.reload import ReloadError, limits_setter
from polymq_server.auth.provider import AnonymousProvider


@pytest.fixture
async def broker(tmp_path: Path) -> Broker:
    """(Made in a running loop: the broker's parts take it.)"""
    settings = CoreSettings(data_dir=tmp_path, shards=2)
    settings.check()
    return Broker(settings, Sensors(CollectorRegistry()), AnonymousProvider())


def session() -> Any:
    subs: SidTable[Any] = SidTable()
    return SimpleNamespace(
        principal=None,
        destinations={},
        protocol="test",
        subs=subs,
        add_sub=lambda sub: subs.__setitem__(sub.sid, sub),
    )


async def test_a_reloaded_limit_holds_for_the_next_request(broker: Broker) -> None:
    limits_setter(broker)({"max_subscriptions_per_connection": 1})
    assert broker.settings.max_subscriptions_per_connection == 1
    s = session()
    broker.handle(s, Subscribe(1, 1, "topic/a.*", {}))
    with pytest.raises(BadRequest, match="at most 1 subscriptions per connection"):
        broker.handle(s, Subscribe(2, 2, "topic/b.*", {}))


async def test_a_refused_limit_changes_nothing(broker: Broker) -> None:
    before = broker.settings
    with pytest.raises(ReloadError, match="MAX_BODY cannot exceed"):
        limits_setter(broker)({"max_body": before.max_frame + 1, "max_pull": 7})
    assert broker.settings is before
