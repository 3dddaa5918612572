"""Subscription ids: signed, bound to their owner and destination; anything changed in one
is not an id of ours (404)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from polymq.types import Destination
from polymq_longpoll.config import LongpollSettings
from polymq_longpoll.subscriptions import AckMode, SubscriptionRef, ids_key
from polymq_server.config import ConfigError
from polymq_server.web.problems import Problem

KEY = ids_key("s" * 32)


def ref(owner: str = "alice") -> SubscriptionRef:
    return SubscriptionRef(
        "core-id", Destination.parse("queue/q"), AckMode.CLIENT, 10, 30.0, 300.0, owner
    )


def test_an_id_round_trips_with_its_owner() -> None:
    assert SubscriptionRef.decode(ref().encode(KEY), KEY) == ref()
    assert SubscriptionRef.decode(ref("").encode(KEY), KEY).owner == ""


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the MAC
        lambda t: t[:5] + ("A" if t[5] != "A" else "B") + t[6:],  # the reference
        lambda t: t.partition(".")[0],  # unsigned, as ids were before
        lambda t: t + "x" * 5000,
    ],
)
def test_a_changed_id_is_not_ours(change: object) -> None:
    text = ref().encode(KEY)
    with pytest.raises(Problem) as refused:
        SubscriptionRef.decode(change(text), KEY)  # type: ignore[operator]
    assert refused.value.status == 404


def test_another_key_does_not_read_it() -> None:
    text = ref().encode(KEY)
    with pytest.raises(Problem):
        SubscriptionRef.decode(text, ids_key("core-password"))
    assert ids_key(None) == ids_key("") != KEY


def test_the_key_material_is_the_secret_then_the_cluster_secret_then_the_login() -> None:
    base = LongpollSettings(core_user="fe", core_password="pw", core_token=None)
    assert base.ids_material == "fe\0pw"
    assert replace(base, core_token="t" * 32).ids_material == "t" * 32
    clustered = replace(base, cluster_secret="c" * 32)
    assert clustered.ids_material == "c" * 32
    assert replace(clustered, longpoll_secret="l" * 32).ids_material == "l" * 32
    assert LongpollSettings().ids_material is None
    with pytest.raises(ConfigError):
        replace(base, longpoll_secret="short").check()
